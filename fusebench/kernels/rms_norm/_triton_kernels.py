"""Triton RMSNorm kernels. Imported lazily by rms_norm/triton.py on first use: `@triton.jit`
decides at import time whether to run interpreted (TRITON_INTERPRET=1, on CPU tensors) or
compiled. One program takes ROWS_PER_PROG rows of a contiguous (rows, C) tensor, one row at a
time with all C values in registers; backward keeps its rows' dweight sum in registers and
writes one partial row per program (fewer rows for the torch sum after it)."""
import triton
import triton.language as tl


@triton.jit
def rms_norm_fwd_kernel(X, Y, W, Rstd, R, C, eps, BLOCK_C: tl.constexpr,
                        ROWS_PER_PROG: tl.constexpr):
    cs = tl.arange(0, BLOCK_C)
    cm = cs < C
    w = tl.load(W + cs, mask=cm, other=0.0).to(tl.float32)
    for i in range(ROWS_PER_PROG):
        r = (tl.program_id(0) * ROWS_PER_PROG + i).to(tl.int64)
        if r < R:
            x = tl.load(X + r * C + cs, mask=cm, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
            tl.store(Y + r * C + cs, (x * rstd * w).to(Y.dtype.element_ty), mask=cm)
            tl.store(Rstd + r, rstd)


@triton.jit
def rms_norm_bwd_kernel(DY, X, W, Rstd, DX, Parts, R, C, BLOCK_C: tl.constexpr,
                        ROWS_PER_PROG: tl.constexpr):
    cs = tl.arange(0, BLOCK_C)
    cm = cs < C
    w = tl.load(W + cs, mask=cm, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for i in range(ROWS_PER_PROG):
        r = (tl.program_id(0) * ROWS_PER_PROG + i).to(tl.int64)
        if r < R:
            x = tl.load(X + r * C + cs, mask=cm, other=0.0).to(tl.float32)
            dy = tl.load(DY + r * C + cs, mask=cm, other=0.0).to(tl.float32)
            rstd = tl.load(Rstd + r)
            g = dy * w
            k = rstd * rstd * rstd * tl.sum(g * x, axis=0) / C
            tl.store(DX + r * C + cs, (rstd * g - x * k).to(DX.dtype.element_ty), mask=cm)
            dw += dy * x * rstd
    tl.store(Parts + tl.program_id(0).to(tl.int64) * C + cs, dw, mask=cm)
