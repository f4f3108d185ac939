"""patchify (graph, train bench): an nn.Conv2d whose kernel equals its stride (> 1), without
padding or groups -> fuse/patchify.py: on channels-last x one GEMM over the gathered patches
where it races faster than aten's conv, forward and backward. ViT's and Swin's patch
embeddings, the official ConvNeXt's and ours stem and downsamples. Tried in the second sweep,
after every other pattern has seen the whole graph."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse import patchify
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.rule import computes_as

SITE = Site("fused_patchify", patchify.conv)


@register_pattern("patchify", benches=("train",), sweep=1)
def patch_conv(n, scope):
    """A conv with kernel == stride -> a GEMM on channels-last patches (fuse/patchify.py)."""
    m = N.module(n) if N.op(n) == "conv2d" else None
    if m is None or not computes_as(m, nn.Conv2d) or m.kernel_size != m.stride \
            or m.kernel_size == (1, 1):
        return None                 # not a candidate (1x1 convs: the conv1x1 pattern's)
    why = _not_patches(m)
    if why:
        return Miss("patchify", why)
    bias = Attr(f"{n.target}.bias") if m.bias is not None else None
    return Hit("patchify", n, SITE, (N.x_of(n), Attr(f"{n.target}.weight"), bias))


def _not_patches(m: nn.Conv2d) -> str | None:
    """Why a kernel == stride conv is not one GEMM over disjoint patches; None if it is."""
    if m.groups != 1:
        return f"{m.groups} groups"
    if m.padding not in ((0, 0), "valid"):
        return f"padding {m.padding}"
    if m.dilation != (1, 1):
        return f"dilation {m.dilation}"
    return None
