"""bn_act (graph, train bench): BatchNorm2d -> SiLU / ReLU / GELU / ReLU6 / hardswish, whatever
module or function spells the activation (torchvision's Conv2dNormActivation, a user's
Sequential, F.relu(bn(x)), MobileNet's ReLU6 and hardswish) and the norm (an nn.BatchNorm2d,
or a subclass calling F.batch_norm: timm's BatchNormAct2d), or an nn.BatchNorm1d over (N, C, L)
(PointNet's and audio models' Conv1d stacks, a Conformer's convolution module) or (N, C), run
as the image bn_silu.as_image views it as (after a Linear: a Miss, bn_silu.one_d_miss).
Training-mode BN: one Function that saves the BN input and the (C,) statistics and recomputes
the BN output in backward (bn_silu's train_bn_act with the matched activation: the bn_act
kernel where bound, else aten's sequence). Eval-mode BN (frozen
statistics inside a training run): act(x * scale + shift) in one Function that saves x only."""
from __future__ import annotations

import torch

from fusebench.fuse.binding import BnActImpl, Pure
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.fusions.bn_silu import (act_input, as_image, bn_affine, one_d_miss,
                                             residual_grad, residual_keep, train_bn_act)
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import act_ending_at, pure_act
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.kernels.bn_act.cpu import ACT_CODES

_BC = (slice(None), None, None)                  # (C,) -> (C, 1, 1)
SITE_NAME = "fused_bn_act"


def bn_eval_kernel(act: Pure, running_mean, running_var, eps: float,
                   residual_act: str | None = None) -> MultiOpKernel:
    """act(x * scale + shift [+ res]) with the running statistics (fwd(x, groups[, res]));
    saves x [and what bn_silu.residual_keep says for the act named residual_act], recomputes z
    in backward."""
    like: dict = {}          # a residual call's (shape, dtype): its gradient's (it may broadcast)

    def fwd(x, groups, res=None):
        (w, b), = groups
        inv = torch.rsqrt(running_var + eps)
        scale, shift = w * inv, b - running_mean * w * inv
        z = bn_affine(x, scale, shift)
        if res is None:
            return act.fwd(z), (x,)
        like["res"] = (res.shape, res.dtype)
        y = act.fwd(z + res)
        return y, (x, *residual_keep(residual_act, y, res))

    def bwd(dy, saved, groups):
        (x, *kept), ((w, b),) = saved, groups
        inv = torch.rsqrt(running_var + eps)
        scale = w * inv
        z = bn_affine(x, scale, b - running_mean * scale)   # recomputed
        dz = act.bwd(dy, act_input(residual_act, kept, z) if like else z)
        dscale, dshift = (dz * x).sum((0, 2, 3)), dz.sum((0, 2, 3))
        dx = dz * scale[_BC]
        out = dx.to(x.dtype), ((inv * (dscale - running_mean * dshift), dshift),)
        return (*out, residual_grad(dz, like["res"])) if like else out
    return MultiOpKernel(f"bn_eval_act[{act.impl}]", fwd, bwd)


def kernel_act(op: str, approximate: str) -> str:
    """The bn_act kernel's name for the matched activation (kernels/bn_act ACT_CODES)."""
    return "gelu_tanh" if op == "gelu" and approximate == "tanh" else op


def bn_act_site(act: Pure, name: str, impl: BnActImpl | None) -> Site:
    def run(c, bn):
        x, back = as_image(c)
        if bn.training:
            return back(train_bn_act(bn, x, impl, act, name, "bn_act"))
        kernel = bn_eval_kernel(act, bn.running_mean, bn.running_var, bn.eps)
        return back(run_ops(kernel, x, ((bn.weight, bn.bias),)))
    return Site(SITE_NAME, run)


@register_pattern("bn_act", benches=("train",))
def bn_act(n, scope):
    """BatchNorm2d [-> nn.Identity] -> SiLU/ReLU/GELU/ReLU6/hardswish (one node, or written out:
    fx/spelled.py) -> one Function (train or eval statistics); the BN an nn.BatchNorm2d call or
    a subclass's F.batch_norm (timm's BatchNormAct2d, whose `drop` is the identity between)."""
    act = act_ending_at(n)
    if act is None:
        return None
    bn, between = N.above_identities(N.x_of(n) if isinstance(act, str) else act.x,
                                     scope.ctx.bench,
                                     frozenset() if isinstance(act, str) else {n, *act.nodes})
    call = N.batch_norm_call(bn, scope.m, one_d=True)
    if call is None:
        return None
    if isinstance(act, str):
        return Miss("bn_act", act)
    if isinstance(call, str):
        return Miss("bn_act", call)
    if not (call.module.affine and call.module.track_running_stats):
        return Miss("bn_act", N.NO_AFFINE_OR_STATS)
    rows = one_d_miss(call.module, N.op(N.x_of(bn)))
    if rows:
        return Miss("bn_act", rows)
    # a written-out act reads its input more than once: every use must be inside it
    inside = {n, *act.nodes} if not between else {between[-1]}
    if not set(bn.users) <= inside:
        return Miss("bn_act", "the BatchNorm output is used elsewhere too")
    code = kernel_act(act.kind, act.approximate)
    impl = scope.ctx.bn_act() if code in ACT_CODES else None   # quick GELU: aten's ops
    site = bn_act_site(pure_act(act.kind, act.approximate, scope.ctx), code, impl)
    return Hit("bn_act", n, site, (N.x_of(bn), Attr(call.path)), (bn, *between, *act.nodes))
