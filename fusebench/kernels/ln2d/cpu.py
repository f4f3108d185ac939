"""`cpu`: the C++/OpenMP LN2d kernel (cpu.cpp), built on first use and cached on disk."""
# No `from __future__ import annotations` here: torch.jit.script reads ln2d_cpu's and _check's
# annotations, and does not resolve them as strings.

from pathlib import Path

import torch

from fusebench.kernels.build import CppKernel
from fusebench.kernels.registry import register_impl

EXT_NAME = "fusebench_ln2d_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


KERNEL = CppKernel(EXT_NAME, SOURCE, "the ln2d cpu kernel runs")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


@torch.jit.ignore  # TorchScript calls back into Python for it (see ln2d_cpu)
def _check(x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"ln2d cpu: unsupported dtype {x.dtype} (supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
    if x.device.type != "cpu":
        raise ValueError(f"ln2d cpu: x must be a CPU tensor, got {x.device}")


# The kernel as two torch custom ops (torch.library) with the backward registered as autograd:
# unlike an autograd.Function around a pybind call, a custom op is something aot_autograd and
# torch.compile can trace (fake implementations give them the output shapes and layouts), so
# `fusebench kernel ln2d --impl cpu --mode aot,compile` measures the kernel inside the compiled
# graph instead of failing (aot) or graph-breaking around it (compile). Cost: a little more
# dispatch per call than an autograd.Function in eager (docs/figures.md).
def _dense_format(x: torch.Tensor) -> torch.memory_format:
    """The layout cpu.cpp writes for x's outputs (pick_layout: NCHW first, then NHWC)."""
    if not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _stats_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


@torch.library.custom_op("fusebench::ln2d_cpu_forward", mutates_args=())
def _forward_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
                channels_last_out: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, mean, rstd = extension().forward(x, weight, bias, eps, channels_last_out)
    return y, mean, rstd


@_forward_op.register_fake
def _(x, weight, bias, eps, channels_last_out):
    fmt = _dense_format(x)
    if channels_last_out and fmt == torch.contiguous_format:
        fmt = torch.channels_last
    n, _, h, w = x.shape
    stats = x.new_empty((n, h * w), dtype=_stats_dtype(x))
    return torch.empty_like(x, memory_format=fmt), stats, torch.empty_like(stats)


@torch.library.custom_op("fusebench::ln2d_cpu_backward", mutates_args=())
def _backward_op(dy: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                 weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = extension().backward(dy, x, mean, rstd, weight)
    return dx, dw, db


@_backward_op.register_fake
def _(dy, x, mean, rstd, weight):
    grad = weight.new_empty((x.shape[1],))
    return torch.empty_like(x, memory_format=_dense_format(x)), grad, torch.empty_like(grad)


def _setup_context(ctx, inputs, output):
    """Saves x (the input) and the per-position mean/rstd (N*H*W floats each); nothing else."""
    x, weight = inputs[0], inputs[1]
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)


def _backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = _backward_op(dy, x, mean, rstd, weight)
    return dx, dw, db, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


@register_impl("ln2d", "cpu", available=available)
def ln2d_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
             channels_last_out: bool = False) -> torch.Tensor:
    """C++/OpenMP: x read from memory once per direction (Welford + write pass over an L2 tile).

    channels_last_out: an NCHW x gives a channels-last y (what permute + layer_norm returns),
    so 1x1 convs after it run oneDNN's NHWC path; backward reads a channels-last dy per tile.
    Written so torch.jit.script can compile it too (no keyword-only arguments; the op through
    torch.ops), so the torchscript mode runs the kernel rather than failing on the wrapper."""
    _check(x)
    return torch.ops.fusebench.ln2d_cpu_forward(x, weight, bias, float(eps), channels_last_out)[0]


class LN2dCpuFunction(torch.autograd.Function):
    """The same kernel pair as ln2d_cpu without the custom op's dispatch: for eager callers
    (the fuser binds it), where the op's per-call Python dispatch measured 0.05-0.3 ms per
    fwd+bwd (benchmarks/ln2d_channels_last.py, `cpu` vs `cpu_fn`), as much as the kernel at
    ConvNeXt's late-stage shapes. Saves what the op saves: x, weight, mean, rstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, channels_last_out):
        _check(x)
        y, mean, rstd = extension().forward(x, weight, bias, float(eps), channels_last_out)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = extension().backward(dy, x, mean, rstd, weight)
        return dx, dw, db, None, None


def ln2d_cpu_function(x, weight, bias, eps, channels_last_out=False):
    """ln2d_cpu as an autograd.Function (eager only: aot/compile/script need the custom op)."""
    return LN2dCpuFunction.apply(x, weight, bias, eps, channels_last_out)
