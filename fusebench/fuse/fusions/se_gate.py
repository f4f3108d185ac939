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


def _fc(v, w, b):
    """A 1x1 conv's or Linear's (w, b) on (N, C) rows."""
    return torch.addmm(b, v, w.flatten(1).t())


def squeeze(x, groups, act: Pure):
    """(s, r, e): x's (N, C) means, the reduce's output (act's input) and the expand's gate
    logits; groups start with reduce (w, b), expand (w, b), 1x1 convs or Linears. Matrix
    products on the means: as 1x1 convs on (N, C, 1, 1) oneDNN took 0.1-0.5 ms a call, forward
    and backward, for work of a few microseconds (0.5 ms of fwd + bwd saved per site at
    efficientnet_b0's 5x5 stages, 2 threads)."""
    (wr, br), (we, be) = groups[:2]
    s = x.mean((2, 3))
    r = _fc(s, wr, br)
    return s, r, _fc(act.fwd(r), we, be)


def squeeze_bwd(de, s, r, groups, act: Pure):
    """squeeze's backward from the logits' gradient de (N, C): (ds, the means' gradient;
    ((dwr, dbr), (dwe, dbe)))."""
    (wr, _), (we, _) = groups[:2]
    dr = act.bwd(de @ we.flatten(1), r)
    return dr @ wr.flatten(1), (((dr.t() @ s).view(wr.shape), dr.sum(0)),
                                ((de.t() @ act.fwd(r)).view(we.shape), de.sum(0)))


@functools.cache
def se_kernel(gate: Pure, act: Pure) -> MultiOpKernel:
    """groups: reduce (w, b), expand (w, b); the gate's x-sized work is gate's impl."""
    def fwd(x, groups):
        s, r, e = squeeze(x, groups, act)
        # x: rebuilt in backward where a fused BN + act produced it (fuse/recompute.py)
        return gate.fwd(x, e[:, :, None, None]), (recompute.saved(x, "se_gate"), s, r, e)

    def bwd(dy, saved, groups):
        x, s, r, e = saved
        dx, de = gate.bwd(dy, x, e[:, :, None, None])
        ds, grads = squeeze_bwd(de.reshape(e.shape), s, r, groups, act)
        # the mean's backward spreads ds over H*W: added in place (dx is the gate's fresh
        # output), one pass and no second x-sized allocation
        dx = dx.add_((ds / (x.shape[2] * x.shape[3]))[:, :, None, None])
        return dx, grads
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
