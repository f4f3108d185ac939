"""Patchify convs (kernel == stride, no padding, groups 1: ViT's and Swin's patch embeddings,
ConvNeXt's stem and downsamples) as one GEMM on a channels-last x.

A channels-last x's (N, H, W, C) view holds each patch as kh runs of kw * C contiguous values,
so one copy gathers the (N * Ho * Wo, kh * kw * C) patch matrix, and the conv is that matrix
times the weight reordered to (O, kh * kw * C), on fuse/gemm.py's backend; backward is the GEMMs'
input and weight gradients and one copy back. Against oneDNN's conv, forward + backward per
call (benchmarks/patchify.py, b8, 1 and 2 threads, Intel Xeon VM): 1.02-1.39x at ConvNeXt's 2x2
downsamples (0.96x at ConvNeXt-T's first, 1 thread), 1.27-1.31x at ViT-B/16's patch
embedding, 0.61-0.82x at the 4x4 stems on 3 channels (12-value runs, and the input gathered
again for the weight gradient). Which wins is the CPU's and the shape's, so `auto` (the default)
races them per call shape, forward and backward, as fuse/gemm.py races its backends; a
forward without autograd keeps aten's conv (the copy is not paid back by a forward alone).
NCHW x, autocast and non-CPU tensors keep aten's conv."""
from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F

from fusebench.errors import UsageError
from fusebench.fuse import gemm
from fusebench.fuse.conv1x1 import channels_last
from fusebench.fuse.race import Choice, Verdicts, best_times

CHOICES = ("auto", "gemm", "conv")
RACE_REPS = 5           # timed forward + backward runs per side after the warm-up
RACE_MARGIN = 0.03      # the GEMM only where it is at least this much faster than aten's conv
_raced = Verdicts()     # (shapes, strides, dtype, grads, threads) -> the winner


def _checked(name: str) -> str:
    if name not in CHOICES:
        raise UsageError(f"patchify: '{name}': valid: {', '.join(CHOICES)}")
    return name


_choice = Choice(_checked)


def using(name: str):
    """Inside, patchify sites run `name`: the GEMM, aten's conv, or auto's race."""
    return _choice.using(name)


def aten_conv(x, w, b=None):
    return F.conv2d(x, w, b, stride=w.shape[-2:])


def _patch_view(t, kh: int, kw: int):
    """t's patches as a (N, Ho, Wo, kh, kw, C) view, the rows and columns a stride-k conv
    leaves over cut off: x's gives the patch matrix, dx's takes its gradient back."""
    n, c, h, w = t.shape
    ho, wo = h // kh, w // kw
    return t.permute(0, 2, 3, 1)[:, :ho * kh, :wo * kw].view(n, ho, kh, wo, kw, c) \
        .permute(0, 1, 3, 2, 4, 5)


def _patches(x, kh: int, kw: int):
    """(N * Ho * Wo, kh * kw * C) from channels-last x, each patch's values in (kh, kw, C)
    order: one copy."""
    return _patch_view(x, kh, kw).reshape(-1, kh * kw * x.shape[1])


def _flat(w):
    """The weight in the patches' (kh, kw, C) order: a copy, the size of w, made in forward and
    again in backward rather than saved (the saved w is the Parameter itself)."""
    return w.permute(0, 2, 3, 1).reshape(w.shape[0], -1)


