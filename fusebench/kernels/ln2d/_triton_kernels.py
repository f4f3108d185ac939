"""Triton LN2d kernels. Imported lazily by ln2d/triton.py on first use: `@triton.jit` decides at
import time whether to run interpreted (TRITON_INTERPRET=1, on CPU tensors) or compiled.

One program = one sample n and a BLOCK_HW block of positions; it holds the whole (padded)
C x BLOCK_HW tile, so x is read once. Strides make one kernel serve NCHW (stride_hw == 1) and
channels-last (stride_c == 1) memory; triton specialises a stride of 1, so loads coalesce along
whichever dim is contiguous. Statistics are of x - x[:, 0] (a shift, see cpu.cpp)."""
import triton
import triton.language as tl


@triton.jit
def ln2d_fwd_kernel(X, Y, W, B, Mean, Rstd, C, HW, stride_n, stride_c, stride_hw, eps,
                    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    hws = pid_hw * BLOCK_HW + tl.arange(0, BLOCK_HW)
    cm = cs < C
    hm = hws < HW
    mask = cm[:, None] & hm[None, :]
    offs = n * stride_n + cs[:, None] * stride_c + hws[None, :] * stride_hw   # (BLOCK_C, BLOCK_HW)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    k = tl.load(X + n * stride_n + hws * stride_hw, mask=hm, other=0.0).to(tl.float32)
    xs = tl.where(mask, x - k[None, :], 0.0)
    mean = tl.sum(xs, axis=0) / C
    d = tl.where(mask, xs - mean[None, :], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / C + eps)
    w = tl.load(W + cs, mask=cm, other=0.0).to(tl.float32)
    b = tl.load(B + cs, mask=cm, other=0.0).to(tl.float32)
    y = d * rstd[None, :] * w[:, None] + b[:, None]
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(Mean + n * HW + hws, mean, mask=hm)
    tl.store(Rstd + n * HW + hws, rstd, mask=hm)


@triton.jit
def ln2d_bwd_kernel(DY, X, W, Mean, Rstd, DX, Parts, C, HW, stride_n, stride_c, stride_hw,
                    BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, BLOCKS_PER_PROG: tl.constexpr):
    """dx for BLOCKS_PER_PROG consecutive position blocks of one sample, and one row pair of
    partial (dweight, dbias) sums over them, accumulated in registers: fewer partial rows for
    ln2d_bwd_reduce_kernel to read."""
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs = tl.arange(0, BLOCK_C)
    cm = cs < C
    w = tl.load(W + cs, mask=cm, other=0.0).to(tl.float32)
    dw_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for b in range(BLOCKS_PER_PROG):
        hws = (pid_hw * BLOCKS_PER_PROG + b) * BLOCK_HW + tl.arange(0, BLOCK_HW)
        hm = hws < HW
        mask = cm[:, None] & hm[None, :]
        offs = n * stride_n + cs[:, None] * stride_c + hws[None, :] * stride_hw
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        k = tl.load(X + n * stride_n + hws * stride_hw, mask=hm, other=0.0).to(tl.float32)
        mean = tl.load(Mean + n * HW + hws, mask=hm, other=0.0)
        rstd = tl.load(Rstd + n * HW + hws, mask=hm, other=0.0)
        xhat = tl.where(mask, (x - k[None, :] - mean[None, :]) * rstd[None, :], 0.0)
        g = dy * w[:, None]
        sg = tl.sum(g, axis=0) / C
        sgx = tl.sum(g * xhat, axis=0) / C
        dx = rstd[None, :] * (g - sg[None, :] - xhat * sgx[None, :])
        tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += tl.sum(dy * xhat, axis=1)
        db_acc += tl.sum(dy, axis=1)
    row = n * tl.num_programs(0) + pid_hw            # one (dweight, dbias) row pair per program
    tl.store(Parts + row * 2 * C + cs, dw_acc, mask=cm)
    tl.store(Parts + (row * 2 + 1) * C + cs, db_acc, mask=cm)


@triton.jit
def ln2d_bwd_reduce_kernel(Parts, DW, DB, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dweight, dbias = the R partial row pairs summed, stored in the weight's dtype: one launch
    for what a torch sum plus a cast would take two for."""
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < C
    dw = tl.zeros((BLOCK_C,), dtype=tl.float32)
    db = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rs = (r0 + tl.arange(0, BLOCK_R)).to(tl.int64)
        mask = (rs < R)[:, None] & cm[None, :]
        base = rs[:, None] * 2 * C + cs[None, :]
        dw += tl.sum(tl.load(Parts + base, mask=mask, other=0.0), axis=0)
        db += tl.sum(tl.load(Parts + base + C, mask=mask, other=0.0), axis=0)
    tl.store(DW + cs, dw.to(DW.dtype.element_ty), mask=cm)
    tl.store(DB + cs, db.to(DB.dtype.element_ty), mask=cm)
