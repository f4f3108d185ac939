"""conv_bn_fold (graph, infer bench): nn.Conv2d -> nn.BatchNorm2d anywhere in the traced code
(torchvision's Conv2dNormActivation, a user's own block) -> the folded conv (a FoldedConvAct),
the BN replaced by an Identity; a BN subclass's F.batch_norm (timm's BatchNormAct2d, which
also holds the activation) is dropped from the graph instead. Done on the inference copy
only (fuse_in_order deep-copies it), never in place."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.fusions.conv_bn_fold import FoldedConvAct, fold_conv_bn
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Hit, Miss, Site, register_pattern
from fusebench.fuse.rule import computes_as


def _set(root: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, new)


FOLDED = Site("folded_into_conv", lambda y: y)   # where a functional BN was: the conv did it


@register_pattern("conv_bn_fold_fx", benches=("infer",))
def fold(n, scope):
    """Conv2d -> BatchNorm2d (eval statistics) -> one conv with BN folded in (inference)."""
    conv = N.x_of(n) if N.op(n) == "batch_norm" else None
    if conv is None or N.module(conv) is None or not computes_as(N.module(conv), nn.Conv2d):
        return None
    call = N.batch_norm_call(n, scope.m)
    if isinstance(call, str):
        return Miss("conv_bn_fold", call)
    bn = call.module
    if not bn.track_running_stats or bn.training:
        return Miss("conv_bn_fold", "BatchNorm without running statistics or in training mode")
    calls = [m for m in scope.gm.graph.nodes if m.op == "call_module"
             and m.target in (conv.target, n.target)]
    if len(conv.users) != 1 or len(calls) != 1 + (n.op == "call_module"):
        return Miss("conv_bn_fold", "the conv output or a module is used more than once")
    root, folded = scope.m, FoldedConvAct(fold_conv_bn(N.module(conv), bn), nn.Identity())
    if n.op != "call_module":     # F.batch_norm inside a subclass that also holds its act
        return Hit("conv_bn_fold", n, FOLDED, (conv,), (n,),
                   mutate=lambda: _set(root, conv.target, folded))
    gone = nn.Identity()                         # where the BN was: nothing left to fuse

    def mutate():
        _set(root, conv.target, folded)
        _set(root, n.target, gone)
        scope.ctx.covered.add(id(gone))
    return Hit("conv_bn_fold", n, None, mutate=mutate)
