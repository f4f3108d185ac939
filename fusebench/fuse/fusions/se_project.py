"""se_project (train): squeeze-excitation followed by a 1x1 conv (MBConv's projection) -> one
Function that folds the gate into the conv's weights, per image:
    conv1x1(x * sigmoid(e)[n, c], W) == x_n @ (W * sigmoid(e)[n])^T
so the gated tensor (the block's widest, expanded activation) is never written, read back or
saved: forward is the mean pass and one batched GEMM over x's free (N, H*W, C) view
(channels-last; (N, C, H*W) in NCHW); backward is two batched GEMMs (dY^T x per image, which
gives the weight and gate gradients, and dx with the mean's gradient as its accumulator).
The per-image weights are (N, O, C): they pay where they are not much larger than x, H*W >= O
(`folds`; O / 2 on 2+ threads); elsewhere (EfficientNet's 5x5 stages) the site runs the SE
gate and the conv as before. Measured (benchmarks/se_project.py) at efficientnet_b0's SE + projection shapes.

Two spellings share the kernel: the zoo's MBConv (this module rule, after se_gate and bn_train
so its children are already fused) and the graph se_gate pattern, which absorbs a 1x1 conv
that is the SE's only consumer (fusions/fx_se.py). x is the SE's input: saved as a fused BN +
act output's recipe where it is one (fuse/recompute.py, consumer "se_gate")."""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from fusebench.fuse import recompute
from fusebench.fuse.binding import Pure
from fusebench.fuse.conv1x1 import channels_last, is_pointwise
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.fusions.bn_train import FusedConvBN
from fusebench.fuse.fusions.se_gate import FusedSqueezeExcite, squeeze, squeeze_bwd
from fusebench.fuse.fx.nodes import hooked
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.act.gate import gate_grad, gate_of
from fusebench.models.layers import ConvBNAct, DropPath, MBConv, SqueezeExcite


