"""conv_bn_fold_seq (infer only): Conv2d followed by BatchNorm2d inside an nn.Sequential (user
models) -> the folded conv, the BatchNorm dropped."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.fusions.conv_bn_fold import FoldedConvAct, fold_conv_bn
from fusebench.fuse.rule import FuseContext, register_fusion


@register_fusion("conv_bn_fold_seq", nn.Sequential, benches=("infer",))
def fold_seq(m: nn.Sequential, ctx: FuseContext):
    """nn.Sequential(..., Conv2d, BatchNorm2d, ...) -> folded conv, BN dropped (user models)."""
    mods, out, i, hit = list(m), [], 0, False
    while i < len(mods):
        if (i + 1 < len(mods) and type(mods[i]) is nn.Conv2d and type(mods[i + 1]) is
                nn.BatchNorm2d and mods[i + 1].track_running_stats):
            out.append(FoldedConvAct(fold_conv_bn(mods[i], mods[i + 1]), nn.Identity()))
            i, hit = i + 2, True
        else:
            out.append(mods[i])
            i += 1
    return nn.Sequential(*out) if hit else None
