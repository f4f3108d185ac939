"""bn_train (graph, train bench): a user's BatchNorm2d with no activation fused after it
(torchvision's Conv2dNormActivation(activation_layer=None): MBConv's projection) -> the bn_act
kernel with the identity activation, as the zoo's bn_train runs it (fusions/bn_train.py): one
statistics pass + one write pass forward, two passes backward, saving the BN input and the
(C,) statistics. Tried in the graph pass's second sweep, so bn_act keeps every BN it fuses
with an activation. A BN in eval mode at call time runs the module itself (aten)."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.binding import BnActImpl
from fusebench.fuse.fusions.bn_silu import train_bn_act
from fusebench.fuse.fusions.bn_train import IDENTITY
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

SITE_NAME = "fused_bn_train"


def bn_train_site(impl: BnActImpl | None) -> Site:
    def run(c, bn):
        if bn.training and bn.track_running_stats and bn.affine:
            return train_bn_act(bn, c, impl, IDENTITY, "identity", "bn_train")
        return bn(c)
    return Site(SITE_NAME, run)


@register_pattern("bn_train_fx", benches=("train",), sweep=1)
def bn_train(n, scope):
    """BatchNorm2d with no activation fused after it -> one Function on the bn_act kernel."""
    m = N.module(n) if N.op(n) == "batch_norm" else None
    if type(m) is not nn.BatchNorm2d:
        return None             # functional, 1-D, Sync...: not a candidate of this pattern
    if not (m.affine and m.track_running_stats):
        return Miss("bn_train", "BatchNorm without affine parameters or running statistics")
    return Hit("bn_train", n, bn_train_site(scope.ctx.bn_act()), (N.x_of(n), Attr(n.target)))
