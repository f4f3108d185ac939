"""bn_silu (train only): training-mode BatchNorm + SiLU in one Function, op BN (weight, bias).
Saves the BN input and the (C,) statistics; the BN output SiLU's backward needs is recomputed
(one addcmul pass). aten's batch norm updates the running statistics exactly as eager does."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.binding import Pure
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import ConvBNAct


def bn_silu_kernel(silu: Pure, running_mean, running_var, momentum: float,
                   eps: float, prefix: str = "bn_silu") -> MultiOpKernel:
    """`silu` may be any pure activation pair (the graph bn_act fusion passes relu / gelu)."""
    def fwd(c, groups):
        (w, b), = groups
        y, mean, invstd = torch.ops.aten.native_batch_norm(
            c, w, b, running_mean, running_var, True, momentum, eps)
        return silu.fwd(y), (c, mean, invstd)

    def bwd(dy, saved, groups):
        (c, mean, invstd), ((w, b),) = saved, groups
        scale = invstd * w                                  # (C,): y = c * scale + shift
        shift = b - mean * scale
        y = torch.addcmul(shift[:, None, None], c, scale[:, None, None])
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(
            silu.bwd(dy, y), c, w, None, None, mean, invstd, True, 0.0, (True, True, True))
        return dx, ((dw, db),)
    return MultiOpKernel(f"{prefix}[{silu.impl}]", fwd, bwd)


class FusedConvBNSiLU(FusedModule):
    """conv -> MultiOpFunction[BatchNorm (weight, bias) + SiLU] while training; eager BN
    otherwise."""
    fusion = "bn_silu"

    def __init__(self, src: ConvBNAct, silu: Pure):
        super().__init__()
        self.conv, self.bn, self._silu = src.conv, src.bn, silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv(x)
        bn = self.bn
        if not (bn.training and bn.track_running_stats and bn.affine):
            return F.silu(bn(c))
        bn.num_batches_tracked.add_(1)       # as nn.BatchNorm2d.forward does
        m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
        kernel = bn_silu_kernel(self._silu, bn.running_mean, bn.running_var, m, bn.eps)
        return run_ops(kernel, c, ((bn.weight, bn.bias),))


@register_fusion("bn_silu", ConvBNAct, benches=("train",))
def bn_silu(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct with SiLU -> BN+SiLU in one Function that keeps only the BN input."""
    if type(m.act) is not nn.SiLU or type(m.bn) is not nn.BatchNorm2d:
        return None
    return FusedConvBNSiLU(m, ctx.act("silu"))
