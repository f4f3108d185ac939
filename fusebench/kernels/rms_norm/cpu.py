"""`cpu`: the C++/OpenMP RMSNorm kernel (cpu.cpp), built on first use and cached on disk."""
# No `from __future__ import annotations`: torch.jit.script reads rms_norm_cpu's annotations.

from pathlib import Path

import torch

from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl
from fusebench.kernels.rms_norm.function import rms_norm_function_class

EXT_NAME = "fusebench_rms_norm_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


KERNEL = CppKernel(EXT_NAME, SOURCE, "the rms_norm cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


@torch.jit.ignore
def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"rms_norm cpu: unsupported dtype {x.dtype} (supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
    if x.device.type != "cpu":
        raise ValueError(f"rms_norm cpu: x must be a CPU tensor, got {x.device}")
    if x.dim() == 0 or weight.numel() != x.shape[-1]:
        raise ValueError(f"rms_norm cpu: weight has {weight.numel()} elements, x's last dim is "
                         f"{x.shape[-1] if x.dim() else 'missing'}")


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


# A custom op with its backward registered as autograd (as ln2d/cpu.py, for the same reason:
# aot_autograd and torch.compile trace a custom op, not a pybind call inside a Function).
@torch.library.custom_op("fusebench::rms_norm_cpu_forward", mutates_args=())
def _forward_op(x: torch.Tensor, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    y, rstd = extension().forward(x, weight, eps)
    return y, rstd


@_forward_op.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), \
        x.new_empty(x.shape[:-1], dtype=_stats_dtype(x))


@torch.library.custom_op("fusebench::rms_norm_cpu_backward", mutates_args=())
def _backward_op(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor,
                 weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dw = extension().backward(dy, x, rstd, weight)
    return dx, dw


@_backward_op.register_fake
def _(dy, x, rstd, weight):
    return torch.empty_like(x, memory_format=torch.contiguous_format), weight.new_empty(
        weight.shape)


def _setup_context(ctx, inputs, output):
    """Saves x, the weight and the per-row rstd; nothing x-sized besides x."""
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _backward_op(dy, x, rstd, weight)
    return dx, dw, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


@register_impl("rms_norm", "cpu", available=available)
def rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """C++/OpenMP: one read of x per direction (each row's C values stay in L1 between the
    sum and the write pass); saves x and the per-row rstd."""
    _check(x, weight)
    return torch.ops.fusebench.rms_norm_cpu_forward(x, weight, float(eps))[0]


def _checked_forward(x, weight, eps):
    _check(x, weight)
    return tuple(extension().forward(x, weight, eps))


# The same kernel pair without the custom op's per-call dispatch, for the fuser (eager callers;
# ln2d's LN2dCpuFunction says why). Saves what the op saves.
RMSNormCpuFunction = rms_norm_function_class(
    _checked_forward, lambda dy, x, weight, rstd: tuple(extension().backward(dy, x, rstd, weight)),
    "RMSNormCpuFunction", once=True)


def rms_norm_cpu_function(x, weight, eps):
    """rms_norm_cpu as an autograd.Function (eager only: aot/compile/script need the op)."""
    return RMSNormCpuFunction.apply(x, weight, eps)
