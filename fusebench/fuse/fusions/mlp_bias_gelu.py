"""mlp_bias_gelu: ConvMlp (ConvNeXt's MLP) -> fc1 without bias, then bias + GELU + fc2 in one
Function, ops bias (fc1.bias) and fc2 (weight, bias). Saves only the pre-bias fc1 output h0
(N, 4C, H, W); the GELU output fc2's weight gradient needs is recomputed in backward, by the
same kernel call as the GELU's backward where the bound impl has one (fx_mlp.mlp_backward)."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from fusebench.fuse import mlp_blocks
from fusebench.fuse.binding import Pure
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.conv1x1 import conv1x1
from fusebench.fuse.fusions.fx_mlp import FC, BiasAct, mlp_backward
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import ConvMlp


@functools.cache
def bias_gelu_fc2_kernel(act: Pure, approximate: str) -> MultiOpKernel:
    ba = BiasAct(act, act, approximate, cdim=1)             # b1 always there: bias_gelu's path

    def fwd(h0, groups):
        (b1,), (w2, b2) = groups
        return conv1x1(act.fwd(h0, b1, approximate), w2, b2), (h0,)

    def bwd(dy, saved, groups):
        (h0,), ((b1,), (w2, _)) = saved, groups   # fc2 has a bias: the rule asks
        dh, db1, dw2, db2 = mlp_backward(ba, FC["conv2d"].bwd, dy, h0, b1, w2, True)
        return dh, ((db1,), (dw2, db2))
    return MultiOpKernel(f"bias_gelu_fc2[{act.impl},{approximate}]", fwd, bwd)


class FusedConvMlp(FusedModule):
    """fc1 (no bias) -> MultiOpFunction[bias+GELU (fc1.bias), fc2 (weight, bias)]."""
    fusion = "mlp_bias_gelu"

    def __init__(self, src: ConvMlp, act: Pure):
        super().__init__()
        self.fc1, self.fc2 = src.fc1, src.fc2
        self.kernel = bias_gelu_fc2_kernel(act, src.act.approximate)
        self.impl = mlp_blocks.binds(act)
        self.blocks = mlp_blocks.kernel(self.impl, True, src.act.approximate) if self.impl \
            else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        w1, b1, w2, b2 = self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias
        if self.blocks is not None and mlp_blocks.takes(self.impl, x, True, w1, b1, w2, b2):
            return run_ops(self.blocks, x, ((w1, b1), (w2, b2), ()))
        h0 = conv1x1(x, w1)                                  # (N, 4C, H, W), bias in the fusion
        return run_ops(self.kernel, h0, ((b1,), (w2, b2)))


@register_fusion("mlp_bias_gelu", ConvMlp)
def mlp(m: ConvMlp, ctx: FuseContext):
    """ConvMlp -> fc1 without bias, then bias+GELU+fc2 in one Function (keeps fc1's output)."""
    if type(m.act) is not nn.GELU or (m.drop.p > 0 and ctx.bench == "train"):
        return None
    if m.fc2.kernel_size != (1, 1) or m.fc2.groups != 1 or m.fc1.bias is None \
            or m.fc2.bias is None:
        return None
    return FusedConvMlp(m, ctx.act("bias_gelu"))
