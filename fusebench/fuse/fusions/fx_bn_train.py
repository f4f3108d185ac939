"""bn_train (graph, train bench): a user's BatchNorm2d with no activation fused after it
(torchvision's Conv2dNormActivation(activation_layer=None): MBConv's projection) -> the bn_act
kernel with the identity activation, as the zoo's bn_train runs it (fusions/bn_train.py): one
statistics pass + one write pass forward, two passes backward, saving the BN input and the
(C,) statistics. Tried in the graph pass's second sweep, so bn_act keeps every BN it fuses
with an activation. A BN in eval mode at call time runs aten's batch norm."""
from __future__ import annotations

import torch.nn.functional as F

from fusebench.fuse.binding import BnActImpl
from fusebench.fuse.fusions.bn_silu import train_bn_act
from fusebench.fuse.fusions.bn_train import IDENTITY
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

SITE_NAME = "fused_bn_train"


def bn_train_site(impl: BnActImpl | None) -> Site:
    def run(c, bn):
        if bn.training:
            return train_bn_act(bn, c, impl, IDENTITY, "identity", "bn_train")
        # the norm alone: calling bn would also run a subclass's activation (BatchNormAct2d)
        return F.batch_norm(c, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                            0.0, bn.eps)
    return Site(SITE_NAME, run)


@register_pattern("bn_train_fx", benches=("train",), sweep=1)
def bn_train(n, scope):
    """BatchNorm2d with no activation fused after it -> one Function on the bn_act kernel."""
    call = N.batch_norm_call(n, scope.m)
    if call is None:
        return None             # 1-D, Sync...: not a candidate of this pattern
    if isinstance(call, str):
        return Miss("bn_train", call)
    if not (call.module.affine and call.module.track_running_stats):
        return Miss("bn_train", N.NO_AFFINE_OR_STATS)
    return Hit("bn_train", n, bn_train_site(scope.ctx.bn_act()), (N.x_of(n), Attr(call.path)))
