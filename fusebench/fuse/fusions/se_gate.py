"""se_gate: SqueezeExcite -> one Function: gate(x, expand(silu(reduce(mean_hw(x))))), ops
reduce (w, b) and expand (w, b). The x-sized work is the gate's (act se_gate impl); the rest
is (N, C, 1, 1)-sized."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.binding import Pure
from fusebench.fuse import recompute
from fusebench.fuse.engine import MultiOpKernel, conv_bwd, run_ops
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import SqueezeExcite


@functools.cache
def se_gate_kernel(gate: Pure, silu: Pure) -> MultiOpKernel:
    def fwd(x, groups):
        (wr, br), (we, be) = groups
        s = x.mean((2, 3), keepdim=True)                    # (N, C, 1, 1)
        r = F.conv2d(s, wr, br)                             # (N, R, 1, 1)
        e = F.conv2d(silu.fwd(r), we, be)                   # (N, C, 1, 1) gate logits
        # x: rebuilt in backward where a fused BN + act produced it
        return gate.fwd(x, e), (recompute.saved(x, "se_gate"), s, r, e)

    def bwd(dy, saved, groups):
        x, s, r, e = saved
        (wr, br), (we, be) = groups
        dx, de = gate.bwd(dy, x, e)
        da, dwe, dbe = conv_bwd(de, silu.fwd(r), we, True)
        ds, dwr, dbr = conv_bwd(silu.bwd(da, r), s, wr, True)
        # mean's backward spreads ds over H*W: added in place (dx is the gate's fresh output),
        # one pass and no second x-sized allocation
        dx = dx.add_(ds / (x.shape[2] * x.shape[3]))
        return dx, ((dwr, dbr), (dwe, dbe))
    return MultiOpKernel(f"se_gate[{gate.impl}]", fwd, bwd)


class FusedSqueezeExcite(FusedModule):
    """MultiOpFunction[reduce (weight, bias), SiLU, expand (weight, bias), sigmoid gate]."""
    fusion = "se_gate"

    def __init__(self, src: SqueezeExcite, gate: Pure, silu: Pure):
        super().__init__()
        self.conv_reduce, self.conv_expand = src.conv_reduce, src.conv_expand
        self.kernel = se_gate_kernel(gate, silu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        return run_ops(self.kernel, x, ((self.conv_reduce.weight, self.conv_reduce.bias),
                                        (self.conv_expand.weight, self.conv_expand.bias)))


@register_fusion("se_gate", SqueezeExcite)
def se(m: SqueezeExcite, ctx: FuseContext):
    """SqueezeExcite -> one Function: reduce, SiLU, expand, sigmoid gate."""
    if type(m.act) is not nn.SiLU or type(m.gate) is not nn.Sigmoid:
        return None
    return FusedSqueezeExcite(m, ctx.act("se_gate"), ctx.act("silu"))
