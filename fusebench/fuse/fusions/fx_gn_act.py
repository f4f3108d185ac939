"""gn_act (graph, train and infer): GroupNorm -> activation, as diffusion UNets write it, -> one
GroupNorm + act kernel call (CPU: ours, a stats pass and a write pass forward, two passes
backward, saving x and the (N, G) statistics where eager keeps x and the GroupNorm output):
  diffusers' ResnetBlock2D: nn.GroupNorm -> nn.SiLU (or F.silu);
  CompVis / Stable Diffusion's VAE: Normalize() (an nn.GroupNorm) -> `x * torch.sigmoid(x)`;
  guided-diffusion / LDM's UNet: GroupNorm32 (`super().forward(x.float()).type(x.dtype)`, an
  F.group_norm between two casts) -> nn.SiLU;
any activation match_act reads (SiLU, ReLU, GELU, ReLU6, hardswish, written out or not), with
identity dropouts between. The GroupNorm's parameters stay the user's, read at call time.
Where the kernel does not take the call (a dtype it lacks, C not divisible by the groups, a
float64 x that the user's casts compute in float32), the site runs aten's GroupNorm and the act
as the user's code does.
group_norm (second sweep): a GroupNorm no gn_act site took (an attention block's norm) -> the
same kernel with the identity: it saves what aten's does, and it is faster than aten's
channels-last GroupNorm, which fused mode's channels-last inside hands it (docs/fused.md)."""
from __future__ import annotations

import warnings

import torch
import torch.fx as fx
import torch.nn.functional as F

from fusebench.fuse.binding import GnActImpl, resolve_gn_act
from fusebench.fuse.fusions.fx_bn_act import kernel_act
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import act_ending_at
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.kernels.bn_act.cpu import ACT_CODES
from fusebench.kernels.bn_act.reference import ACTS

DOWN = ("type", "to", "type_as")     # .type(x.dtype), .to(x.dtype), .type_as(x)


def _impl(ctx) -> GnActImpl:
    if ctx.gn_act is None:
        ctx.gn_act = resolve_gn_act(ctx.device, ctx.notes, ctx.impls.get("gn_act"))
    return ctx.gn_act


def _amp_fp32(x: torch.Tensor) -> bool:
    """CUDA autocast runs group_norm in float32 (CPU autocast leaves its dtype as it is)."""
    return x.is_cuda and torch.is_autocast_enabled("cuda")


def gn_act_site(impl: GnActImpl, groups: int, eps: float, act: str, up: bool,
                down: bool, name: str = "fused_gn_act") -> Site:
    """fn(x[, w, b]) = act(GroupNorm(x)): the kernel where it computes what the user's code
    does, else aten's GroupNorm and act. up / down: the user casts x to float32 before the
    norm / the result back to x's dtype after it (GroupNorm32): the kernel then runs on the
    float32 x, applies the act in float32 and rounds once (the spelled form rounds before the
    act: at most an ulp of x's dtype apart, none for float32)."""
    def run(x, w=None, b=None):
        xin = x.float() if up or _amp_fp32(x) else x
        exact = not (up and x.dtype == torch.float64)   # float64 in float32: the user's ops
        if exact and impl.runs_on(xin, groups) and (w is None or w.dtype == xin.dtype):
            if w is None:   # GroupNorm(affine=False): the kernel's ones / zeros, no gradient
                w, b = xin.new_ones(xin.shape[1]), xin.new_zeros(xin.shape[1])
            y = impl.fn(xin, w, b, groups, eps, act)
            return y.to(x.dtype) if down else y
        if impl.name != "aten" and exact:
            warnings.warn(f"gn_act: the {impl.name} kernel does not take this input "
                          f"({xin.dtype}, {tuple(xin.shape)}, groups={groups}, on "
                          f"{xin.device}); ran aten's group_norm + {act}")
        z = F.group_norm(xin, groups, w, b, eps)
        return ACTS[act](z.to(x.dtype) if down else z)
    return Site(name, run)


