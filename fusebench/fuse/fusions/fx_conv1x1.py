"""conv1x1 (graph, train bench): a user's pointwise nn.Conv2d (1x1, stride 1, groups 1, no
padding) that no other site took -> fuse/conv1x1.py, as the zoo's fused blocks run theirs: a
GEMM on a channels-last x's free (N*H*W, C) view, forward and backward on fuse/gemm.py's
backend; on NCHW x F.conv2d itself (the per-image GEMMs lost there). Tried in the graph pass's
second sweep, after every other pattern has seen the whole graph, so the MLP and SE sites keep
the convs they absorb: what is left is e.g. torchvision's Conv2dNormActivation expand and
project convs, whose BN + act the bn_act site fused."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.conv1x1 import conv1x1
from fusebench.fuse.fusions.fx_bn_act import SITE_NAME as BN_ACT_SITE_NAME
from fusebench.fuse.fusions.fx_bn_add_act import SITE_NAME as BN_ADD_ACT_SITE_NAME
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Site, register_pattern
from fusebench.fuse.rule import computes_as

SITE = Site("fused_conv1x1", conv1x1)


@register_pattern("conv1x1", benches=("train",), sweep=1)
def pointwise_conv(n, scope):
    """A pointwise nn.Conv2d -> a GEMM on channels-last views (fuse/conv1x1.py)."""
    m = N.module(n) if N.op(n) == "conv2d" else None
    if m is None or not computes_as(m, nn.Conv2d) or N.not_pointwise(m) \
            or not _into_batch_norm(n):
        return None                 # not a candidate: other convs are aten's (or dwconv's)
    bias = Attr(f"{n.target}.bias") if m.bias is not None else None
    return Hit("conv1x1", n, SITE, (N.x_of(n), Attr(f"{n.target}.weight"), bias))


def _into_batch_norm(n) -> bool:
    """n's only use is a BatchNorm, plain or inside a fused BN + act site (with a residual or
    not): a conv-BN network,
    whose activations fused mode runs channels-last (fuse/layout.py), where the GEMM pays. A 1x1
    conv elsewhere (before a LayerNorm, in an MLP another pattern declined) keeps aten's conv."""
    u = N.single_user(n)
    return u is not None and (N.op(u) == "batch_norm" or (
        isinstance(u.target, Site) and u.target.__name__ in BN_SITES))


BN_SITES = (BN_ACT_SITE_NAME, BN_ADD_ACT_SITE_NAME)     # the sites a conv's BN may be inside
