"""ln2d (graph): LayerNorm over the channels of an NCHW tensor, in any of the spellings user
code has for it, -> the device's LN2d kernel (the same binding as the module-level ln2d):
  permute(0,2,3,1) -> layer_norm (nn.LayerNorm or F.layer_norm) -> permute(0,3,1,2)
  permute(0,2,3,1) -> layer_norm, used channels-last (ConvNeXt's Block): ln2d(x).permute(...)
  u = mean_c(x); d = x - u; s = mean_c(d**2 | d*d); (x-u) / sqrt(s+eps) | (x-u) * rsqrt(s+eps)
  one pass: s = mean_c(x**2 | x*x) - (u**2 | u*u)
  then w[:, None, None] * n + b[:, None, None] (any broadcast spelling, either operand order).
The weight and bias stay the user's Parameters, read at call time."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from fusebench.fuse.binding import resolve_ln2d
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

FLOATS = (torch.float32, torch.float64)


def _eager(x, w, b, eps):
    """LayerNorm over dim 1, in aten (what runs where the kernel does not take x)."""
    y = F.layer_norm(x.movedim(1, -1), (x.shape[1],), w.reshape(-1), b.reshape(-1), eps)
    return y.movedim(-1, 1)


def ln2d_site(ctx, eps: float, channels_last_view: bool) -> Site:
    if ctx.ln2d is None:
        ctx.ln2d = resolve_ln2d(ctx.device, ctx.notes)
    impl, fn = ctx.ln2d

    def run(x, w, b):
        if x.dim() == 4 and (x.dtype in FLOATS or x.is_cuda):
            y = fn(x, w.reshape(-1), b.reshape(-1), eps)
        else:
            warnings.warn(f"ln2d: the {impl} kernel takes a 4-D float32/float64 NCHW tensor, "
                          f"got {x.dim()}-D {x.dtype}; ran aten's layer_norm instead",
                          stacklevel=2)
            y = _eager(x, w, b, eps)
        return y.permute(0, 2, 3, 1) if channels_last_view else y
    return Site("fused_ln2d", run)


def _layer_norm(n):
    """(x, weight path, bias path, eps) of a layer_norm node over one (last) dim, or a reason."""
    if N.op(n) != "layer_norm":
        return None
    m = N.module(n)
    if m is not None:
        if len(m.normalized_shape) != 1:
            return "normalises more than one dim"
        if m.weight is None or m.bias is None:
            return "LayerNorm without weight or bias (the ln2d kernel takes both)"
        return N.x_of(n), f"{n.target}.weight", f"{n.target}.bias", float(m.eps)
    shape = N.arg(n, 1, "normalized_shape")
    w, b = N.last_param(N.arg(n, 2, "weight")), N.last_param(N.arg(n, 3, "bias"))
    eps = N.number(N.arg(n, 4, "eps", 1e-5))
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 1:
        return "normalized_shape is not one dim (or not a constant)"
    if w is None or b is None or eps is None:
        return "weight / bias not module parameters, or eps not a constant"
    return N.x_of(n), w, b, eps


@register_pattern("ln2d", benches=("train", "infer"))
def permuted_layer_norm(n, scope):
    """permute(0,2,3,1) -> layer_norm [-> permute(0,3,1,2)] -> the LN2d kernel on x."""
    ln = _layer_norm(n)
    if ln is None or not N.is_permute(ln[0] if isinstance(ln, tuple) else N.x_of(n),
                                      (0, 2, 3, 1)):
        return None
    if isinstance(ln, str):
        return Miss("ln2d", ln)
    view, w, b, eps = ln
    x = N.x_of(view)
    back = N.single_user(n)
    nodes = (n, view)
    if back is not None and N.is_permute(back, (0, 3, 1, 2)):
        return Hit("ln2d", back, ln2d_site(scope.ctx, eps, False), (x, Attr(w), Attr(b)),
                   nodes)
    return Hit("ln2d", n, ln2d_site(scope.ctx, eps, True), (x, Attr(w), Attr(b)), (view,))


def _centered(n, x, u) -> bool:
    return N.op(n) == "sub" and N.operands(n) == (x, u)


def _variance(s, x, u) -> bool:
    """s = mean_c((x-u)^2) (two-pass) or mean_c(x^2) - u^2 (one pass)."""
    if N.is_channel_mean(s):
        d = N.square_of(N.x_of(s))
        return d is not None and _centered(d, x, u)
    ab = N.operands(s) if N.op(s) == "sub" else None
    return bool(ab) and N.is_channel_mean(ab[0]) and N.square_of(N.x_of(ab[0])) is x \
        and N.square_of(ab[1]) is u


def _inv_std(n, s_ok):
    """eps of `sqrt(s + eps)` (op 'sqrt') or `rsqrt(s + eps)` (op 'rsqrt')."""
    op = N.op(n)
    if op not in ("sqrt", "rsqrt"):
        return None
    for s, eps in N.commuted(N.x_of(n), "add"):
        if N.number(eps) is not None and s_ok(s):
            return op, N.number(eps)
    return None


def _normalized(n):
    """(x, eps, nodes) when n = (x - mean_c(x)) / std, in any spelling above."""
    op = N.op(n)
    if op not in ("div", "mul"):
        return None
    for d, inv in ([N.operands(n)] if op == "div" else N.commuted(n, "mul")):
        if N.op(d) != "sub":
            continue
        x, u = N.operands(d)
        if not (N.is_channel_mean(u) and N.x_of(u) is x):
            continue
        got = _inv_std(inv, lambda s: _variance(s, x, u))
        if got and got[0] == ("sqrt" if op == "div" else "rsqrt"):
            return x, got[1], (d, inv)
    return None


@register_pattern("ln2d_expr", benches=("train", "infer"))
def layer_norm_expression(n, scope):
    """w * (x - mean_c) / std + b written out (two-pass or E[x^2]-E[x]^2) -> the LN2d kernel."""
    for scaled, b_node in N.commuted(n, "add"):
        b = N.channel_param(b_node)
        for w_node, normed in N.commuted(scaled, "mul") if b else ():
            w, got = N.channel_param(w_node), _normalized(normed)
            if w and got:
                x, eps, _ = got
                return Hit("ln2d", n, ln2d_site(scope.ctx, eps, False),
                           (x, Attr(w), Attr(b)), (scaled, normed, w_node, b_node))
    return None
