"""What `fusebench kernel FAMILY` measures: one frozen KernelProblem per family, registered by
the family itself (its problem.py), so this module knows no family.

A problem says how an impl is called, how to make its inputs from an (N, C, H, W) shape, the
float64 reference forward, which gradients exist and how many bytes a direction must move at
least. The kernel cell is generic over these."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusebench.registry import Registry

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
    auto_module: str | None = None       # module with resolve(device), FALLBACK for impl "auto"
    # a piecewise act (ReLU) on a sum: float32 rounding can put an element on the other side
    # of the kink than float64 does, and its gradient jumps there; a failed check is repeated
    # once on other inputs, which decide (cell/kernel_cell.py)
    kinks: bool = False

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


def lazy_build(module: str) -> Callable[[], tuple[bool, str]]:
    """build() of `module`, imported only when a cell needs the extension."""
    def build():
        import importlib
        return importlib.import_module(module).build()
    return build


def get_problem(family: str) -> KernelProblem:
    return PROBLEMS[family]
