"""bn_silu (train only): training-mode BatchNorm + SiLU in one Function, op BN (weight, bias).
Saves the BN input and the (C,) statistics, never the BN output. With the bn_act kernel bound
(ctx.bn_act(): the C++ kernel on CPU) forward is one statistics pass and one write pass, and
backward recomputes the BN output and act' on the fly in its two passes. Otherwise (another
device or dtype, or the kernel unavailable) aten's batch norm + the act pair, backward
recomputing the BN output with addcmul. Both update the running statistics as eager does."""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.binding import BnActImpl, Pure
from fusebench.fuse.conv1x1 import run_conv
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.recompute import tag
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.models.layers import ConvBNAct


def bn_affine(c: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """c * scale + shift per channel, in c's dtype: under autocast c is bf16/fp16 and the (C,)
    scale and shift fp32, and batch norm returns c's dtype there (so must its recomputation,
    or a bf16 backward is handed fp32 tensors)."""
    y = torch.addcmul(shift[:, None, None], c, scale[:, None, None])
    return y if y.dtype == c.dtype else y.to(c.dtype)


def aten_bn_act_kernel(silu: Pure, running_mean, running_var, momentum: float,
                       eps: float, prefix: str = "bn_silu", stats: dict | None = None
                       ) -> MultiOpKernel:
    """aten's batch norm + the act pair; backward recomputes the BN output (addcmul) for the
    act's backward, then aten's batch norm backward. `silu` may be any pure activation pair
    (the graph bn_act fusion passes relu / gelu). `stats` (if given) receives mean / invstd."""
    def fwd(c, groups):
        (w, b), = groups
        y, mean, invstd = torch.ops.aten.native_batch_norm(
            c, w, b, running_mean, running_var, True, momentum, eps)
        if stats is not None:
            stats.update(mean=mean, invstd=invstd)
        return silu.fwd(y), (c, mean, invstd)

    def bwd(dy, saved, groups):
        (c, mean, invstd), ((w, b),) = saved, groups
        scale = invstd * w                                  # (C,): y = c * scale + shift
        shift = b - mean * scale
        y = bn_affine(c, scale, shift)
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(
            silu.bwd(dy, y), c, w, None, None, mean, invstd, True, 0.0, (True, True, True))
        return dx, ((dw, db),)
    return MultiOpKernel(f"{prefix}[{silu.impl}]", fwd, bwd)


def bn_act_kernel(impl: BnActImpl, act: str, running_mean, running_var, momentum: float,
                  eps: float, prefix: str = "bn_silu", stats: dict | None = None
                  ) -> MultiOpKernel:
    """The bn_act kernel (kernels/bn_act) with activation `act` (its ACT_CODES' names);
    `stats` (if given) receives mean / invstd."""
    def fwd(c, groups):
        (w, b), = groups
        y, mean, invstd = impl.forward(c, w, b, running_mean, running_var, momentum, eps, act)
        if stats is not None:
            stats.update(mean=mean, invstd=invstd)
        return y, (c, mean, invstd)

    def bwd(dy, saved, groups):
        (c, mean, invstd), ((w, b),) = saved, groups
        dx, dw, db = impl.backward(dy, c, w, b, mean, invstd, act)
        return dx, ((dw, db),)
    return MultiOpKernel(f"{prefix}[bn_act_{impl.name}:{act}]", fwd, bwd)


def train_bn_act(bn: nn.BatchNorm2d, c: torch.Tensor, impl: BnActImpl | None, pure: Pure,
                 act: str | None, prefix: str) -> torch.Tensor:
    """One training-mode BN + act call: the bound kernel where it computes this c and act
    (the node's kernel name says which ran), else aten's sequence with `pure`. The output is
    tagged with how to rebuild it from c and the statistics (fuse/recompute.py): a consumer
    such as the fused depthwise conv saves those instead of keeping the output."""
    bn.num_batches_tracked.add_(1)       # as nn.BatchNorm2d.forward does
    m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    stats: dict = {}
    if impl is not None and act is not None and impl.runs_on(c):
        kernel = bn_act_kernel(impl, act, bn.running_mean, bn.running_var, m, bn.eps, prefix,
                               stats)
        rebuild = functools.partial(_kernel_rebuild, impl.apply, act)
    else:
        if impl is not None:   # e.g. bf16 under autocast: aten runs, and says so (an event)
            warnings.warn(f"{prefix}: the bn_act {impl.name} kernel does not take this input "
                          f"({c.dtype}, {c.dim()}-D, on {c.device}); ran aten's batch norm "
                          f"+ {pure.impl}")
        kernel = aten_bn_act_kernel(pure, bn.running_mean, bn.running_var, m, bn.eps, prefix,
                                    stats)
        rebuild = functools.partial(_aten_rebuild, pure.fwd)
    y = run_ops(kernel, c, ((bn.weight, bn.bias),))
    # the (C,) parameters are copied (tiny): the rebuild must not see a later in-place update,
    # nor an FSDP-freed parameter storage
    return tag(y, prefix, (c, stats["mean"], stats["invstd"], bn.weight.detach().clone(),
                           bn.bias.detach().clone()), rebuild)


def _kernel_rebuild(apply, act: str, c, mean, invstd, w, b) -> torch.Tensor:
    return apply(c, w, b, mean, invstd, act)


def _aten_rebuild(fwd, c, mean, invstd, w, b) -> torch.Tensor:
    scale = invstd * w                                      # as aten_bn_act_kernel's backward
    return fwd(bn_affine(c, scale, b - mean * scale))


class FusedConvBNSiLU(FusedModule):
    """conv -> MultiOpFunction[BatchNorm (weight, bias) + SiLU] while training; eager BN
    otherwise."""
    fusion = "bn_silu"

    def __init__(self, src: ConvBNAct, silu: Pure, impl: BnActImpl | None):
        super().__init__()
        self.conv, self.bn, self._silu, self._impl = src.conv, src.bn, silu, impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = run_conv(self.conv, x)               # a 1x1 conv: a GEMM on channels-last
        bn = self.bn
        if not (bn.training and bn.track_running_stats and bn.affine):
            return F.silu(bn(c))
        return train_bn_act(bn, c, self._impl, self._silu, "silu", "bn_silu")


@register_fusion("bn_silu", ConvBNAct, benches=("train",))
def bn_silu(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct with SiLU -> BN+SiLU in one Function that keeps only the BN input."""
    if type(m.act) is not nn.SiLU or type(m.bn) is not nn.BatchNorm2d:
        return None
    return FusedConvBNSiLU(m, ctx.act("silu"), ctx.bn_act())
