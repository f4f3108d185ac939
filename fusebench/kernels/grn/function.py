"""GRN (Global Response Normalization, ConvNeXt V2) after a bias + activation, in torch ops.

g = act(h + b) over an (N, H, W, C) h; G = ||g||_2 over H and W per image and channel; m =
mean_C G + eps; GRN's output u = gamma * (g * G / m) + beta + g = g * s + beta with s = 1 +
gamma * G / m. grn_fwd / grn_bwd are the pure pair (no autograd node of their own: the
grn_mlp site's fallback, and the native kernels' twin in the tests): forward keeps h and the
(N, C) norms only, backward rebuilds g. GRNFunction saves those; the `eager` impl is GRN as
the reference code writes it, whose autograd keeps g, g * n and more."""
from __future__ import annotations

import torch

from fusebench.kernels.glu.function import act_grad, act_of
from fusebench.kernels.function_class import function_class
from fusebench.kernels.registry import register_impl

ACTS = ("silu", "relu", "gelu", "gelu_tanh")      # what the native kernels take (cpu_math.h)


def checked(h: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, act: str) -> None:
    """One clear line for what the family cannot take."""
    if act not in ACTS:
        raise ValueError(f"grn: act {act!r} not one of {', '.join(ACTS)}")
    if h.dim() != 4:
        raise ValueError(f"grn: h must be (N, H, W, C), got {h.dim()}-D")
    C = h.shape[-1]
    if gamma.numel() != C or beta.numel() != C:
        raise ValueError(f"grn: gamma and beta must have C = {C} values, got {gamma.numel()} "
                         f"and {beta.numel()}")


def _z(h, b):
    return h if b is None else h + b.reshape(-1)


def grn_reference(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """float64 ground truth, as the reference code writes GRN."""
    g = act_of(_z(h.double(), None if b is None else b.double()), act)
    big = torch.norm(g, p=2, dim=(1, 2), keepdim=True)
    n = big / (big.mean(dim=-1, keepdim=True) + eps)
    return gamma.double().reshape(-1) * (g * n) + beta.double().reshape(-1) + g


def _scale(big, m, gamma):
    return 1 + gamma.reshape(-1) * (big / m[:, None])


def grn_fwd(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """(u, G (N, C), m (N,))."""
    g = act_of(_z(h, b), act)
    # a sum of squares: aten's vector_norm over dims (1, 2) of (N, H, W, C) ran 1.8-50x slower
    # at ConvNeXt V2's stage shapes (docs/fused.md, forty-seventh session)
    big = g.square().sum((1, 2)).sqrt_()
    m = big.mean(-1) + eps
    return torch.addcmul(beta.reshape(-1), g, _scale(big, m, gamma)[:, None, None]), big, m


def channel_grads(ds, sdu, big, m, gamma, beta):
    """GRN's backward on (N, C) sums, shared by every impl that sums on its own (ds = sum_hw
    du * g, sdu = sum_hw du): (k, dgamma, dbeta) with dg = du * s + g * k."""
    n = big / m[:, None]
    dn = ds * gamma.reshape(-1)
    dbig = dn / m[:, None] - (dn * big).sum(-1, keepdim=True) / (m * m * big.shape[-1])[:, None]
    k = torch.where(big > 0, dbig / big, torch.zeros_like(big))   # g is 0 where G is
    return (k, (ds * n).sum(0).to(gamma.dtype).reshape(gamma.shape),
            sdu.sum(0).to(beta.dtype).reshape(beta.shape))


def grn_bwd(du, h, b, gamma, beta, big, m, act: str = "gelu", want_u: bool = False):
    """(dh, db, dgamma, dbeta[, u]): db None without b; want_u: GRN's output too (the grn_mlp
    site's fc2 weight gradient reads it; rebuilt here from the same g)."""
    z = _z(h, b)
    g = act_of(z, act)
    s = _scale(big, m, gamma)
    k, dgamma, dbeta = channel_grads((du * g).sum((1, 2)), du.sum((1, 2)), big, m, gamma, beta)
    dg = du * s[:, None, None] + g * k[:, None, None]
    dh = act_grad(dg, z, act)
    db = dh.sum((0, 1, 2)).reshape(b.shape) if b is not None else None
    out = (dh, db, dgamma, dbeta)
    return (*out, torch.addcmul(beta.reshape(-1), g, s[:, None, None])) if want_u else out


def grn_function(fwd, bwd, name: str, once: bool = False) -> type:
    """An autograd.Function over a pure (fwd, bwd) pair of this family, saving h, b, gamma,
    beta and the norms. once: the backward is native code, so a double backward must fail,
    not return zeros."""
    def forward(ctx, h, b, gamma, beta, eps, act):
        u, big, m = fwd(h, b, gamma, beta, eps, act)
        ctx.save_for_backward(h, b, gamma, beta, big, m)
        ctx.act = act
        return u

    def backward(ctx, du):
        h, b, gamma, beta, big, m = ctx.saved_tensors
        return (*bwd(du, h, b, gamma, beta, big, m, ctx.act), None, None)
    return function_class(name, forward, backward, once)


GRNFunction = grn_function(grn_fwd, grn_bwd, "GRNFunction")


@register_impl("grn", "eager")
def grn_eager(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """GRN as the reference code writes it (torch.norm, gamma * (g * n) + beta + g): autograd
    keeps h + b, g, the norms, g * n and more."""
    checked(h, gamma, beta, act)
    g = act_of(_z(h, b), act)
    big = torch.norm(g, p=2, dim=(1, 2), keepdim=True)
    n = big / (big.mean(dim=-1, keepdim=True) + eps)
    return gamma.reshape(-1) * (g * n) + beta.reshape(-1) + g


@register_impl("grn", "function")
def grn_torch(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """autograd.Function in plain torch ops: saves h and the (N, C) norms only."""
    checked(h, gamma, beta, act)
    return GRNFunction.apply(h, b, gamma, beta, eps, act)


__all__ = ["ACTS", "GRNFunction", "grn_bwd", "grn_fwd", "grn_reference"]
