"""`cpu`: the C++/OpenMP LN2d kernel (cpu.cpp), built on first use and cached on disk."""
from __future__ import annotations

from pathlib import Path

import torch

from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_ln2d_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


KERNEL = CppKernel(EXT_NAME, SOURCE, "the ln2d cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def _check(x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"ln2d cpu: unsupported dtype {x.dtype} (supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
    if x.device.type != "cpu":
        raise ValueError(f"ln2d cpu: x must be a CPU tensor, got {x.device}")


class LN2dCpuFunction(torch.autograd.Function):
    """Saves x (the input) and the per-position mean/rstd (N*H*W floats each); nothing else."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, channels_last_out=False):
        y, mean, rstd = extension().forward(x, weight, bias, float(eps), channels_last_out)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = extension().backward(dy, x, mean, rstd, weight)
        return dx, dw, db, None, None


@register_impl("ln2d", "cpu", available=available)
def ln2d_cpu(x, weight, bias, eps: float, *, channels_last_out: bool = False):
    """C++/OpenMP kernel: one Welford pass over NCHW, fused backward, NCHW + channels-last.

    channels_last_out: an NCHW x gives a channels-last y (what permute + layer_norm returns),
    so 1x1 convs after it run oneDNN's NHWC path; backward reads a channels-last dy per tile."""
    _check(x)
    return LN2dCpuFunction.apply(x, weight, bias, eps, channels_last_out)
