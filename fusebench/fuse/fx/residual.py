"""A MultiOpKernel whose output also takes a residual: y = res + kernel(x), or any y the kernel
makes of x and res. The kernel's fwd is called as fwd(x, groups, res) and adds res itself
(e.g. as the accumulator of its last GEMM, so the add costs no pass of its own); backward is
the kernel's. res's gradient is dy as it comes (an add's) where the kernel's bwd returns
(dx, grads per group), or the third item where it returns (dx, grads per group, dres): an
activation after the add (a ResNet block's `act(bn(x) + res)`) makes it dy * act'. res is
saved only if the kernel's fwd lists it among its saved tensors."""
from __future__ import annotations

import torch

from fusebench.fuse.engine import MultiOpKernel, backward_parts, save_entries, split_groups


class ResidualOpFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, kernel: MultiOpKernel, counts: tuple[int, ...], x, res, *flat):
        y, saved = kernel.fwd(x, split_groups(flat, counts), res)
        save_entries(ctx, kernel, counts, saved, flat, x)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        dx, dflat, dres = backward_parts(ctx, dy)
        dres = dy if dres is None else dres
        return (None, None, dx, dres if ctx.needs_input_grad[3] else None, *dflat)


def run_ops_residual(kernel: MultiOpKernel, x: torch.Tensor, groups, res: torch.Tensor):
    """res + the kernel's output, in one Function (groups as engine.run_ops takes them)."""
    groups = tuple(tuple(p for p in g if p is not None) for g in groups)
    counts = tuple(len(g) for g in groups)
    return ResidualOpFunction.apply(kernel, counts, x, res, *[p for g in groups for p in g])
