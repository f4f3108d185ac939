"""`triton`: Triton RMSNorm forward + backward (CUDA; on CPU tensors under TRITON_INTERPRET=1)."""
from __future__ import annotations

import functools

import torch

from fusebench.kernels.registry import register_impl
from fusebench.kernels.rms_norm.function import rms_norm_function_class
from fusebench.kernels.triton_support import available, triton_cdiv, triton_next_pow2

__all__ = ["available"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_C = 16384         # one row's C values in one program's registers
TARGET_PROGRAMS = 2048  # enough programs to fill an H200-class GPU several times over


@functools.cache
def _kernels():
    from fusebench.kernels.rms_norm import _triton_kernels
    return _triton_kernels


def _check(x, weight):
    if x.dtype not in DTYPES:
        raise TypeError(f"rms_norm triton: unsupported dtype {x.dtype}")
    if x.dim() == 0 or not 0 < x.shape[-1] <= MAX_C:
        raise ValueError(f"rms_norm triton: last dim must be 1..{MAX_C}")
    if weight.numel() != x.shape[-1]:
        raise ValueError(f"rms_norm triton: weight has {weight.numel()} elements, "
                         f"last dim {x.shape[-1]}")


def _grid(rows: int) -> tuple[int, int]:
    per_prog = max(1, triton_cdiv(rows, TARGET_PROGRAMS))
    return triton_cdiv(rows, per_prog), per_prog


def rms_norm_triton_fwd(x, weight, eps):
    """(y, rstd): rstd float32, x's shape without its last dim."""
    x = x.contiguous()
    C = x.shape[-1]
    rows = x.numel() // C if C else 0
    y = torch.empty_like(x)
    rstd = torch.empty(x.shape[:-1], device=x.device, dtype=torch.float32)
    if rows:
        progs, per = _grid(rows)
        _kernels().rms_norm_fwd_kernel[(progs,)](x, y, weight, rstd, rows, C, float(eps),
                                                 BLOCK_C=triton_next_pow2(C), ROWS_PER_PROG=per)
    return y, rstd


def rms_norm_triton_bwd(dy, x, weight, rstd):
    """(dx, dweight): dx and per-program dweight partials in one launch, then their sum."""
    x = x.contiguous()
    dy = dy.to(x.dtype).contiguous()
    C = x.shape[-1]
    rows = x.numel() // C if C else 0
    dx = torch.empty_like(x)
    if not rows:
        return dx, torch.zeros_like(weight)
    progs, per = _grid(rows)
    parts = torch.empty((progs, C), device=x.device, dtype=torch.float32)
    _kernels().rms_norm_bwd_kernel[(progs,)](dy, x, weight, rstd.contiguous(), dx, parts, rows,
                                             C, BLOCK_C=triton_next_pow2(C), ROWS_PER_PROG=per)
    return dx, parts.sum(0).to(weight.dtype)


RMSNormTritonFunction = rms_norm_function_class(rms_norm_triton_fwd, rms_norm_triton_bwd,
                                                "RMSNormTritonFunction", once=True)


@register_impl("rms_norm", "triton", available=available)
def rms_norm_triton(x, weight, eps: float):
    """Triton forward + backward; a program per block of rows, each row's C in registers."""
    _check(x, weight)
    return RMSNormTritonFunction.apply(x, weight.contiguous(), eps)
