"""What `fusebench kernel bn_act` measures: fn(x, weight, bias, eps) = SiLU(BatchNorm2d(x)) with
the batch's statistics (training mode, EfficientNet's pair), against the float64 reference."""
from __future__ import annotations

import torch

from fusebench.kernels.bn_act.reference import bn_act_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

BN_EPS = 1e-5


def _params(shape, g):
    # random, not ones/zeros: a weight of ones would hide a transposed broadcast
    C = shape[1]
    return {"weight": 1 + 0.5 * torch.randn(C, generator=g),
            "bias": 0.5 * torch.randn(C, generator=g)}


def _reference(x, w, b):
    return bn_act_reference(x, w, b, BN_EPS, "silu")


PROBLEM = register_problem(KernelProblem(
    family="bn_act", signature="fn(x, weight, bias, eps) -> silu(batch_norm(x)), training stats",
    consts=(BN_EPS,), reference=_reference, params=("weight", "bias"), make_params=_params,
    default_shape="8,96,56,56",
    builds=(("cpu", lazy_build("fusebench.kernels.bn_act.cpu")),)))
