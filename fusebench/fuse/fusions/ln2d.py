"""ln2d: LayerNorm2d -> the device's LN2d kernel (ln2d impl `auto`, bound once per fuse();
`function` with a kernel_fallback note when it cannot build)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from fusebench.fuse.binding import resolve_ln2d
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import LayerNorm2d


class FusedLayerNorm2d(FusedModule):
    """LN2d through a kernel impl; weight and bias are the original module's Parameters."""
    fusion = "ln2d"

    def __init__(self, src: LayerNorm2d, impl: str, fn: Callable):
        super().__init__()
        self.num_channels, self.eps, self.impl, self._fn = src.num_channels, src.eps, impl, fn
        self.weight, self.bias = src.weight, src.bias          # same Parameters, same names

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        return self._fn(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, impl={self.impl}"


@register_fusion("ln2d", LayerNorm2d)
def ln2d(m: LayerNorm2d, ctx: FuseContext):
    """LayerNorm2d -> the device's LN2d kernel (function impl when it cannot build)."""
    if ctx.ln2d is None:
        ctx.ln2d = resolve_ln2d(ctx.device, ctx.notes)
    impl, fn = ctx.ln2d
    return FusedLayerNorm2d(m, impl, fn)
