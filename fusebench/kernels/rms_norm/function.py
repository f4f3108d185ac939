"""`function`: RMSNorm as a torch.autograd.Function in plain torch ops, saving x and the (rows,)
rstd only. rms_norm_fwd / rms_norm_bwd are the pure pair (no autograd node of their own) that
the fuser and the other impls' tests share. Autograd of the written-out formula keeps x, x^2's
input, x * rstd and rstd alive for backward."""
from __future__ import annotations

import torch

from fusebench.kernels.function_class import function_class
from fusebench.kernels.registry import register_impl

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in _LOW_PRECISION else t


def rms_norm_fwd(x, weight, eps: float):
    """(y, rstd); rstd is x's shape without its last dim, in the accumulation dtype."""
    xa = _acc(x)
    rstd = torch.rsqrt(xa.pow(2).mean(-1).add_(eps))
    y = (xa * rstd[..., None]).mul_(_acc(weight))
    return y.to(x.dtype), rstd


def rms_norm_bwd(dy, x, weight, rstd):
    """(dx, dweight): dx = rstd * g - x * rstd^3 * mean(g * x), g = dy * w."""
    xa, dya, r = _acc(x), _acc(dy), rstd[..., None]
    g = dya * _acc(weight)
    dx = r * g - xa * (r ** 3) * (g * xa).mean(-1, keepdim=True)
    dw = (dya * xa * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def rms_norm_function_class(fwd, bwd, name: str, once: bool = False) -> type:
    """An autograd.Function over a pure pair of this family, fwd(x, weight, eps) -> (y, rstd)
    and bwd(dy, x, weight, rstd) -> (dx, dweight), saving x, the weight and rstd only (the
    torch impl here, the C++ and Triton ones in cpu.py / triton.py). once: the backward is
    native code, so a double backward must fail, not return zeros."""
    def forward(ctx, x, weight, eps):
        y, rstd = fwd(x, weight, float(eps))
        ctx.save_for_backward(x, weight, rstd)
        return y

    def backward(ctx, dy):
        x, weight, rstd = ctx.saved_tensors
        return (*bwd(dy, x, weight, rstd), None)
    return function_class(name, forward, backward, once)


RMSNormFunction = rms_norm_function_class(rms_norm_fwd, rms_norm_bwd, "RMSNormFunction")


@register_impl("rms_norm", "function")
def rms_norm_function(x, weight, eps: float):
    """autograd.Function in plain torch ops: saves only x and the per-row rstd."""
    return RMSNormFunction.apply(x, weight, float(eps))
