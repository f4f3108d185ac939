"""What `fusebench kernel rms_norm` measures: fn(x, weight, eps) over x's last dim against the
float64 reference. The command's N,C,H,W shape is the tensor's shape as given, so a
transformer's (batch, tokens, width) is `B,T,1,D` (the default: 8 x 256 tokens x 512)."""
from __future__ import annotations

import torch

from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem
from fusebench.kernels.rms_norm.reference import rms_norm_reference

RMS_EPS = 1e-6


def _params(shape, g):
    # random, not ones: a weight of ones would hide a weight applied on the wrong dim
    return {"weight": 1 + 0.5 * torch.randn(shape[-1], generator=g)}


def _reference(x, w):
    return rms_norm_reference(x, w, RMS_EPS)


PROBLEM = register_problem(KernelProblem(
    family="rms_norm", signature="fn(x, weight, eps) -> y (over x's last dim)",
    consts=(RMS_EPS,), reference=_reference, params=("weight",), make_params=_params,
    default_shape="8,256,1,512",
    builds=(("cpu", lazy_build("fusebench.kernels.rms_norm.cpu")),)))
