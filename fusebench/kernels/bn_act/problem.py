"""What `fusebench kernel bn_act` measures: fn(x, weight, bias, eps) = SiLU(BatchNorm2d(x)) with
the batch's statistics (training mode, EfficientNet's pair), against the float64 reference; and
`fusebench kernel bn_add_act`: fn(x, residual, weight, bias, eps) = ReLU(BatchNorm2d(x) +
residual), a ResNet block's end."""
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


def _residual_params(shape, g):
    return {"residual": torch.randn(*shape, generator=g), **_params(shape, g)}


def _residual_reference(x, r, w, b):
    return bn_act_reference(x, w, b, BN_EPS, "relu", residual=r)


PROBLEM = register_problem(KernelProblem(
    family="bn_act", signature="fn(x, weight, bias, eps) -> silu(batch_norm(x)), training stats",
    consts=(BN_EPS,), reference=_reference, params=("weight", "bias"), make_params=_params,
    default_shape="8,96,56,56",
    builds=(("cpu", lazy_build("fusebench.kernels.bn_act.cpu")),)))

# a ResNet block's end (the graph bn_add_act site): the residual is an x-sized input that gets
# a gradient; at least, forward reads x and r and writes y, backward reads dy, x and y (ReLU's
# derivative) and writes dx and dr
RESIDUAL_PROBLEM = register_problem(KernelProblem(
    family="bn_add_act",
    signature="fn(x, residual, weight, bias, eps) -> relu(batch_norm(x) + residual), "
              "training stats (residual: x's shape, gets a gradient)",
    consts=(BN_EPS,), reference=_residual_reference, params=("residual", "weight", "bias"),
    make_params=_residual_params, reads_fwd=2, reads_bwd=3, writes_bwd=2, kinks=True,
    default_shape="8,256,40,40",                      # ResNet-50's first stage, b8 at 160 px
    builds=(("cpu", lazy_build("fusebench.kernels.bn_act.cpu")),)))
