"""`cpu`: the backward of a depthwise KxK conv in C++/OpenMP (cpu.cpp), channels-last float32 /
float64, built on first use and cached on disk. The forward is aten's own conv (oneDNN's
depthwise forward is already fast; its backward is what costs, docs/fused.md)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_dwconv_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64)
SIZES = (5, 7)   # compiled for 3 too, but at 3x3 aten's backward measured faster (docs/fused.md)

KERNEL = CppKernel(EXT_NAME, SOURCE, "the depthwise conv cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def supports(conv: nn.Conv2d) -> str:
    """'' if the kernel computes this conv's backward exactly (and pays), else why not."""
    k = conv.kernel_size
    if not (conv.groups == conv.in_channels == conv.out_channels):
        return "not depthwise (groups != in == out channels)"
    if k[0] != k[1] or k[0] not in SIZES:
        return f"kernel {k} not square with K in {SIZES}"
    if conv.stride != (1, 1) or conv.dilation != (1, 1):
        return "stride or dilation != 1"
    if conv.padding != (k[0] // 2, k[1] // 2) or conv.padding_mode != "zeros":
        return "padding is not zero 'same' padding"
    return ""


def runs_on(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in DTYPES and x.dim() == 4


class DwConvCpuFunction(torch.autograd.Function):
    """y = aten depthwise conv(x); backward = the C++ kernel. Saves x and weight, as aten does."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        x = x.contiguous(memory_format=torch.channels_last)
        k = weight.shape[-1]
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=k // 2, groups=weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw, db = extension().backward(dy, x, weight, ctx.has_bias)
        return dx, dw, db


@register_impl("dwconv", "cpu", available=available)
def dwconv_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """aten's depthwise forward + a C++/OpenMP backward on channels-last; saves x and weight."""
    if not runs_on(x):
        raise TypeError(f"dwconv cpu: needs a 4-D CPU float32/float64 x, got {x.dtype} on "
                        f"{x.device}")
    return DwConvCpuFunction.apply(x, weight, bias)
