"""What `fusebench kernel FAMILY` measures for each family: one frozen KernelProblem per family.

A problem says how an impl is called, how to make its inputs from an (N, C, H, W) shape, the
float64 reference forward, which gradients exist and how many bytes a direction must move at
least. bench.py is generic over these; a new family adds one `register_problem(...)` here."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusebench.registry import Registry

LN2D_EPS = 1e-6

ParamMaker = Callable[[list[int], torch.Generator], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class KernelProblem:
    family: str
    signature: str                       # how a user impl is called, for help and errors
    # an impl is called fn(x, *params, *consts): consts are plain floats such as ln2d's eps
    reference: Callable                  # reference(x, *params) -> y, all float64
    params: tuple[str, ...] = ()         # inputs after x that get gradients, in call order
    consts: tuple[float, ...] = ()       # non-tensor arguments after the params
    make_params: ParamMaker | None = None  # (shape, generator) -> {name: float32 CPU tensor}
    reads_fwd: int = 1                   # x-sized tensors read by forward (x)
    writes_fwd: int = 1                  # ... written by forward (y)
    reads_bwd: int = 2                   # ... read by backward (x, dy)
    writes_bwd: int = 1                  # ... written by backward (dx)
    default_shape: str = "8,96,56,56"
    builds: tuple[tuple[str, Callable[[], tuple[bool, str]]], ...] = ()  # (impl, build()) pairs
    fused_module: str | None = None      # module with resolve(device), FALLBACK for impl "fused"

    def grad_names(self) -> list[str]:
        return ["dx"] + [f"d{p}" for p in self.params]

    def param_numel(self, shape) -> int:
        g = torch.Generator().manual_seed(0)
        return sum(t.numel() for t in self.make_params(shape, g).values()) if self.make_params \
            else 0

    def bytes_moved(self, shape, dtype: torch.dtype, direction: str) -> int:
        """Minimum memory traffic: x-sized reads/writes plus each param read in forward and
        read + gradient written in backward. Saved statistics are left out."""
        n = math.prod(shape)
        p = self.param_numel(shape)
        es = torch.empty((), dtype=dtype).element_size()
        fwd = ((self.reads_fwd + self.writes_fwd) * n + p) * es
        bwd = ((self.reads_bwd + self.writes_bwd) * n + 2 * p) * es
        return {"fwd": fwd, "bwd": bwd, "fwdbwd": fwd + bwd}[direction]

    def build_for(self, impl: str) -> Callable[[], tuple[bool, str]] | None:
        return dict(self.builds).get(impl)


PROBLEMS: Registry[KernelProblem] = Registry("benchmarkable kernel family")


def register_problem(problem: KernelProblem) -> KernelProblem:
    return PROBLEMS.add(problem.family, problem)


def _lazy_build(module: str) -> Callable[[], tuple[bool, str]]:
    def build():
        import importlib
        return importlib.import_module(module).build()
    return build


# ------------------------------------------------------------------------------------ ln2d
def _ln2d_params(shape, g):
    # random, not ones/zeros: a weight of ones would hide a transposed broadcast
    C = shape[1]
    return {"weight": 1 + 0.5 * torch.randn(C, generator=g),
            "bias": 0.5 * torch.randn(C, generator=g)}


def _ln2d_reference(x, w, b):
    from fusebench.kernels.ln2d.reference import ln2d_reference
    return ln2d_reference(x, w, b, LN2D_EPS)


register_problem(KernelProblem(
    family="ln2d", signature="fn(x, weight, bias, eps) -> y",
    consts=(LN2D_EPS,), reference=_ln2d_reference,
    params=("weight", "bias"), make_params=_ln2d_params,
    builds=(("cpu", _lazy_build("fusebench.kernels.ln2d.cpu")),),
    fused_module="fusebench.kernels.ln2d.fused"))


# ------------------------------------------------------------------------------------ act
def _silu_reference(x):
    from fusebench.kernels.act.silu import silu_reference
    return silu_reference(x)


def _se_gate_params(shape, g):
    return {"gate_logits": 2 * torch.randn(shape[0], shape[1], 1, 1, generator=g)}


def _se_gate_reference(x, g):
    from fusebench.kernels.act.se_gate import se_gate_reference
    return se_gate_reference(x, g)


def _bias_gelu_params(shape, g):
    return {"bias": 0.5 * torch.randn(shape[1], generator=g)}


def _bias_gelu_reference(x, b, approximate: str = "none"):
    from fusebench.kernels.act.bias_gelu import bias_gelu_reference
    return bias_gelu_reference(x, b, approximate)


_ACT_BUILD = (("cpu", _lazy_build("fusebench.kernels.act.cpu")),)

register_problem(KernelProblem(
    family="silu", signature="fn(x) -> y",
    reference=_silu_reference, builds=_ACT_BUILD))
register_problem(KernelProblem(
    family="se_gate", signature="fn(x, gate_logits) -> y  (gate_logits (N, C, 1, 1))",
    reference=_se_gate_reference,
    params=("gate_logits",), make_params=_se_gate_params, builds=_ACT_BUILD))
register_problem(KernelProblem(
    family="bias_gelu", signature="fn(x, bias) -> y",
    reference=_bias_gelu_reference,
    params=("bias",), make_params=_bias_gelu_params, builds=_ACT_BUILD))
