"""`triton`: the depthwise conv backward (dx, dweight, dbias) in Triton, K 3/5/7, stride 1/2,
zero padding K//2, NCHW or channels-last (CUDA; on CPU tensors under TRITON_INTERPRET=1). The
forward is aten's (cuDNN's depthwise forward on a GPU)."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from fusebench.kernels.registry import register_impl
from fusebench.kernels.triton_support import available, triton_cdiv, triton_next_pow2

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_P = 64            # positions per program
MAX_BLOCK_C = 32        # channels per program: BLOCK_P x BLOCK_C fp32 accumulators in registers


@functools.cache
def _kernels():
    from fusebench.kernels.dwconv import _triton_kernels
    return _triton_kernels


def _block_c(C: int) -> int:
    return min(MAX_BLOCK_C, triton_next_pow2(C))


def dwconv_triton_bwd(dy, x, weight, stride: int, bias: bool):
    """(dx in x's layout, dweight, dbias or None); partial weight sums added up by torch."""
    k = _kernels()
    N, C, H, W = x.shape
    K, P = weight.shape[-1], weight.shape[-1] // 2
    OH, OW = dy.shape[2:]
    w = weight.contiguous()
    fmt = (torch.channels_last if x.is_contiguous(memory_format=torch.channels_last)
           and not x.is_contiguous() else torch.contiguous_format)
    dx = torch.empty_like(x, memory_format=fmt)
    bc = _block_c(C)
    if dx.numel():
        grid = (triton_cdiv(H * W, BLOCK_P), N, triton_cdiv(C, bc))
        k.dwconv_dx_kernel[grid](dy, w, dx, C, H, W, OH, OW, *dy.stride(), *dx.stride(),
                                 K=K, S=stride, P=P, BLOCK_P=BLOCK_P, BLOCK_C=bc)
    NP = N * OH * OW
    progs = max(1, triton_cdiv(NP, BLOCK_P))
    part = torch.zeros(progs, K * K, C, device=x.device, dtype=torch.float32)
    partb = torch.zeros(progs, C, device=x.device, dtype=torch.float32)
    if NP and C:
        k.dwconv_dw_kernel[(progs, triton_cdiv(C, bc))](
            dy, x, part, partb, C, H, W, OH, OW, NP, *dy.stride(), *x.stride(),
            K=K, S=stride, P=P, BLOCK_P=BLOCK_P, BLOCK_C=bc)
    dw = part.sum(0).t().reshape(C, 1, K, K).to(weight.dtype)
    return dx, dw, (partb.sum(0).to(weight.dtype) if bias else None)


class DwConvTritonFunction(torch.autograd.Function):
    """y = aten depthwise conv(x); backward = the Triton kernels. Saves x and weight."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride: int):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.stride = bias is not None, stride
        k = weight.shape[-1]
        return F.conv2d(x, weight, bias, stride, k // 2, 1, weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw, db = dwconv_triton_bwd(dy, x, weight, ctx.stride, ctx.has_bias)
        return dx, dw, db, None


@register_impl("dwconv", "triton", available=available)
def dwconv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  stride: int = 1) -> torch.Tensor:
    """aten's depthwise forward + a Triton backward (dx and per-program partial weight sums)."""
    if x.dim() != 4 or x.dtype not in DTYPES or weight.shape[-1] not in (3, 5, 7):
        raise TypeError(f"dwconv triton: needs a 4-D float32/float16/bfloat16 x and a (C, 1, K,"
                        f" K) weight with K in 3/5/7, got {x.dtype} {tuple(weight.shape)}")
    if stride not in (1, 2):
        raise ValueError(f"dwconv triton: stride must be 1 or 2, got {stride}")
    return DwConvTritonFunction.apply(x, weight, bias, stride)
