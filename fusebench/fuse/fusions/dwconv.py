"""dwconv (train, CPU): depthwise 3x3/5x5/7x7 conv (stride 1 or 2, zero padding K//2) -> a conv
whose passes come from kernels.dwconv's C++ kernel where it was measured faster than aten's
(oneDNN) and from aten elsewhere, chosen per call from the layout and shape (`passes_for`).

Measured by benchmarks/dwconv.py (every depthwise conv of efficientnet_b0/b3, batch 8, 192 px)
twice, interleaved in one process on the 2-vCPU AMD EPYC (AVX2) VM under load 5-7, 2026-12-01;
ratios aten time / ours:
  - grad weight, channels-last: ours 1.1-3x faster at every shape (K 3/5, stride 1/2);
  - grad weight, NCHW (ours converts to channels-last inside): 5x5 10-90x faster (aten's NCHW
    5x5 weight grad is pathological here), 3x3 1.1-1.4x at <= 24x24, 0.4-0.9x above;
  - forward and grad input: oneDNN's are as fast or faster (0.5-1.1x) at stride 1 and at
    stride 2 from 48x48 up; at stride 2 on <= 24x24 inputs ours is 1.2-2.8x (one 0.6 outlier)
    in both layouts: both backward passes are ours there (the forward stays aten's, so a
    fused forward is bit-identical to eager's; ours is kept for the kernel family).
ConvNeXt's 7x7 keeps aten's forward and our whole backward, as measured before (docs/fused.md).
Rerun the benchmark on a quiet machine before changing passes_for."""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.recompute import recipe_of
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.dwconv import cpu
from fusebench.kernels.dwconv.cpu import Passes

GRAD_WEIGHT = Passes(forward=False, input_grad=False, weight_grad=True)
ATEN = Passes(False, False, False)
SMALL_HW = 24 * 24     # input pixels up to which ours pays beyond channels-last grad weight


@functools.cache
def passes_for(channels_last: bool, k: int, stride: int, h: int, w: int) -> Passes:
    """The measured rule (module docstring); says once per shape when aten keeps all of it."""
    small = h * w <= SMALL_HW
    if k == 7:                   # ConvNeXt's: ours 3-5x faster backward (docs/fused.md)
        return cpu.BACKWARD
    if stride == 2 and small:    # our forward measured faster too, but aten's keeps the
        return cpu.BACKWARD      # forward bit-identical to eager (tests compare at 1e-10)
    if channels_last or k != 3 or small:
        return GRAD_WEIGHT
    warnings.warn(f"dwconv: aten's depthwise conv kept for NCHW {k}x{k} stride {stride} at "
                  f"{h}x{w} (> {SMALL_HW} pixels): measured faster than ours there "
                  f"(benchmarks/dwconv.py)", stacklevel=2)
    return ATEN


class FusedDepthwiseConv(FusedModule):
    """Depthwise conv with each pass from fusebench's C++ kernel or aten's (`passes_for`).
    Same Parameters under the same names (weight, bias) as the nn.Conv2d it replaces."""
    fusion = "dwconv"

    def __init__(self, src: nn.Conv2d):
        super().__init__()
        self.in_channels, self.kernel_size = src.in_channels, src.kernel_size
        self.stride = src.stride[0]
        self.weight, self.bias = src.weight, src.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.kernel_size[0]
        if not cpu.runs_on(x):
            # e.g. bf16 under autocast: aten runs, and says so (captured as a warning event)
            warnings.warn(f"dwconv: the C++ kernel takes float32/float64 CPU input, got "
                          f"{x.dtype} on {x.device}; ran aten's depthwise conv instead",
                          stacklevel=2)
            passes = ATEN
        else:
            passes = passes_for(cpu.is_channels_last(x), k, self.stride, *x.shape[2:])
        recipe = recipe_of(x) if x.device.type == "cpu" else None
        if not passes.any() and recipe is None:
            return F.conv2d(x, self.weight, self.bias, self.stride, k // 2, 1, self.in_channels)
        # an input a fused BN + act tagged (fuse/recompute.py): saved as that BN's input and
        # statistics, rebuilt in backward, instead of kept
        return cpu.DwConvCpuFunction.apply(x, self.weight, self.bias, self.stride, passes,
                                           recipe)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, kernel_size={self.kernel_size}, stride={self.stride}"


@register_fusion("dwconv", nn.Conv2d, benches=("train",))
def dwconv(m: nn.Conv2d, ctx: FuseContext):
    """Depthwise 3x3/5x5/7x7 conv (stride 1/2, padding K//2) -> the C++ kernel's passes (CPU)
    where they were measured faster, aten's elsewhere."""
    if not ctx.device.startswith("cpu") or not _is_depthwise(m):
        return None
    reason = cpu.supports(m)
    if reason:
        ctx.notes.append(("not_fused", f"dwconv: depthwise conv left to aten: {reason}"))
        return None
    if ctx.dwconv is None:                 # build (or fail) once per fuse(), not per site
        ok, why = cpu.build()
        ctx.dwconv = ok
        if not ok:
            ctx.notes.append(("kernel_fallback", f"dwconv cpu unavailable ({why}); "
                                                 f"depthwise convs left to aten"))
    return FusedDepthwiseConv(m) if ctx.dwconv else None


def _is_depthwise(m: nn.Conv2d) -> bool:
    return m.groups == m.in_channels == m.out_channels > 1
