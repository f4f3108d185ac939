"""What `fusebench kernel bias_gelu` measures: the family's impls against its float64 reference."""
from __future__ import annotations

import torch

from fusebench.kernels.bias_gelu.function import bias_gelu_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

def _params(shape, g):
    return {"bias": 0.5 * torch.randn(shape[1], generator=g)}


PROBLEM = register_problem(KernelProblem(
    family="bias_gelu", signature="fn(x, bias) -> y",
    reference=bias_gelu_reference, params=("bias",), make_params=_params,
    builds=(("cpu", lazy_build("fusebench.kernels.act.cpu")),)))
