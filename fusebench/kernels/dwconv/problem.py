"""What `fusebench kernel dwconv` measures: fn(x, weight, bias), ConvNeXt's 7x7 depthwise conv
(weight (C, 1, 7, 7), bias (C,)), against the float64 reference."""
from __future__ import annotations

import torch

from fusebench.kernels.dwconv.reference import dwconv_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem

KERNEL_SIZE = 7       # ConvNeXt's; the C++ kernel also covers 3 and 5, stride 2 (cpu.SIZES)


def _params(shape, g):
    C = shape[1]
    return {"weight": 0.2 * torch.randn(C, 1, KERNEL_SIZE, KERNEL_SIZE, generator=g),
            "bias": torch.randn(C, generator=g)}


PROBLEM = register_problem(KernelProblem(
    family="dwconv", signature="fn(x, weight, bias) -> y  (weight (C, 1, 7, 7), bias (C,))",
    reference=dwconv_reference, params=("weight", "bias"), make_params=_params,
    builds=(("cpu", lazy_build("fusebench.kernels.dwconv.cpu")),)))