def folds(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Fold the gate into (N, O, C) per-image weights where they are no larger than x's
    (N, H*W, C), or no larger than twice x's on 2+ threads (where the batched GEMMs split
    better than the conv: the fold won there at H*W = 0.89 O, lost at 0.13 O; on 1 thread it
    lost at 0.89 O and won at 1.25 O; benchmarks/se_project.py, docs/fused.md); float32/64
    outside autocast (bmm there would mix dtypes in backward)."""
    room = 2 if torch.get_num_threads() > 1 else 1
    return (x.dim() == 4 and room * x.shape[2] * x.shape[3] >= w.shape[0]
            and x.dtype in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled(x.device.type))


def _rows(x: torch.Tensor, c: int):
    """(x as (N, H*W, c) when channels-last, free; else (N, c, H*W)), and which of the two."""
    n, _, h, w = x.shape
    if channels_last(x):
        return x.permute(0, 2, 3, 1).reshape(n, h * w, c), True
    return x.reshape(n, c, h * w), False


@functools.cache
def se_project_kernel(act: Pure, hard: float = 0.0) -> MultiOpKernel:
    """groups: reduce (w, b), expand (w, b), projection (w[, b]); x (N, C, H, W). hard: the
    gate is hardsigmoid with that slope (kernels/act/gate.py; MobileNetV3's SE), not sigmoid."""
    def fwd(x, groups):
        wp, *bp = groups[2]
        n, c, h, w = x.shape
        s, r, e = squeeze(x, groups, act)
        g = gate_of(e, hard)                                # (N, C) gate
        wn = wp.flatten(1)[None] * g[:, None, :]            # (N, O, C): the gate folded in
        X, cl = _rows(x, c)
        o = wp.shape[0]
        if cl:
            y = (torch.baddbmm(bp[0], X, wn.transpose(1, 2)) if bp
                 else torch.bmm(X, wn.transpose(1, 2))).view(n, h, w, o).permute(0, 3, 1, 2)
        else:
            y = (torch.baddbmm(bp[0][:, None], wn, X) if bp
                 else torch.bmm(wn, X)).view(n, o, h, w)
        return y, (recompute.saved(x, "se_gate"), s, r, g)

    def bwd(dy, saved, groups):
        x, s, r, g = saved
        wp, *bp = groups[2]
        n, c, h, w = x.shape
        o, wp2 = wp.shape[0], wp.flatten(1)
        X, cl = _rows(x, c)
        D = dy.permute(0, 2, 3, 1).reshape(n, h * w, o) if cl else dy.reshape(n, o, h * w)
        m = torch.bmm(D.transpose(1, 2), X) if cl else torch.bmm(D, X.transpose(1, 2))
        # m[n] = dY_n^T x_n (O, C): the weight's gradient gated per image, the gate's summed
        dwp = (m * g[:, None, :]).sum(0)
        de = (m * wp2).sum(1) * gate_grad(g, hard)          # through the gate: (N, C)
        ds, se_grads = squeeze_bwd(de, s, r, groups, act)
        ds = ds / (h * w)                                   # the mean's gradient, per (n, c)
        wn = wp2[None] * g[:, None, :]
        if cl:       # ds as the GEMM's accumulator: no pass to add it
            dx = torch.baddbmm(ds[:, None, :], D, wn).view(n, h, w, c).permute(0, 3, 1, 2)
        else:
            dx = torch.baddbmm(ds[:, :, None], wn.transpose(1, 2), D).view(n, c, h, w)
        dbp = (D.sum((0, 1)) if cl else D.sum((0, 2)),) if bp else ()
        return dx, (*se_grads, (dwp.view(wp.shape), *dbp))
    return MultiOpKernel(f"se_project[{act.impl}{',hard' if hard else ''}]", fwd, bwd)


def se_project(x, reduce: nn.Module, expand: nn.Module, proj: nn.Module, act: Pure,
               hard: float = 0.0):
    """proj(x * sigmoid(expand(act(reduce(mean(x)))))) with the gate in proj's weights
    (hard: hardsigmoid)."""
    return run_ops(se_project_kernel(act, hard), x, ((reduce.weight, reduce.bias),
                                               (expand.weight, expand.bias),
                                               (proj.weight, proj.bias)))


def _after_conv(block: nn.Module, c, res=None):
    """The projection block's BN (+ act) on its conv's output c [+ the block's residual]."""
    if isinstance(block, FusedConvBN):
        return block.after_conv(c, res)
    y = block.act(block.bn(c))
    return y if res is None else y + res


def _drops_nothing(dp: nn.Module) -> bool:
    """The block's drop path is the identity in this call (rate 0, or not training): its
    residual add may go into the projection's BN kernel."""
    return isinstance(dp, nn.Identity) or (
        type(dp) is DropPath and (dp.drop_prob == 0.0 or not dp.training))


class FusedMBConv(FusedModule):
    """MBConv with its SE and projection conv in one se_project Function where it `folds`;
    the same children under the same names (already fused by the earlier rules). The skip's
    add runs in the projection's BN kernel (bn_train's with a residual) where the drop path
    drops nothing."""
    fusion = "se_project"

    def __init__(self, src: MBConv, act: Pure):
        super().__init__()
        self.conv_pw, self.conv_dw, self.se = src.conv_pw, src.conv_dw, src.se
        self.conv_pwl, self.drop_path, self.has_skip = src.conv_pwl, src.drop_path, src.has_skip
        self._act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_dw(self.conv_pw(x))
        proj = self.conv_pwl.conv
        # the skip's add in the projection's BN write pass (as the graph bn_add_act site runs
        # it) where nothing is dropped
        res = x if self.has_skip and _drops_nothing(self.drop_path) else None
        if folds(h, proj.weight):
            y = _after_conv(self.conv_pwl, se_project(h, self.se.conv_reduce,
                                                      self.se.conv_expand, proj, self._act), res)
        elif isinstance(self.conv_pwl, FusedConvBN):
            y = self.conv_pwl(self.se(h), res)
        else:
            y = _after_conv(self.conv_pwl, self.conv_pwl.conv(self.se(h)), res)
        if res is not None:
            return y
        return x + self.drop_path(y) if self.has_skip else y


def _plain_se(se: nn.Module) -> bool:
    return isinstance(se, FusedSqueezeExcite) or (
        type(se) is SqueezeExcite and type(se.act) is nn.SiLU and type(se.gate) is nn.Sigmoid)


@register_fusion("se_project", MBConv, benches=("train",))
def se_project_rule(m: MBConv, ctx: FuseContext):
    """MBConv's SE + 1x1 projection -> one Function, the gate folded into the conv's weights."""
    pwl = m.conv_pwl
    if not (_plain_se(m.se) and type(pwl) in (ConvBNAct, FusedConvBN)
            and is_pointwise(pwl.conv)
            and isinstance(getattr(pwl, "act", nn.Identity()), nn.Identity)):
        return None
    if any(hooked(mod) for mod in (m.se, pwl, pwl.conv)):
        ctx.notes.append(("not_fused", "se_project: a hook on the SE or the projection"))
        return None
    return FusedMBConv(m, ctx.act("silu"))


__all__ = ["FusedMBConv", "folds", "se_project", "se_project_kernel"]
