"""bn_add_act (graph, train bench): a residual block's end, BatchNorm2d -> + residual [-> act]:
torchvision's and timm's ResNet (`out = bn3(out); out += identity; out = relu(out)`, in any
spelling: `F.relu(torch.add(identity, out))`, either operand order), and with no activation
after the add MobileNetV2's and MNASNet's `x + conv(x)` projection.

One Function on the bn_act kernel with a residual: the forward's write pass reads r and writes
act(BN(x) + r), so the add and the activation cost no pass of their own, and backward's first
pass stores g = dy * act'(BN(x) + r), which is both r's gradient and what the dx pass reads
(eager: threshold_backward's pass, then batch norm's two). It saves the BN input, the (C,)
statistics and for ReLU / ReLU6 its output (act' reads off it; eager's ReLU saves it too),
for other acts r, for the identity nothing more. Without the kernel
(another device or dtype, a broadcasting residual): aten's batch norm, add and act in the same
Function. A BN in eval mode at call time (frozen statistics) runs act(x * scale + shift + r).

Tried before bn_act and bn_train (an earlier site would take the norm alone); a BN whose output
both operands are (`bn(x) + bn(x)`), an add with alpha, or a norm output used elsewhere are
not candidates or `not_fused` reasons."""
from __future__ import annotations

import torch.fx as fx

from fusebench.fuse.binding import BnActImpl, Pure
from fusebench.fuse.fusions.bn_silu import train_bn_act
from fusebench.fuse.fusions.bn_train import IDENTITY
from fusebench.fuse.fusions.fx_bn_act import bn_eval_kernel, kernel_act
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import act_ending_at, pure_act
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.fx.residual import run_ops_residual
from fusebench.kernels.bn_act.cpu import ACT_CODES

SITE_NAME = "fused_bn_add_act"
PATTERN = "bn_add_act"


def bn_add_act_site(act: Pure, name: str, impl: BnActImpl | None) -> Site:
    def run(c, bn, r):
        if bn.training:
            return train_bn_act(bn, c, impl, act, name, PATTERN, residual=r)
        kernel = bn_eval_kernel(act, bn.running_mean, bn.running_var, bn.eps, name)
        return run_ops_residual(kernel, c, ((bn.weight, bn.bias),), r)
    return Site(SITE_NAME, run)


def _act_on(u: fx.Node, n: fx.Node) -> bool:
    """u ends an activation of n (one node, or a written-out one: `n * sigmoid(n)`) that
    every use of n is inside; n used elsewhere too: BN + add is the site, the act aten's."""
    act = act_ending_at(u)
    return act is not None and not isinstance(act, str) and act.x is n \
        and set(n.users) <= {u, *act.nodes}


def _residual_add(add: fx.Node, scope):
    """(BN node, the identities between it and the add, the residual node) where add is
    `bn(x) + r` in either order; a reason string for a candidate that does not fuse; None."""
    if N.op(add) != "add" or N.number(N.arg(add, 2, "alpha", 1)) != 1:
        return None
    for a, r in N.commuted(add, "add"):
        if not isinstance(r, fx.Node) or not isinstance(a, fx.Node):
            continue
        bn, between = N.above_identities(a, scope.ctx.bench)
        call = N.batch_norm_call(bn, scope.m)
        if call is None:
            continue
        if isinstance(call, str):
            return call
        if not (call.module.affine and call.module.track_running_stats):
            return N.NO_AFFINE_OR_STATS
        if r is a or r in between or r is bn:
            return "the residual is the BatchNorm output itself"
        if len(bn.users) != 1:
            return "the BatchNorm output is used elsewhere too"
        return bn, between, r, call
    return None


@register_pattern(PATTERN, benches=("train",))
def bn_add_act(n, scope):
    """BatchNorm2d -> + residual [-> SiLU/ReLU/GELU/ReLU6/hardswish] -> one Function on the
    bn_act kernel with a residual (a ResNet block's end; an inverted residual's projection)."""
    if N.op(n) == "add":
        if any(_act_on(u, n) for u in n.users):
            return None                       # the act's node is this pattern's end
        add, act = n, None
    else:
        # the add node came first in the walk and left it to this act (an act no kernel
        # computes, or a sum used elsewhere too, took the add alone there)
        act = act_ending_at(n)
        if act is None or isinstance(act, str) or not _act_on(n, act.x):
            return None
        add = act.x
    found = _residual_add(add, scope)
    if found is None:
        return None
    if isinstance(found, str):
        return Miss(PATTERN, found)
    bn, between, r, call = found
    if act is None:
        pure, code = IDENTITY, "identity"
    else:
        code = kernel_act(act.kind, act.approximate)
        pure = pure_act(act.kind, act.approximate, scope.ctx)
    impl = scope.ctx.bn_act() if code in ACT_CODES else None   # quick GELU: aten's ops
    nodes = (bn, *between, add, *(() if act is None else act.nodes))
    return Hit(PATTERN, n, bn_add_act_site(pure, code, impl),
               (N.x_of(bn), Attr(call.path), r), nodes)

