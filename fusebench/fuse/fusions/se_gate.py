"""se_gate: SqueezeExcite -> one Function: gate(x, expand(silu(reduce(mean_hw(x))))), ops
reduce (w, b) and expand (w, b). The x-sized work is the gate's (act se_gate impl); the rest
is (N, C)-sized. The graph pass's se_gate pattern (fusions/fx_se.py) runs the same kernel."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from fusebench.fuse.binding import Pure
from fusebench.fuse import recompute
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import SqueezeExcite


@functools.cache
def se_kernel(gate: Pure, act: Pure) -> MultiOpKernel:
    """groups: reduce (w, b), expand (w, b), 1x1 convs or Linears. Both run as matrix products
    on the (N, C) means: as 1x1 convs on (N, C, 1, 1) oneDNN took 0.1-0.5 ms a call, forward
    and backward, for work of a few microseconds (0.5 ms of fwd + bwd saved per site at
    efficientnet_b0's 5x5 stages, 2 threads)."""
    def fwd(x, groups):
        (wr, br), (we, be) = groups
        s = x.mean((2, 3))                                        # (N, C)
        r = s @ wr.reshape(wr.shape[0], -1).t() + br              # (N, R)
        e = act.fwd(r) @ we.reshape(we.shape[0], -1).t() + be     # (N, C) gate logits
        # x: rebuilt in backward where a fused BN + act produced it (fuse/recompute.py)
        return gate.fwd(x, e[:, :, None, None]), (recompute.saved(x, "se_gate"), s, r, e)

    def bwd(dy, saved, groups):
        x, s, r, e = saved
        (wr, br), (we, be) = groups
        wr2, we2 = wr.reshape(wr.shape[0], -1), we.reshape(we.shape[0], -1)
        dx, de = gate.bwd(dy, x, e[:, :, None, None])
        de = de.reshape(e.shape)
        dr = act.bwd(de @ we2, r)
        ds = dr @ wr2
        # the mean's backward spreads ds over H*W: added in place (dx is the gate's fresh
        # output), one pass and no second x-sized allocation
        dx = dx.add_((ds / (x.shape[2] * x.shape[3]))[:, :, None, None])
        return dx, ((((dr.t() @ s).reshape(wr.shape)), dr.sum(0)),
                    ((de.t() @ act.fwd(r)).reshape(we.shape), de.sum(0)))
    return MultiOpKernel(f"se_gate[{gate.impl},{act.impl}]", fwd, bwd)


class FusedSqueezeExcite(FusedModule):
    """MultiOpFunction[reduce (weight, bias), SiLU, expand (weight, bias), sigmoid gate]."""
    fusion = "se_gate"

    def __init__(self, src: SqueezeExcite, gate: Pure, silu: Pure):
        super().__init__()
        self.conv_reduce, self.conv_expand = src.conv_reduce, src.conv_expand
        self.kernel = se_kernel(gate, silu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        return run_ops(self.kernel, x, ((self.conv_reduce.weight, self.conv_reduce.bias),
                                        (self.conv_expand.weight, self.conv_expand.bias)))


@register_fusion("se_gate", SqueezeExcite)
def se(m: SqueezeExcite, ctx: FuseContext):
    """SqueezeExcite -> one Function: reduce, SiLU, expand, sigmoid gate."""
    if type(m.act) is not nn.SiLU or type(m.gate) is not nn.Sigmoid:
        return None
    return FusedSqueezeExcite(m, ctx.act("se_gate"), ctx.act("silu"))
