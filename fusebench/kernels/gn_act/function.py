"""`function`: GroupNorm + act as a torch.autograd.Function in plain torch ops, saving x and the
(N, G) mean / rstd only. gn_act_fwd / gn_act_bwd are the pure pair (no autograd node of their
own); gn_act_function_class turns any impl's pair into its Function. Eager's F.group_norm then
the act keeps x and the GroupNorm output alive for backward."""
from __future__ import annotations

import torch

from fusebench.kernels.bn_act.reference import ACTS
from fusebench.kernels.function_class import function_class
from fusebench.kernels.registry import register_impl


def _grouped(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t.reshape(t.shape[0], groups, -1)


def _layout(x: torch.Tensor) -> torch.memory_format:
    """x's layout, for the outputs (the grouped reshapes compute in NCHW order)."""
    return torch.channels_last if x.dim() == 4 and not x.is_contiguous() and \
        x.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format


def _z(x, weight, bias, mean, rstd, groups: int):
    """The GroupNorm output from the saved (N, G) statistics, in x's layout."""
    xhat = ((_grouped(x, groups) - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 2)
    return xhat * weight.reshape(shape) + bias.reshape(shape)


def gn_act_fwd(x, weight, bias, groups: int, eps: float, act: str):
    """(y, mean, rstd); mean / rstd (N, G) in x's dtype (float32 for half types)."""
    xa = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    xg = _grouped(xa, groups)
    var, mean = torch.var_mean(xg, -1, correction=0)
    rstd = torch.rsqrt(var + eps)
    z = _z(xa, weight.to(xa.dtype), bias.to(xa.dtype), mean, rstd, groups)
    return ACTS[act](z).to(x.dtype).contiguous(memory_format=_layout(x)), mean, rstd


def gn_act_bwd(dy, x, weight, bias, mean, rstd, groups: int, act: str):
    """(dx, dweight, dbias): z recomputed, act's derivative by autograd on it (aten's own
    derivative, whichever act), then GroupNorm's backward from the per-(n, c) sums."""
    xa = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    w, b = weight.to(xa.dtype), bias.to(xa.dtype)
    with torch.enable_grad():
        z = _z(xa, w, b, mean, rstd, groups).detach().requires_grad_()
        g, = torch.autograd.grad(ACTS[act](z), z, dy.to(xa.dtype))
    N, C = x.shape[:2]
    xhat = ((_grouped(xa, groups) - mean[..., None]) * rstd[..., None]).reshape(N, C, -1)
    g3 = g.reshape(N, C, -1)
    sg, sgx = g3.sum(-1), (g3 * xhat).sum(-1)                  # per (n, c)
    # dx = rstd * (w g - mean_grp(w g) - xhat * mean_grp(w g xhat)), means over D * HW values
    wg, count = _grouped(w.expand(N, C), groups), xhat[0].numel() // groups
    m1 = (wg * _grouped(sg, groups)).sum(-1) / count
    m2 = (wg * _grouped(sgx, groups)).sum(-1) / count
    wgt = _grouped(w.reshape(1, C, 1) * g3, groups)
    dx = rstd[..., None] * (wgt - m1[..., None] - _grouped(xhat, groups) * m2[..., None])
    return (dx.reshape(x.shape).to(x.dtype).contiguous(memory_format=_layout(x)), sgx.sum(0).to(weight.dtype),
            sg.sum(0).to(bias.dtype))


def gn_act_function_class(fwd, bwd, name: str, once: bool = False) -> type:
    """An autograd.Function over a pure pair of this family, fwd(x, w, b, groups, eps, act) ->
    (y, mean, rstd) and bwd(dy, x, w, b, mean, rstd, groups, act) -> (dx, dw, db), saving x,
    the parameters and the statistics only. once: native backward (a double backward fails)."""
    def forward(ctx, x, weight, bias, groups, eps, act):
        y, mean, rstd = fwd(x, weight, bias, int(groups), float(eps), act)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.groups, ctx.act = int(groups), act
        return y

    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        return (*bwd(dy, x, weight, bias, mean, rstd, ctx.groups, ctx.act), None, None, None)
    return function_class(name, forward, backward, once)


GNActFunction = gn_act_function_class(gn_act_fwd, gn_act_bwd, "GNActFunction")


@register_impl("gn_act", "function")
def gn_act_function(x, weight, bias, groups, eps: float):
    """autograd.Function in plain torch ops: saves only x and the (N, G) statistics."""
    return GNActFunction.apply(x, weight, bias, int(groups), float(eps), "silu")
