"""A MultiOpKernel whose output also takes a residual: y = res + kernel(x). The kernel's fwd is
called as fwd(x, groups, res) and adds res itself (e.g. as the accumulator of its last GEMM,
so the add costs no pass of its own); backward is the kernel's, and res's gradient is dy as
it comes (an add's). res is not saved."""
from __future__ import annotations

import torch

from fusebench.fuse.engine import MultiOpFunction, MultiOpKernel, save_entries, split_groups


class ResidualOpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel: MultiOpKernel, counts: tuple[int, ...], x, res, *flat):
        y, saved = kernel.fwd(x, split_groups(flat, counts), res)
        save_entries(ctx, kernel, counts, saved, flat, x)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        _, _, dx, *dflat = MultiOpFunction.backward.__wrapped__(ctx, dy)
        return (None, None, dx, dy if ctx.needs_input_grad[3] else None, *dflat)


def run_ops_residual(kernel: MultiOpKernel, x: torch.Tensor, groups, res: torch.Tensor):
    """res + the kernel's output, in one Function (groups as engine.run_ops takes them)."""
    groups = tuple(tuple(p for p in g if p is not None) for g in groups)
    counts = tuple(len(g) for g in groups)
    return ResidualOpFunction.apply(kernel, counts, x, res, *[p for g in groups for p in g])
