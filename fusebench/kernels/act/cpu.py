"""`cpu`: C++/OpenMP activation kernels (cpu.cpp), one extension for the three families, built on
first use and cached on disk, exposed as torch custom ops (below). Each saves exactly what its
plain-torch twin saves (x, and the small bias / gate logits) and runs one pass per direction."""
# No `from __future__ import annotations`: torch.jit.script reads the wrappers' annotations.

from pathlib import Path

import torch

from fusebench.kernels.build import CppKernel
from fusebench.kernels.checks import check_bias_gelu, check_gate

EXT_NAME = "fusebench_act_cpu"
SOURCE = Path(__file__).with_name("cpu.cpp")
DTYPES = (torch.float32, torch.float64, torch.bfloat16)


KERNEL = CppKernel(EXT_NAME, SOURCE, "the activation cpu kernels run")
extension, available, build = KERNEL.extension, KERNEL.available, KERNEL.build


def dense(x: torch.Tensor) -> torch.Tensor:
    """x if NCHW- or channels-last-contiguous, else an NCHW copy (the kernels index densely)."""
    if x.is_contiguous() or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return x.contiguous()


@torch.jit.ignore  # the wrappers below are scriptable; their checks run in Python
def _check(op: str, x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"{op} cpu: unsupported dtype {x.dtype} (supported: "
                        f"{', '.join(str(d).replace('torch.', '') for d in DTYPES)})")
    if x.device.type != "cpu":
        raise ValueError(f"{op} cpu: x must be a CPU tensor, got {x.device}")
    if x.dim() != 4:
        raise ValueError(f"{op} cpu: x must be 4-D (N, C, H, W), got {x.dim()}-D")


# The kernels as torch custom ops (torch.library) with their backward registered as autograd,
# as ln2d/cpu.py does and for the same reason: aot_autograd and torch.compile can trace a
# custom op (the fake implementations give output shapes and layouts), not an autograd.Function
# around a pybind call. The forward ops take x already dense (dense), and each saves exactly
# what its plain-torch twin saves: x, and the small bias / gate logits.
def _like(x: torch.Tensor) -> torch.Tensor:       # fake output: x's (dense) layout and dtype
    return torch.empty_like(x, memory_format=torch.preserve_format)


@torch.library.custom_op("fusebench::silu_cpu_forward", mutates_args=())
def _silu_fwd(x: torch.Tensor) -> torch.Tensor:
    return extension().silu_forward(x)


@torch.library.custom_op("fusebench::silu_cpu_backward", mutates_args=())
def _silu_bwd(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return extension().silu_backward(dy, x)


@torch.library.custom_op("fusebench::se_gate_cpu_forward", mutates_args=())
def _se_gate_fwd(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return extension().se_gate_forward(x, g)


@torch.library.custom_op("fusebench::se_gate_cpu_backward", mutates_args=())
def _se_gate_bwd(dy: torch.Tensor, x: torch.Tensor,
                 g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dx, dg = extension().se_gate_backward(dy, x, g)
    return dx, dg


@torch.library.custom_op("fusebench::bias_gelu_cpu_forward", mutates_args=())
def _bias_gelu_fwd(x: torch.Tensor, bias: torch.Tensor, tanh: bool) -> torch.Tensor:
    return extension().bias_gelu_forward(x, bias, tanh)


@torch.library.custom_op("fusebench::bias_gelu_cpu_backward", mutates_args=())
def _bias_gelu_bwd(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor,
                   tanh: bool) -> tuple[torch.Tensor, torch.Tensor]:
    dx, db = extension().bias_gelu_backward(dy, x, bias, tanh)
    return dx, db


_silu_fwd.register_fake(lambda x: _like(x))
_silu_bwd.register_fake(lambda dy, x: _like(x))
_se_gate_fwd.register_fake(lambda x, g: _like(x))
_se_gate_bwd.register_fake(lambda dy, x, g: (_like(x), g.new_empty(g.shape)))
_bias_gelu_fwd.register_fake(lambda x, bias, tanh: _like(x))
_bias_gelu_bwd.register_fake(lambda dy, x, bias, tanh: (_like(x), bias.new_empty((x.shape[1],))))


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*[t for t in inputs if isinstance(t, torch.Tensor)])
    ctx.flags = [t for t in inputs if not isinstance(t, torch.Tensor)]


_silu_fwd.register_autograd(lambda ctx, dy: _silu_bwd(dy, *ctx.saved_tensors),
                            setup_context=_save_inputs)
_se_gate_fwd.register_autograd(lambda ctx, dy: _se_gate_bwd(dy, *ctx.saved_tensors),
                               setup_context=_save_inputs)
_bias_gelu_fwd.register_autograd(
    lambda ctx, dy: (*_bias_gelu_bwd(dy, *ctx.saved_tensors, *ctx.flags), None),
    setup_context=_save_inputs)


@torch.jit.ignore
def _check_se_gate(x: torch.Tensor, g: torch.Tensor) -> None:
    _check("se_gate", x)
    check_gate(x, g)


@torch.jit.ignore
def _check_bg(x: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    _check("bias_gelu", x)
    check_bias_gelu(x, bias, approximate)


# The wrappers call the ops through torch.ops so that torch.jit.script can compile them too.
def silu_cpu(x: torch.Tensor) -> torch.Tensor:
    """C++/OpenMP: one vectorised pass per direction (libmvec expf); saves only x."""
    _check("silu", x)
    return torch.ops.fusebench.silu_cpu_forward(dense(x))


def se_gate_cpu(x: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """C++/OpenMP: backward computes dx and sum_hw(dy * x) in one pass; saves x and g."""
    _check_se_gate(x, gate_logits)
    return torch.ops.fusebench.se_gate_cpu_forward(dense(x), gate_logits)


def bias_gelu_cpu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """C++/OpenMP: add + GELU in one pass; backward dx and dbias in one pass; saves x, bias."""
    _check_bg(x, bias, approximate)
    return torch.ops.fusebench.bias_gelu_cpu_forward(dense(x), bias, approximate == "tanh")
