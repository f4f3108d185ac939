"""bn_silu (train only): training-mode BatchNorm + SiLU in one Function, op BN (weight, bias).
Saves the BN input and the (C,) statistics, never the BN output. With the bn_act kernel bound
(ctx.bn_act(): the C++ kernel on CPU) forward is one statistics pass and one write pass, and
backward recomputes the BN output and act' on the fly in its two passes. Otherwise (another
device or dtype, or the kernel unavailable) aten's batch norm + the act pair, backward
recomputing the BN output with addcmul. Both update the running statistics as eager does.
train_bn_act also takes a residual r, y = act(BN(x) + r) (a ResNet block's end: the graph
bn_add_act site), with r's gradient from the same backward."""
from __future__ import annotations

import functools
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.binding import BnActImpl, Pure
from fusebench.fuse.conv1x1 import run_conv
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.fx.residual import run_ops_residual
from fusebench.fuse.recompute import tag
from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.bn_act.cpu import FROM_OUTPUT
from fusebench.kernels.bn_act.reference import ACTS
from fusebench.models.layers import ConvBNAct


def bn_affine(c: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """c * scale + shift per channel, in c's dtype: under autocast c is bf16/fp16 and the (C,)
    scale and shift fp32, and batch norm returns c's dtype there (so must its recomputation,
    or a bf16 backward is handed fp32 tensors)."""
    y = torch.addcmul(shift[:, None, None], c, scale[:, None, None])
    return y if y.dtype == c.dtype else y.to(c.dtype)


def residual_keep(act: str | None, y: torch.Tensor, res: torch.Tensor) -> tuple:
    """What a BN + add + act Function keeps for act' of s = BN(x) + res, besides the BN's own
    tensors: y = act(s) for ReLU / ReLU6 (act' reads off it; eager's ReLU keeps y too, and the
    next block's conv its input), nothing for the identity (act' is 1), else res. Keeping res
    where y would do cost 0.07x more activation bytes in a ResNet-50 step: a downsample
    branch's output, which nothing else keeps."""
    return (y,) if act in FROM_OUTPUT else () if act == "identity" else (res,)


def act_input(act: str | None, kept: list, z: torch.Tensor) -> torch.Tensor:
    """What the act's backward reads for s = z + res, from what residual_keep kept."""
    return kept[0] if act in FROM_OUTPUT else z if act == "identity" else z + kept[0]


def residual_grad(g: torch.Tensor, like: tuple) -> torch.Tensor:
    """The add's gradient for a residual of like = (shape, dtype): g summed over what it
    broadcast along."""
    return g.sum_to_size(like[0]).to(like[1])


def aten_bn_act_kernel(silu: Pure, running_mean, running_var, momentum: float,
                       eps: float, prefix: str = "bn_silu", stats: dict | None = None,
                       residual_act: str | None = None) -> MultiOpKernel:
    """aten's batch norm + the act pair; backward recomputes the BN output (addcmul) for the
    act's backward, then aten's batch norm backward. `silu` may be any pure activation pair
    (the graph bn_act fusion passes relu / gelu). `stats` (if given) receives mean / invstd.
    residual_act (the act's name): a residual's kernel, fwd(c, groups, res) -> act(BN(c) +
    res), keeping what residual_keep says; res's gradient is the act's."""
    like: dict = {}          # a residual call's (shape, dtype): its gradient's (it may broadcast)

    def fwd(c, groups, res=None):
        (w, b), = groups
        y, mean, invstd = torch.ops.aten.native_batch_norm(
            c, w, b, running_mean, running_var, True, momentum, eps)
        if stats is not None:
            stats.update(mean=mean, invstd=invstd)
        if res is None:
            return silu.fwd(y), (c, mean, invstd)
        like["res"] = (res.shape, res.dtype)
        out = silu.fwd(y + res)
        return out, (c, mean, invstd, *residual_keep(residual_act, out, res))

    def bwd(dy, saved, groups):
        (c, mean, invstd, *kept), ((w, b),) = saved, groups
        scale = invstd * w                                  # (C,): y = c * scale + shift
        shift = b - mean * scale
        z = bn_affine(c, scale, shift)
        g = silu.bwd(dy, act_input(residual_act, kept, z) if like else z)
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(
            g, c, w, None, None, mean, invstd, True, 0.0, (True, True, True))
        return (dx, ((dw, db),), residual_grad(g, like["res"])) if like else (dx, ((dw, db),))
    return MultiOpKernel(f"{prefix}[{silu.impl}]", fwd, bwd)


def bn_act_kernel(impl: BnActImpl, act: str, running_mean, running_var, momentum: float,
                  eps: float, prefix: str = "bn_silu", stats: dict | None = None,
                  residual: bool = False) -> MultiOpKernel:
    """The bn_act kernel (kernels/bn_act) with activation `act` (its ACT_CODES' names);
    `stats` (if given) receives mean / invstd. residual: fwd(c, groups, res), res of c's shape
    and dtype -> act(BN(c) + res) in the kernel's passes, keeping what residual_keep says;
    res's gradient from the kernel's backward (dy itself for the identity)."""
    def fwd(c, groups, res=None):
        (w, b), = groups
        y, mean, invstd = impl.forward(c, w, b, running_mean, running_var, momentum, eps, act,
                                       residual=res)
        if stats is not None:
            stats.update(mean=mean, invstd=invstd)
        return y, (c, mean, invstd, *(residual_keep(act, y, res) if residual else ()))

    def bwd(dy, saved, groups):
        (c, mean, invstd, *kept), ((w, b),) = saved, groups
        if not residual or act == "identity":
            dx, dw, db = impl.backward(dy, c, w, b, mean, invstd, act)
            return (dx, ((dw, db),), dy) if residual else (dx, ((dw, db),))
        which = "output" if act in FROM_OUTPUT else "residual"
        dx, dw, db, dr = impl.backward(dy, c, w, b, mean, invstd, act, **{which: kept[0]})
        return dx, ((dw, db),), dr
    return MultiOpKernel(f"{prefix}[bn_act_{impl.name}:{act}]", fwd, bwd)


# measured (forty-fifth session, fwd + bwd, 2 / 1 threads): 0.97-1.10x aten's at 256-1024 rows
# of 256-512, 0.58x at 32 rows (the site's own ~90 us a call); over (N, C, L) 1.26-2.47x
LINEAR_ROWS = ("a BatchNorm1d on a Linear's (N, C) rows: aten's batch norm + act is as fast "
               "there (the kernel 0.97-1.10x it, slower on small batches)")


def as_image(c: torch.Tensor):
    """(c as an (N, C, H, W) image, a function giving a result of the image's shape c's shape
    back) for a BatchNorm1d's input: (N, C, L) as (N, C, L, 1), which keeps c's layout (planes
    of L, or channels-last rows where c is a transposed (N, L, C)); (N, C) as (1, C, N, 1),
    channels-last rows of C: as (N, C, 1, 1) the kernel ran N * C planes of one value (0.27x
    aten's batch norm + ReLU at 256 x 512). Statistics over (N, H, W) are the batch norm's over
    N [and L] either way. An image goes through as it is."""
    if c.dim() == 3:
        return c.unsqueeze(-1), lambda y: y.squeeze(-1)
    if c.dim() == 2:    # views both ways (indexing's backward would write zeros and copy)
        return c.t().unsqueeze(0).unsqueeze(-1), lambda y: y.squeeze(-1).squeeze(0).t()
    return c, _same


def _same(y):
    return y


def one_d_miss(bn: nn.Module, producer: str | None) -> str | None:
    """Why a BatchNorm1d whose input comes from op `producer` is not fused (None: it is; a
    BatchNorm2d always is): on a Linear's (N, C) rows the kernel does not pay."""
    return LINEAR_ROWS if isinstance(bn, nn.BatchNorm1d) and producer == "linear" else None


def train_bn_act(bn: nn.BatchNorm2d, c: torch.Tensor, impl: BnActImpl | None, pure: Pure,
                 act: str | None, prefix: str, residual: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """One training-mode BN + act call, act(BN(c) [+ residual]): the bound kernel where it
    computes this c, act and residual (the node's kernel name says which ran), else aten's
    sequence with `pure`. The output is tagged with how to rebuild it from c, the statistics
    [and the residual] (fuse/recompute.py): a consumer such as the fused depthwise conv saves
    those instead of keeping the output."""
    bn.num_batches_tracked.add_(1)       # as nn.BatchNorm2d.forward does
    m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
    stats: dict = {}
    misfit = _residual_misfit(c, residual)
    if impl is not None and act is not None and impl.runs_on(c) and misfit is None:
        kernel = bn_act_kernel(impl, act, bn.running_mean, bn.running_var, m, bn.eps, prefix,
                               stats, residual is not None)
        rebuild = functools.partial(_kernel_rebuild, impl.apply, act)
    elif impl is not None and act is not None:
        # the kernel computes this act, but not this input (bf16 under CPU autocast, a residual
        # that broadcasts): eager's own ops, as the model wrote them. aten's sequence inside our
        # Function cast and copied around autocast: b0 under bf16 autocast took 718 ms a step
        # fused that way against eager's 658 (thirty-fourth session)
        why = misfit or f"{c.dtype}, {c.dim()}-D, on {c.device}"
        warnings.warn(f"{prefix}: the bn_act {impl.name} kernel does not take this input "
                      f"({why}); ran eager's batch norm + {pure.impl}")
        z = F.batch_norm(c, bn.running_mean, bn.running_var, bn.weight, bn.bias, True, m,
                         bn.eps)
        return ACTS[act](z if residual is None else z + residual)
    else:                      # aten's sequence asked for (--fused-bn-act aten), or an act the
        kernel = aten_bn_act_kernel(pure, bn.running_mean, bn.running_var, m, bn.eps, prefix,
                                    stats, act)          # kernel lacks: BN + act, saving less
        rebuild = functools.partial(_aten_rebuild, pure.fwd)
    groups = ((bn.weight, bn.bias),)
    y = run_ops(kernel, c, groups) if residual is None else \
        run_ops_residual(kernel, c, groups, residual)
    # the (C,) parameters are copied (tiny): the rebuild must not see a later in-place update,
    # nor an FSDP-freed parameter storage
    return tag(y, prefix, (c, stats["mean"], stats["invstd"], bn.weight.detach().clone(),
                           bn.bias.detach().clone(), *([] if residual is None else [residual])),
               rebuild)


def _residual_misfit(c: torch.Tensor, r: torch.Tensor | None) -> str | None:
    """Why the kernel cannot add residual r to BN(c) (it reads r as a tensor of c's shape and
    dtype; aten's add broadcasts and promotes), or None."""
    if r is None or (r.shape == c.shape and r.dtype == c.dtype and r.device == c.device):
        return None
    return f"a residual of {r.dtype} {tuple(r.shape)} on {r.device} added to {c.dtype} " \
           f"{tuple(c.shape)}"


def _kernel_rebuild(apply, act: str, c, mean, invstd, w, b, res=None) -> torch.Tensor:
    return apply(c, w, b, mean, invstd, act, residual=res)


def _aten_rebuild(fwd, c, mean, invstd, w, b, res=None) -> torch.Tensor:
    scale = invstd * w                                      # as aten_bn_act_kernel's backward
    z = bn_affine(c, scale, b - mean * scale)
    return fwd(z if res is None else z + res)


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
