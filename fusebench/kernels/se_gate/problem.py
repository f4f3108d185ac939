"""What `fusebench kernel se_gate` measures: the family's impls against its float64 reference."""
from __future__ import annotations

import torch

from fusebench.kernels.se_gate.function import se_gate_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

def _params(shape, g):
    return {"gate_logits": 2 * torch.randn(shape[0], shape[1], 1, 1, generator=g)}


PROBLEM = register_problem(KernelProblem(
    family="se_gate", signature="fn(x, gate_logits) -> y  (gate_logits (N, C, 1, 1))",
    reference=se_gate_reference, params=("gate_logits",), make_params=_params,
    builds=(("cpu", lazy_build("fusebench.kernels.act.cpu")),)))
