"""bn_train (train only): a training-mode BatchNorm with no activation after it (the zoo's
ConvBNAct(act=False): MBConv's projection) -> the bn_act kernel with the identity activation,
op BN (weight, bias): one statistics pass + one write pass forward, two passes backward, saving
the BN input and the (C,) statistics as aten's batch norm does. The kernel's forward +
backward measured 1.3-2.8x aten's batch norm's at EfficientNet shapes, both layouts
(docs/fused.md, "Recompute instead of save"). Without the kernel (another device or dtype, or
unavailable): aten's batch norm, through the same Function (bn_silu.train_bn_act). The
enclosing MBConv may hand it its skip (forward's `res`): added in the kernel's write pass."""
from __future__ import annotations

import torch
import torch.nn as nn

from fusebench.fuse.binding import BnActImpl, Pure
from fusebench.fuse.conv1x1 import run_conv
from fusebench.fuse.fusions.bn_silu import train_bn_act
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import ConvBNAct

IDENTITY = Pure("identity", lambda z: z, lambda dy, z: dy)


class FusedConvBN(FusedModule):
    """conv -> MultiOpFunction[BatchNorm (weight, bias)] while training; eager BN otherwise."""
    fusion = "bn_train"

    def __init__(self, src: ConvBNAct, impl: BnActImpl | None):
        super().__init__()
        self.conv, self.bn, self._impl = src.conv, src.bn, impl

    def forward(self, x: torch.Tensor, res: torch.Tensor | None = None) -> torch.Tensor:
        return self.after_conv(run_conv(self.conv, x), res)  # 1x1: a GEMM on channels-last

    def after_conv(self, c: torch.Tensor, res: torch.Tensor | None = None) -> torch.Tensor:
        """The BN on the conv's output c (se_project computes c itself) [+ res, the enclosing
        block's residual, added in the kernel's write pass]."""
        bn = self.bn
        if not (bn.training and bn.track_running_stats and bn.affine):
            return bn(c) if res is None else bn(c) + res
        return train_bn_act(bn, c, self._impl, IDENTITY, "identity", "bn_train", residual=res)


@register_fusion("bn_train", ConvBNAct, benches=("train",))
def bn_train(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct without an activation -> BN in one Function on the bn_act kernel."""
    if type(m.act) is not nn.Identity or type(m.bn) is not nn.BatchNorm2d:
        return None
    return FusedConvBN(m, ctx.bn_act())
