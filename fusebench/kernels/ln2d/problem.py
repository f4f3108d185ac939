"""What `fusebench kernel ln2d` measures: fn(x, weight, bias, eps) against the float64 two-pass
reference, random affine parameters."""
from __future__ import annotations

import torch

from fusebench.kernels.ln2d.reference import ln2d_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

LN2D_EPS = 1e-6


def _params(shape, g):
    # random, not ones/zeros: a weight of ones would hide a transposed broadcast
    C = shape[1]
    return {"weight": 1 + 0.5 * torch.randn(C, generator=g),
            "bias": 0.5 * torch.randn(C, generator=g)}


def _reference(x, w, b):
    return ln2d_reference(x, w, b, LN2D_EPS)


PROBLEM = register_problem(KernelProblem(
    family="ln2d", signature="fn(x, weight, bias, eps) -> y",
    consts=(LN2D_EPS,), reference=_reference,
    params=("weight", "bias"), make_params=_params,
    builds=(("cpu", lazy_build("fusebench.kernels.ln2d.cpu")),),
    auto_module="fusebench.kernels.ln2d.auto"))
