"""`triton`: Triton LN2d forward + backward (CUDA; on CPU tensors under TRITON_INTERPRET=1)."""
from __future__ import annotations

import functools

import torch

from fusebench.kernels.checks import check_nchw
from fusebench.kernels.registry import register_impl
from fusebench.kernels.triton_support import available, triton_cdiv, triton_next_pow2

__all__ = ["available"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_C = 4096        # one program holds all C channels of its block of positions
TILE = 4096         # elements per program: BLOCK_C * BLOCK_HW (registers, not shared memory)
TARGET_PROGRAMS = 2048   # backward programs enough to fill an H200-class GPU several times over
REDUCE_BLOCK_R, REDUCE_BLOCK_C = 64, 64   # partial rows x channels per step of the reduction


@functools.cache
def _kernels():
    from fusebench.kernels.ln2d import _triton_kernels
    return _triton_kernels


def _layout(x: torch.Tensor) -> tuple[torch.Tensor, torch.memory_format]:
    if x.is_contiguous():
        return x, torch.contiguous_format
    if x.is_contiguous(memory_format=torch.channels_last):
        return x, torch.channels_last
    return x.contiguous(), torch.contiguous_format


def _blocks(C: int, HW: int) -> tuple[int, int]:
    block_c = triton_next_pow2(C)
    block_hw = max(1, min(triton_next_pow2(HW), TILE // block_c))
    return block_c, block_hw


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    # H and W flatten to one index for both dense layouts: stride(h) == W * stride(w)
    return x.stride(0), x.stride(1), x.stride(3)


def _check(x, weight):
    check_nchw("ln2d triton", x, DTYPES, MAX_C)
    if weight.numel() != x.shape[1]:
        raise ValueError(f"ln2d triton: weight has {weight.numel()} elements, C={x.shape[1]}")


def ln2d_triton_fwd(x, weight, bias, eps):
    """(y, mean, rstd); mean/rstd are float32 (N, H*W), mean is of x - x[:, 0]."""
    k = _kernels()
    x, fmt = _layout(x)
    N, C, H, W = x.shape
    HW = H * W
    y = torch.empty_like(x, memory_format=fmt)
    mean = torch.empty((N, HW), device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    if x.numel():
        bc, bhw = _blocks(C, HW)
        grid = (triton_cdiv(HW, bhw), N)
        k.ln2d_fwd_kernel[grid](x, y, weight, bias, mean, rstd, C, HW, *_strides(x), float(eps),
                                BLOCK_C=bc, BLOCK_HW=bhw)
    return y, mean, rstd


def bwd_grid(N: int, HW: int, block_hw: int) -> tuple[int, int, int]:
    """(programs per sample, N, position blocks per program) for the backward: each program
    takes several blocks once the sample count alone fills the GPU (TARGET_PROGRAMS), so
    fewer partial rows are written and summed."""
    blocks = triton_cdiv(HW, block_hw)
    per_prog = max(1, min(blocks, triton_cdiv(blocks * N, TARGET_PROGRAMS)))
    return triton_cdiv(blocks, per_prog), N, per_prog


def ln2d_triton_bwd(dy, x, weight, mean, rstd):
    """dx, dweight, dbias in two launches: ln2d_bwd_kernel (dx and per-program partial sums)
    and ln2d_bwd_reduce_kernel (the partials summed into the weight's dtype)."""
    k = _kernels()
    x, fmt = _layout(x)
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)   # dy in x's layout: same strides
    N, C, H, W = x.shape
    HW = H * W
    dx = torch.empty_like(x, memory_format=fmt)
    bc, bhw = _blocks(C, HW)
    progs, _, per_prog = bwd_grid(N, HW, bhw)
    # every partial entry is written by the kernel: empty, no memset launch
    parts = torch.empty((progs * N, 2, C), device=x.device, dtype=torch.float32)
    dw = torch.empty(C, device=x.device, dtype=weight.dtype)
    db = torch.empty_like(dw)
    if x.numel():
        k.ln2d_bwd_kernel[(progs, N)](dy, x, weight, mean, rstd, dx, parts, C, HW,
                                      *_strides(x), BLOCK_C=bc, BLOCK_HW=bhw,
                                      BLOCKS_PER_PROG=per_prog)
        rc = min(bc, REDUCE_BLOCK_C)
        k.ln2d_bwd_reduce_kernel[(triton_cdiv(C, rc),)](parts, dw, db, progs * N, C,
                                                        BLOCK_R=REDUCE_BLOCK_R, BLOCK_C=rc)
    else:
        dw.zero_()
        db.zero_()
    return dx, dw, db


class LN2dTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = ln2d_triton_fwd(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = ln2d_triton_bwd(dy, x, weight, mean, rstd)
        return dx, dw, db, None


@register_impl("ln2d", "triton", available=available)
def ln2d_triton(x, weight, bias, eps: float):
    """Triton forward + backward; one program per (n, block of H*W), all C in registers."""
    _check(x, weight)
    return LN2dTritonFunction.apply(x, weight.contiguous(), bias.contiguous(), eps)
