"""conv_bn_fold (infer only): ConvBNAct -> one conv with BatchNorm's running statistics folded
into its weight and bias, then the activation. Done on the inference copy, never in place."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import ConvBNAct


class FoldedConvAct(FusedModule):
    """Inference: conv with BatchNorm folded into its weight and bias, then the activation."""
    fusion = "conv_bn_fold"

    def __init__(self, conv: nn.Conv2d, act: nn.Module):
        super().__init__()
        self.conv, self.act = conv, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new conv equal to bn(conv(x)) with bn's running statistics (eval mode)."""
    fused = copy.deepcopy(conv)
    scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps) if bn.affine else \
        torch.rsqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    shift = bn.bias if bn.affine else torch.zeros_like(bn.running_mean)
    fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
    fused.bias = nn.Parameter((bias - bn.running_mean) * scale + shift)
    return fused


@register_fusion("conv_bn_fold", ConvBNAct, benches=("infer",))
def fold(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct -> one conv with BatchNorm folded in (+ act), inference only."""
    return FoldedConvAct(fold_conv_bn(m.conv, m.bn), m.act)
