"""dwconv (train, CPU): depthwise 5x5/7x7 conv (stride 1, same padding) -> aten's forward with
the C++ backward of kernels.dwconv, built once per fuse()."""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.dwconv import cpu


class FusedDepthwiseConv(FusedModule):
    """Depthwise conv: aten's forward, fusebench's C++ backward (kernels.dwconv). Same
    Parameters under the same names (weight, bias) as the nn.Conv2d it replaces."""
    fusion = "dwconv"

    def __init__(self, src: nn.Conv2d):
        super().__init__()
        self.in_channels, self.kernel_size = src.in_channels, src.kernel_size
        self.weight, self.bias = src.weight, src.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if cpu.runs_on(x):
            return cpu.dwconv_cpu(x, self.weight, self.bias)
        # e.g. bf16 under autocast: aten runs, and says so (captured as a warning event)
        warnings.warn(f"dwconv: the C++ kernel takes float32/float64 CPU input, got {x.dtype} "
                      f"on {x.device}; ran aten's depthwise conv instead", stacklevel=2)
        k = self.kernel_size[0]
        return F.conv2d(x, self.weight, self.bias, padding=k // 2, groups=self.in_channels)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, kernel_size={self.kernel_size}, backward=cpu"


@register_fusion("dwconv", nn.Conv2d, benches=("train",))
def dwconv(m: nn.Conv2d, ctx: FuseContext):
    """Depthwise 5x5/7x7 conv (stride 1, same padding) -> aten forward + C++ backward (CPU)."""
    if not ctx.device.startswith("cpu") or cpu.supports(m):
        return None
    if ctx.dwconv is None:                 # build (or fail) once per fuse(), not per site
        ok, reason = cpu.build()
        ctx.dwconv = ok
        if not ok:
            ctx.notes.append(("kernel_fallback", f"dwconv cpu unavailable ({reason}); "
                                                 f"depthwise convs left to aten"))
    return FusedDepthwiseConv(m) if ctx.dwconv else None
