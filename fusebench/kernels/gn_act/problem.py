"""What `fusebench kernel gn_act` measures: fn(x, weight, bias, groups, eps) =
SiLU(GroupNorm(x)) (a diffusion UNet's pair) against the float64 reference. 32 groups, as
Stable Diffusion's and DDPM's UNets use: the shape's C must be a multiple of 32."""
from __future__ import annotations

import torch

from fusebench.kernels.gn_act.reference import gn_act_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

GROUPS, GN_EPS = 32, 1e-6


def _params(shape, g):
    # random, not ones/zeros: a weight of ones would hide one applied per group, not per channel
    C = shape[1]
    return {"weight": 1 + 0.5 * torch.randn(C, generator=g),
            "bias": 0.5 * torch.randn(C, generator=g)}


def _reference(x, w, b):
    return gn_act_reference(x, w, b, GROUPS, GN_EPS, "silu")


PROBLEM = register_problem(KernelProblem(
    family="gn_act", signature="fn(x, weight, bias, groups, eps) -> silu(group_norm(x, groups))",
    consts=(GROUPS, GN_EPS), reference=_reference, params=("weight", "bias"),
    make_params=_params, default_shape="4,128,64,64",
    builds=(("cpu", lazy_build("fusebench.kernels.gn_act.cpu")),)))