def _forward(x, w, b):
    """(y, what backward keeps): the patches where x takes a gradient (x itself is then not
    kept: the same bytes as the conv's saved x); else x, which is then a model input the caller
    holds anyway, gathered again for the weight gradient."""
    kh, kw = w.shape[-2:]
    p = _patches(x, kh, kw)
    n, _, h, wd = x.shape
    y = gemm.nt(p, _flat(w), b).view(n, h // kh, wd // kw, -1).permute(0, 3, 1, 2)
    return y, (p if x.requires_grad else x)


def _backward(dy, kept, w, x_shape, needs, has_bias):
    """(dx, dw, db) for the `needs` flags of (x, w, b), from _forward's kept tensor."""
    (n, c, h, wd), (o, _, kh, kw) = x_shape, w.shape
    dy2 = dy.permute(0, 2, 3, 1).reshape(-1, o)          # a view where dy is channels-last
    dx = dw = db = None
    if needs[0]:
        new = dy.new_zeros if (h % kh or wd % kw) else dy.new_empty   # zeros: rows no patch covers
        dx = new(n, h, wd, c).permute(0, 3, 1, 2)                      # channels-last
        v = _patch_view(dx, kh, kw)
        v.copy_(gemm.nn(dy2, _flat(w)).view(v.shape))
    if needs[1]:
        p = kept if needs[0] else _patches(kept, kh, kw)
        dw = gemm.wgrad(dy2, p).view(o, kh, kw, c).permute(0, 3, 1, 2).contiguous()
    if has_bias and needs[2]:
        db = dy2.sum(0)
    return dx, dw, db


class PatchConvFunction(torch.autograd.Function):
    """aten_conv(x, w, b) as one GEMM over x's patches; saves _forward's kept tensor and w
    (the Parameter itself, not its reordered copy)."""

    @staticmethod
    def forward(ctx, x, w, b):
        y, kept = _forward(x, w, b)
        ctx.save_for_backward(kept, w)
        ctx.x_shape, ctx.has_bias = x.shape, b is not None
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        kept, w = ctx.saved_tensors
        return _backward(dy, kept, w, ctx.x_shape, ctx.needs_input_grad, ctx.has_bias)


def gemm_conv(x, w, b=None):
    """aten_conv(x, w, b) as a GEMM on channels-last x's patches (PatchConvFunction)."""
    return PatchConvFunction.apply(x, w, b)


def conv(x, w, b=None):
    """The patchify site: F.conv2d(x, w, b, stride=kernel), on the GEMM or aten's conv."""
    return gemm_conv(x, w, b) if _use_gemm(x, w, b) else aten_conv(x, w, b)


def _use_gemm(x, w, b) -> bool:
    name = _choice.name
    # under autocast the conv is cast as autocast casts convs; the Function's GEMMs would not be
    # (its backward mixed bfloat16 and float32 operands)
    if name == "conv" or x.device.type != "cpu" or not channels_last(x) \
            or torch.is_autocast_enabled("cpu"):
        return False
    if name == "gemm":
        return True
    grads = tuple(t is not None and t.requires_grad for t in (x, w, b))
    if not (torch.is_grad_enabled() and any(grads)):
        return False
    key = (tuple(x.shape), x.stride(), tuple(w.shape), x.dtype, grads, torch.get_num_threads())
    return _raced.winner(key, lambda: _race(x, w, b, grads)) == "gemm"


def _race(x, w, b, needs) -> str:
    """"gemm" or "conv": each side's forward and backward passes called directly, without
    autograd, so that nothing is recorded or saved through the caller's hooks (an activation
    checkpoint's among them) and the model's gradients are not touched. needs: which of
    (x, w, b) take a gradient."""
    bias = None if b is None else [w.shape[0]]

    def gemm_side():
        y, kept = _forward(x, w, b)
        _backward(torch.ones_like(y), kept, w, x.shape, needs, b is not None)

    def conv_side():
        y = aten_conv(x, w, b)
        torch.ops.aten.convolution_backward(torch.ones_like(y), x, w, bias, list(w.shape[-2:]),
                                            [0, 0], [1, 1], False, [0, 0], 1, list(needs))
    with torch.no_grad():
        best = best_times({"gemm": gemm_side, "conv": conv_side}, RACE_REPS)
    return "gemm" if best["gemm"] < best["conv"] * (1 - RACE_MARGIN) else "conv"


def raced() -> Counter:
    """How many call shapes auto sent to each side in this process so far."""
    return _raced.tally()


def describe_raced() -> str | None:
    """What auto chose, once calls have run (None: nothing raced)."""
    return _raced.describe("patchify", "conv shapes", {"gemm": "the GEMM", "conv": "aten's conv"})


__all__ = ["CHOICES", "aten_conv", "conv", "describe_raced", "gemm_conv", "raced", "using"]
