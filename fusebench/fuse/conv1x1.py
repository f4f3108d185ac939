"""1x1 convs (stride 1, no padding, groups 1) as GEMMs on channels-last activations, whose
(N, H, W, C) views are free. At 1 thread and batch < 16 aten runs these convs as THNN's
`_slow_conv2d` (im2col + GEMM), at 2 threads through oneDNN; the GEMM on the view beat both
at every EfficientNet-B0 shape but a few (forward + backward, b8, 160 px: 1.075x summed at 1
thread, 1.157x at 2; ConvNeXt's MLP 1.01-1.06x per fused step; docs/fused.md, twelfth and
thirteenth sessions). NCHW keeps F.conv2d: the per-image GEMMs there lost (0.64x / 0.91x)."""
from __future__ import annotations

import contextlib
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import gemm
from fusebench.fuse.fx.nodes import hooked, not_pointwise
from fusebench.fuse.rule import computes_as


_state = {"aten": False}


@contextlib.contextmanager
def aten_convs():
    """Inside, conv1x1 / run_conv call aten's conv in every layout: the A side of
    benchmarks/fusion_ab.py --aten-1x1."""
    old, _state["aten"] = _state["aten"], True
    try:
        yield
    finally:
        _state["aten"] = old


def channels_last(x) -> bool:
    """x is a channels-last 4-D tensor (not also NCHW-contiguous): its (N, H, W, C) view is free."""
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) \
        and not x.is_contiguous()


def is_pointwise(m: nn.Module) -> bool:
    """m is a plain nn.Conv2d that computes a 1x1 GEMM over channels (no hook to bypass)."""
    return computes_as(m, nn.Conv2d) and not_pointwise(m) is None and not hooked(m)


def conv1x1(x, w, b=None):
    """A 1x1 conv as a GEMM on a channels-last x's free view, y channels-last; F.conv2d
    otherwise. The GEMMs (forward and backward, on the same views) run on fuse/gemm.py's
    backend. Under autocast aten's conv runs, as in eager, and says so: the GEMM's gain was
    measured in fp32, and autocast's bf16 linear sums the weight gradient in another order than
    its bf16 conv on an AVX2 CPU."""
    if channels_last(x) and not _state["aten"]:
        if not torch.is_autocast_enabled(x.device.type):
            return gemm.linear(x.permute(0, 2, 3, 1), w.flatten(1), b).permute(0, 3, 1, 2)
        warnings.warn("conv1x1: under autocast the pointwise conv ran aten's conv, as eager's "
                      "(its GEMM on the channels-last view runs in fp32 only)", stacklevel=2)
    return F.conv2d(x, w, b)


def conv1x1_add(res, x, w, b=None):
    """res + conv1x1(x, w, b) with res as the GEMM's accumulator (fuse/gemm.py's nt_add), on
    channels-last x and res (their (N, H, W, C) views are the GEMM's rows)."""
    return gemm.nt_add(res.permute(0, 2, 3, 1), x.permute(0, 2, 3, 1), w.flatten(1),
                       b).permute(0, 3, 1, 2)


def run_conv(conv: nn.Module, x):
    """conv(x), through conv1x1 where conv is a pointwise nn.Conv2d (same Parameters)."""
    return conv1x1(x, conv.weight, conv.bias) if is_pointwise(conv) else conv(x)
