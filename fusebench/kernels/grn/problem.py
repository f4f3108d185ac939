"""What `fusebench kernel grn` measures: GRN(gelu(h + b)) over an (N, H, W, C) h, the middle
of ConvNeXt V2's MLP, with b, gamma and beta getting gradients (eps 1e-6, exact GELU)."""
from __future__ import annotations

import torch

from fusebench.kernels.grn.function import grn_reference
from fusebench.kernels.problem import KernelProblem, lazy_build, register_problem


def _params(shape, g):
    C = shape[-1]
    return {name: 0.5 * torch.randn(C, generator=g) for name in ("b", "gamma", "beta")}


PROBLEM = register_problem(KernelProblem(
    family="grn", signature="fn(h, b, gamma, beta) -> GRN(gelu(h + b)), h (N, H, W, C)",
    reference=grn_reference, params=("b", "gamma", "beta"), make_params=_params,
    # two reads of h per direction: GRN's norms are over all of an image before any output
    reads_fwd=2, writes_fwd=1, reads_bwd=4, writes_bwd=1,
    default_shape="8,40,40,160",     # ConvNeXt V2-Atto's first MLP at 160 px: (N, H, W, 4C)
    builds=(("cpu", lazy_build("fusebench.kernels.act.cpu")),)))