def _cast_back(n) -> tuple:
    """(the node under a cast back to the dtype of what its norm's input was cast from, the
    cast nodes): GroupNorm32's `.type(x.dtype)`; (n, ()) where there is none."""
    if N.op(n) not in DOWN:
        return n, ()
    inner = N.x_of(n)
    return (inner, (n,)) if N.op(inner) == "group_norm" else (n, ())


def _cast_up(x, down: tuple) -> tuple:
    """(x under `.float()` / `.to(torch.float32)`, the cast node), when the cast back names
    that same x's dtype (or nothing is cast back and the up-cast stands alone)."""
    if N.op(x) == "float" or (N.op(x) == "to" and N.arg(x, 1, "dtype") is torch.float32):
        src = N.x_of(x)
        if not down:
            return src, (x,)
        target = N.arg(down[0], 1, "dtype") if N.op(down[0]) != "type_as" else \
            N.arg(down[0], 1, "other")
        names_src = target is src or (isinstance(target, fx.Node) and target.op ==
                                      "call_function" and target.args == (src, "dtype"))
        if names_src and len(x.users) == 1:
            return src, (x,)
    return x, ()


@register_pattern("gn_act", benches=("train", "infer"))
def gn_act(n, scope):
    """GroupNorm [-> identities] -> SiLU/ReLU/GELU/ReLU6/hardswish (one node or written out)
    -> the gn_act kernel; GroupNorm32's casts around the norm included."""
    act = act_ending_at(n)
    if act is None:
        return None
    top = N.x_of(n) if isinstance(act, str) else act.x
    out, between = N.above_identities(top, scope.ctx.bench,
                                      frozenset() if isinstance(act, str) else {n, *act.nodes})
    core, down = _cast_back(out)
    call = N.group_norm_call(core)
    if call is None:
        return None
    if isinstance(act, str):
        return Miss("gn_act", act)
    if isinstance(call, str):
        return Miss("gn_act", call)
    code = kernel_act(act.kind, act.approximate)
    if code not in ACT_CODES:
        return Miss("gn_act", f"activation {act.kind}: the gn_act kernel does not compute it")
    inside = {n, *act.nodes} if not between else {between[-1]}
    if not set(out.users) <= inside or (down and len(core.users) != 1):
        return Miss("gn_act", "the GroupNorm output is used elsewhere too")
    x, up = _cast_up(call.x, down)
    if down and not up:
        return Miss("gn_act", "a cast after the GroupNorm that is not back to its input's "
                              "dtype")
    site = gn_act_site(_impl(scope.ctx), call.groups, call.eps, code, bool(up), bool(down))
    args = (x,) if call.weight is None else (x, Attr(call.weight), Attr(call.bias))
    return Hit("gn_act", n, site, args, (*act.nodes, *between, *down, core, *up))


@register_pattern("group_norm", benches=("train", "infer"), sweep=1)
def group_norm(n, scope):
    """A GroupNorm that no gn_act site took (no activation after it: an attention block's
    norm) -> the gn_act kernel with the identity; GroupNorm32's casts included."""
    call = N.group_norm_call(n)
    if call is None:
        return None
    if isinstance(call, str):
        return Miss("group_norm", call)
    users = list(n.users)
    down = (users[0],) if len(users) == 1 and N.op(users[0]) in DOWN else ()
    x, up = _cast_up(call.x, down)
    if down and not up:
        down = ()               # a cast that is not back to the input's dtype stays the user's
    site = gn_act_site(_impl(scope.ctx), call.groups, call.eps, "identity", bool(up),
                       bool(down), "fused_group_norm")
    args = (x,) if call.weight is None else (x, Attr(call.weight), Attr(call.bias))
    return Hit("group_norm", down[0] if down else n, site, args, (*down, n, *up))
