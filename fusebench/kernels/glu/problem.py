"""What `fusebench kernel glu` measures: SwiGLU's gate, fn(a, b) = silu(a) * b, with b (the up
projection's output, a's shape) as the second input that gets a gradient."""
from __future__ import annotations

import torch

from fusebench.kernels.glu.function import glu_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem


def _params(shape, g):
    return {"b": torch.randn(*shape, generator=g)}


PROBLEM = register_problem(KernelProblem(
    family="glu", signature="fn(a, b) -> silu(a) * b (b: a's shape, gets a gradient)",
    reference=glu_reference, params=("b",), make_params=_params,
    reads_bwd=1, default_shape="8,256,1,1408",      # LLaMA-style (B, T, hidden)
    builds=(("cpu", lazy_build("fusebench.kernels.act.cpu")),)))
