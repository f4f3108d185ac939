"""bn_train (graph, train bench): a user's BatchNorm2d with no activation fused after it
(torchvision's Conv2dNormActivation(activation_layer=None): MBConv's projection) -> the bn_act
kernel with the identity activation, as the zoo's bn_train runs it (fusions/bn_train.py): one
statistics pass + one write pass forward, two passes backward, saving the BN input and the
(C,) statistics. Tried in the graph pass's second sweep, so bn_act keeps every BN it fuses
with an activation. A BN in eval mode at call time runs aten's batch norm. A BatchNorm1d runs
on its input viewed as an image (bn_silu.as_image; after a Linear: no candidate)."""
from __future__ import annotations

import torch.nn.functional as F

from fusebench.fuse.binding import BnActImpl
from fusebench.fuse.fusions.bn_silu import as_image, one_d_miss, train_bn_act
from fusebench.fuse.fusions.bn_train import IDENTITY
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

SITE_NAME = "fused_bn_train"


def bn_train_site(impl: BnActImpl | None) -> Site:
    def run(c, bn):
        if bn.training:
            x, back = as_image(c)
            return back(train_bn_act(bn, x, impl, IDENTITY, "identity", "bn_train"))
        # the norm alone: calling bn would also run a subclass's activation (BatchNormAct2d)
        return F.batch_norm(c, bn.running_mean, bn.running_var, bn.weight, bn.bias, False,
                            0.0, bn.eps)
    return Site(SITE_NAME, run)


@register_pattern("bn_train_fx", benches=("train",), sweep=1)
def bn_train(n, scope):
    """BatchNorm2d / BatchNorm1d with no activation fused after it -> one Function on the
    bn_act kernel."""
    call = N.batch_norm_call(n, scope.m, one_d=True)
    if call is None or (not isinstance(call, str) and one_d_miss(call.module, N.op(N.x_of(n)))):
        # SyncBatchNorm...: no candidate; a BatchNorm1d on a Linear's rows neither (where an
        # act follows, bn_act's note says why it stays aten's)
        return None
    if isinstance(call, str):
        return Miss("bn_train", call)
    if not (call.module.affine and call.module.track_running_stats):
        return Miss("bn_train", N.NO_AFFINE_OR_STATS)
    return Hit("bn_train", n, bn_train_site(scope.ctx.bn_act()), (N.x_of(n), Attr(call.path)))
