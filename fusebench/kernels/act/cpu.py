"""`cpu`: C++/OpenMP activation kernels (cpu.cpp), one extension for the three families, built on
first use and cached on disk. Each autograd.Function saves exactly what its plain-torch twin
saves (x, and the small bias / gate logits) and runs one pass per direction."""
from __future__ import annotations

from pathlib import Path

import torch

from fusebench.kernels.act.bias_gelu import _check as _check_bias_gelu
from fusebench.kernels.act.se_gate import _check_gate
from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_act_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


KERNEL = CppKernel(EXT_NAME, SOURCE, "the activation cpu kernels run")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def _dense(x: torch.Tensor) -> torch.Tensor:
    """x if NCHW- or channels-last-contiguous, else an NCHW copy (the kernels index densely)."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous()


def _check(op: str, x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"{op} cpu: unsupported dtype {x.dtype} (supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
    if x.device.type != "cpu":
        raise ValueError(f"{op} cpu: x must be a CPU tensor, got {x.device}")
    if x.dim() != 4:
        raise ValueError(f"{op} cpu: x must be 4-D (N, C, H, W), got {x.dim()}-D")


class SiLUCpuFunction(torch.autograd.Function):
    """Saves x only."""

    @staticmethod
    def forward(ctx, x):
        x = _dense(x)
        ctx.save_for_backward(x)
        return extension().silu_forward(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return extension().silu_backward(dy, x)


class SEGateCpuFunction(torch.autograd.Function):
    """Saves x and the (N, C, 1, 1) logits."""

    @staticmethod
    def forward(ctx, x, g):
        x = _dense(x)
        ctx.save_for_backward(x, g)
        return extension().se_gate_forward(x, g)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, g = ctx.saved_tensors
        dx, dg = extension().se_gate_backward(dy, x, g)
        return dx, dg


class BiasGELUCpuFunction(torch.autograd.Function):
    """Saves x and bias."""

    @staticmethod
    def forward(ctx, x, bias, approximate):
        x = _dense(x)
        ctx.save_for_backward(x, bias)
        ctx.tanh = approximate == "tanh"
        return extension().bias_gelu_forward(x, bias, ctx.tanh)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, db = extension().bias_gelu_backward(dy, x, bias, ctx.tanh)
        return dx, db, None


@register_impl("silu", "cpu", available=available)
def silu_cpu(x):
    """C++/OpenMP: one vectorised pass per direction (libmvec expf); saves only x."""
    _check("silu", x)
    return SiLUCpuFunction.apply(x)


@register_impl("se_gate", "cpu", available=available)
def se_gate_cpu(x, gate_logits):
    """C++/OpenMP: backward computes dx and sum_hw(dy * x) in one pass; saves x and g."""
    _check("se_gate", x)
    _check_gate(x, gate_logits)
    return SEGateCpuFunction.apply(x, gate_logits)


@register_impl("bias_gelu", "cpu", available=available)
def bias_gelu_cpu(x, bias, approximate: str = "none"):
    """C++/OpenMP: add + GELU in one pass; backward dx and dbias in one pass; saves x, bias."""
    _check("bias_gelu", x)
    _check_bias_gelu(x, bias, approximate)
    return BiasGELUCpuFunction.apply(x, bias, approximate)
