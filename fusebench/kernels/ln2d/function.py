"""`function`: LN2d as a torch.autograd.Function in plain torch ops; saves only x, mean, rstd.

The four layers (timm activations_me style): ln2d_fwd / ln2d_bwd (pure tensor functions) ->
LN2dFunction -> ln2d_function (the registered impl). Autograd of the naive formula keeps ~5
x-sized intermediates alive for backward; this keeps x plus two (N, 1, H, W) statistics."""
from __future__ import annotations

import torch

from fusebench.kernels.registry import register_impl

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in _LOW_PRECISION else x


def ln2d_fwd(x, weight, bias, eps: float):
    """(y, mean, rstd). Statistics of x - x[:, :1] (a shift: exact for nearby floats, so a large
    mean such as 1e4 + noise keeps its precision), two-pass variance; mean/rstd are (N,1,H,W)."""
    xa = _acc(x)
    xs = xa - xa[:, :1]                                         # (N, C, H, W), shifted
    mean = xs.mean(1, keepdim=True)                             # (N, 1, H, W)
    xs = xs.sub_(mean)
    rstd = torch.rsqrt(xs.pow(2).mean(1, keepdim=True).add_(eps))
    y = xs.mul_(rstd).mul_(_acc(weight)[:, None, None]).add_(_acc(bias)[:, None, None])
    return y.to(x.dtype), mean, rstd


def ln2d_bwd(dy, x, weight, mean, rstd):
    """(dx, dweight, dbias) from the saved x, mean, rstd."""
    xa = _acc(x)
    xhat = (xa - xa[:, :1] - mean) * rstd                       # (N, C, H, W)
    dya = _acc(dy)
    g = dya * _acc(weight)[:, None, None]
    dx = rstd * (g - g.mean(1, keepdim=True) - xhat * (g * xhat).mean(1, keepdim=True))
    dw = (dya * xhat).sum((0, 2, 3))
    db = dya.sum((0, 2, 3))
    return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype)


class LN2dFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = ln2d_fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = ln2d_bwd(dy, x, weight, mean, rstd)
        return dx, dw, db, None


@register_impl("ln2d", "function")
def ln2d_function(x, weight, bias, eps: float):
    """autograd.Function in plain torch ops: saves only x, mean, rstd."""
    return LN2dFunction.apply(x, weight, bias, eps)
