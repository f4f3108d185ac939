"""rms_norm (graph): RMSNorm over the last dim, in the spellings user code has for it, -> the
device's rms_norm kernel (CPU: ours, one read of x per direction, saving x and a float per row;
CUDA: aten's fused F.rms_norm, binding.RMS_NORM_PREFERRED):
  torch.nn.RMSNorm (with a weight), F.rms_norm(x, (C,), w, eps)
  written out, LLaMA / HF / T5 style: w * (x * rsqrt(mean(x**2 | x.pow(2) | x*x, -1,
  keepdim=True) + eps)), or (...) * w, or x / sqrt(ms + eps); with the float32 casts those
  models put around it (`x.float()`, `.to(torch.float32)`, `.to(input_dtype)`, `.type_as(x)`);
  Gemma's weight stored as an offset from 1, `(...) * (1.0 + w.float())`.
The casts say "compute in float32, return x's dtype": the kernel accumulates in float32 for
float32 and bfloat16 x and rounds once, where the spelled form rounds the normalised value
before the weight's multiply (the two differ by at most a bfloat16 ulp). A float64 x under
those casts is computed in float32 by the user's code, so the kernel (float64 throughout) is
not what it computes: there, and where the kernel does not take the call (float16 on CPU, x and
weight of different dtypes), the site computes the user's spelling in aten. The weight stays
the user's Parameter, read at call time."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.fuse.binding import resolve_rms_norm
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

CASTS = ("to", "float", "type_as")


def _spelled(x, w, eps, up: tuple[bool, bool], down: bool):
    """The written-out form as the user spelled it, in aten: up says which of the multiplied x
    and the squared x were cast to float32 (T5 casts only the latter), down whether the result
    is cast back to x's dtype before the weight's multiply."""
    xf = x.float() if any(up) else x        # one cast node, as the spellings have it
    xm, xs = (xf if cast else x for cast in up)
    n = xm * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
    return w * (n.to(x.dtype) if down else n)


def rms_norm_site(ctx, eps: float | None, fallback, in_float32: bool = False,
                  weight=None) -> Site:
    """fn(x, w): the bound kernel where it computes what the user's code does, else
    `fallback(x, w, eps)`. in_float32: the spelling casts x to float32 (so a float64 x is not
    the kernel's). eps None is nn.RMSNorm's default: the machine epsilon of x's dtype.
    weight: the code's weight from the Parameter (Gemma's `1 + w.float()`), default w."""
    if ctx.rms_norm is None:
        ctx.rms_norm = resolve_rms_norm(ctx.device, ctx.notes, ctx.impls.get("rms_norm"))
    _, fn, takes = ctx.rms_norm

    def run(x, w):
        w = w if weight is None else weight(w)
        e = torch.finfo(x.dtype).eps if eps is None else eps
        if x.dtype == w.dtype and (takes is None or x.dtype in takes) and x.dim() >= 1 \
                and not (in_float32 and x.dtype == torch.float64):
            return fn(x, w, e)
        return fallback(x, w, e)
    return Site("fused_rms_norm", run)


def _uncast(n) -> tuple:
    """(the tensor under any chain of float casts, the cast nodes passed)."""
    casts = []
    while N.op(n) in CASTS:
        casts.append(n)
        n = N.x_of(n)
    return n, tuple(casts)


def _is_last_mean(n) -> bool:
    return N.mean_dims(n) == ((-1,), True)


def _normalised(n):
    """(x, eps, up, absorbed nodes) when n = x * rsqrt(mean(x^2, -1) + eps) (or x / sqrt(...)),
    x possibly under float casts (up: whether the multiplied and the squared x were), else
    None."""
    op = N.op(n)
    if op not in ("mul", "div"):
        return None
    for a, inv in ([N.operands(n)] if op == "div" else N.commuted(n, "mul")):
        if N.op(inv) != ("sqrt" if op == "div" else "rsqrt"):
            continue
        for ms, eps in N.commuted(N.x_of(inv), "add"):
            eps = N.number(eps)
            if eps is None or not _is_last_mean(ms):
                continue
            x, casts = _uncast(a)
            sq = N.square_of(N.x_of(ms))
            if sq is None:
                continue
            x2, casts2 = _uncast(sq)
            if x2 is x and x is not None:       # (x itself is the site's argument, kept)
                return x, eps, (bool(casts), bool(casts2)), (*casts, inv, N.x_of(inv), ms,
                                                              sq, *casts2)
    return None


def _module_or_call(n):
    """(x, weight path, eps | None) of an nn.RMSNorm / F.rms_norm node, or a reason."""
    m = N.module(n)
    if m is not None:
        if len(m.normalized_shape) != 1:
            return "RMSNorm over more than one dim"
        if m.weight is None:
            return "RMSNorm without a weight (elementwise_affine=False)"
        return N.x_of(n), f"{n.target}.weight", m.eps
    shape = N.arg(n, 1, "normalized_shape")
    w = N.last_param(N.arg(n, 2, "weight"))
    eps = N.arg(n, 3, "eps")
    if not isinstance(shape, (tuple, list, torch.Size)) or len(shape) != 1:
        return "normalized_shape is not one constant dim"
    if w is None or (eps is not None and N.number(eps) is None):
        return "weight not a module parameter, or eps not a constant"
    return N.x_of(n), w, None if eps is None else N.number(eps)


@register_pattern("rms_norm", benches=("train", "infer"))
def rms_norm(n, scope):
    """nn.RMSNorm / F.rms_norm / the written-out LLaMA form -> the rms_norm kernel."""
    if N.op(n) == "rms_norm":
        got = _module_or_call(n)
        if isinstance(got, str):
            return Miss("rms_norm", got)
        x, w, eps = got
        site = rms_norm_site(scope.ctx, eps,
                             lambda x, w, e: F.rms_norm(x, (x.shape[-1],), w, e))
        return Hit("rms_norm", n, site, (x, Attr(w)))
    for w_node, normed in N.commuted(n, "mul"):
        w, weight, w_nodes = N.last_param(w_node), None, (w_node,)
        if w is None:
            w, weight, w_nodes = _one_plus(w_node)
        core, down = _uncast(normed)
        got = _normalised(core) if w else None
        if got is None:
            continue
        x, eps, up, nodes = got
        site = rms_norm_site(scope.ctx, eps, lambda x, w, e, up=up, down=bool(down):
                             _spelled(x, w, e, up, down), in_float32=any(up), weight=weight)
        return Hit("rms_norm", n, site, (x, Attr(w)), (normed, *down, core, *nodes, *w_nodes))
    got = _normalised(n)
    if got is not None and not any(N.op(u) == "mul" and any(_weight_path(o) for o in
                                                            N.operands(u) or ())
                                   for u in _users_through_casts(n)):
        return Miss("rms_norm", "no 1-D weight Parameter multiplies the normalised x "
                                "(the kernel takes x * rsqrt(mean(x^2) + eps) * w)")
    return None


def _weight_path(n) -> str | None:
    return N.last_param(n) or _one_plus(n)[0]


def _one_plus(n) -> tuple:
    """(path, weight fn, nodes) where n is `1 + w` of a 1-D Parameter w, possibly cast to
    float32 first (Gemma's RMSNorm stores w around 0: `x * (1.0 + self.weight.float())`), the
    fn computing that from w as the code does; else (None, None, ())."""
    if N.op(n) != "add":
        return None, None, ()
    for one, p in N.commuted(n, "add"):
        param, casts = _uncast(p)
        path = N.last_param(param)
        if N.number(one) == 1.0 and path is not None:
            return path, (lambda w: 1.0 + w.float()) if casts else (lambda w: 1.0 + w), \
                (n, *casts)
    return None, None, ()


def _users_through_casts(n) -> list:
    out, todo = [], list(n.users)
    while todo:
        u = todo.pop()
        if N.op(u) in CASTS:
            todo.extend(u.users)
        else:
            out.append(u)
    return out
