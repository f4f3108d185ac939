"""Triton BN(train) + act kernels. Imported lazily by bn_act/triton.py on first use:
`@triton.jit` decides at import time whether to run interpreted (TRITON_INTERPRET=1, on CPU).

x is seen as R = N*H*W rows of C channels at strides (stride_n, stride_c, stride_hw), so one
kernel serves NCHW (stride_hw == 1) and channels-last (stride_c == 1). A reduction program
owns a BLOCK_C block of channels and one of SPLIT slices of the rows and writes one row pair
of float32 partial sums; the (C,) finishing is done by the caller. z = (x - mean) * scale +
bias (x - mean first: x * scale + shift cancels at a large mean). The elementwise programs
own a (BLOCK_R, BLOCK_C) tile.

HAS_RES (a residual r in x's layout, read at x's strides): the act and grad-sums kernels take
act(z + r) in place of act(z), a ResNet block's `bn3 -> += identity -> ReLU` in the one pass
(no separate add reading and writing the whole tensor), and the grad-sums kernel also stores
g = dy * act'(z + r), which is r's gradient and what dx_kernel (FROM_G) then reads instead of
recomputing it (r need not be read twice). RES_IS_OUT: Res holds the forward's output y
instead of r, act'(y) for ReLU / ReLU6 (the same as act'(z + r) there), so a caller may keep
y rather than r. The residual arguments come last with defaults,
so callers without one (gn_act) launch these kernels as before."""
import triton
import triton.language as tl

from fusebench.kernels._triton_math import (gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad,
                                             silu_grad)

SILU, RELU, GELU, GELU_TANH, IDENTITY, RELU6, HARDSWISH = 0, 1, 2, 3, 4, 5, 6  # cpu.py's ACT_CODES


@triton.jit
def _act(z, ACT: tl.constexpr):
    if ACT == 0:
        return z * tl.sigmoid(z)
    elif ACT == 1:
        return tl.maximum(z, 0.0)
    elif ACT == 2:
        return gelu_erf(z)
    elif ACT == 4:
        return z
    elif ACT == 5:
        return tl.minimum(tl.maximum(z, 0.0), 6.0)
    elif ACT == 6:
        return z * tl.minimum(tl.maximum(z + 3.0, 0.0), 6.0) / 6.0
    else:
        return gelu_tanh(z)


@triton.jit
def _act_grad(z, ACT: tl.constexpr):
    if ACT == 0:
        return silu_grad(z)
    elif ACT == 1:
        return tl.where(z > 0.0, 1.0, 0.0)
    elif ACT == 4:
        return tl.full(z.shape, 1.0, z.dtype)
    elif ACT == 5:                      # aten's hardtanh_backward: 0 at both kinks
        return tl.where((z > 0.0) & (z < 6.0), 1.0, 0.0)
    elif ACT == 6:                      # aten's hardswish_backward
        return tl.where(z < -3.0, 0.0, tl.where(z <= 3.0, z / 3.0 + 0.5, 1.0))
    elif ACT == 2:
        return gelu_erf_grad(z)
    else:
        return gelu_tanh_grad(z)


@triton.jit
def _offsets(rows, cs, HW, stride_n, stride_c, stride_hw):
    n = rows // HW
    hw = rows - n * HW
    return n[:, None] * stride_n + hw[:, None] * stride_hw + cs[None, :] * stride_c


@triton.jit
def stats_kernel(X, K, Parts, R, C, HW, stride_n, stride_c, stride_hw, ROWS_PER_PROG,
                 BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Partial sums of x - k and (x - k)^2 per channel (k: the channel's first value)."""
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < C
    split = tl.program_id(1)
    k = tl.load(K + cs, mask=cm, other=0.0).to(tl.float32)
    s1 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    r0 = split.to(tl.int64) * ROWS_PER_PROG
    for i in range(0, ROWS_PER_PROG, BLOCK_R):
        rows = r0 + i + tl.arange(0, BLOCK_R)
        mask = ((rows < R) & (rows < r0 + ROWS_PER_PROG))[:, None] & cm[None, :]
        x = tl.load(X + _offsets(rows, cs, HW, stride_n, stride_c, stride_hw), mask=mask,
                    other=0.0).to(tl.float32)
        d = tl.where(mask, x - k[None, :], 0.0)
        s1 += d
        s2 += d * d
    base = split * 2 * C + cs
    tl.store(Parts + base, tl.sum(s1, axis=0), mask=cm)
    tl.store(Parts + base + C, tl.sum(s2, axis=0), mask=cm)


@triton.jit
def act_kernel(X, Y, Mean, Scale, Shift, R, C, HW, stride_n, stride_c, stride_hw,
               ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               Res=None, HAS_RES: tl.constexpr = False):
    """y = act((x - mean) * scale + shift [+ res]); y (and res) have x's strides."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < C
    mask = (rows < R)[:, None] & cm[None, :]
    offs = _offsets(rows, cs, HW, stride_n, stride_c, stride_hw)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    sc = tl.load(Scale + cs, mask=cm, other=0.0)
    sh = tl.load(Shift + cs, mask=cm, other=0.0)
    m = tl.load(Mean + cs, mask=cm, other=0.0)
    z = (x - m[None, :]) * sc[None, :] + sh[None, :]
    if HAS_RES:
        z += tl.load(Res + offs, mask=mask, other=0.0).to(tl.float32)
    y = _act(z, ACT)
    tl.store(Y + offs, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def grad_sums_kernel(DY, X, Scale, Shift, Mean, Parts, R, C, HW, stride_n, stride_c, stride_hw,
                     ROWS_PER_PROG, ACT: tl.constexpr, BLOCK_R: tl.constexpr,
                     BLOCK_C: tl.constexpr, Res=None, G=None, HAS_RES: tl.constexpr = False,
                     RES_IS_OUT: tl.constexpr = False):
    """Partial sums of g = dy * act'(z [+ res]) and g * (x - mean) per channel; with HAS_RES
    g (res's gradient) is also stored to G (x's strides); RES_IS_OUT: act'(res), res = y."""
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < C
    split = tl.program_id(1)
    sc = tl.load(Scale + cs, mask=cm, other=0.0)
    sh = tl.load(Shift + cs, mask=cm, other=0.0)
    m = tl.load(Mean + cs, mask=cm, other=0.0)
    s1 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    s2 = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    r0 = split.to(tl.int64) * ROWS_PER_PROG
    for i in range(0, ROWS_PER_PROG, BLOCK_R):
        rows = r0 + i + tl.arange(0, BLOCK_R)
        mask = ((rows < R) & (rows < r0 + ROWS_PER_PROG))[:, None] & cm[None, :]
        offs = _offsets(rows, cs, HW, stride_n, stride_c, stride_hw)
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
        xc = x - m[None, :]
        z = xc * sc[None, :] + sh[None, :]
        if RES_IS_OUT:
            z = tl.load(Res + offs, mask=mask, other=0.0).to(tl.float32)
        elif HAS_RES:
            z += tl.load(Res + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.where(mask, dy * _act_grad(z, ACT), 0.0)
        if HAS_RES:
            tl.store(G + offs, g.to(G.dtype.element_ty), mask=mask)
        s1 += g
        s2 += g * xc
    base = split * 2 * C + cs
    tl.store(Parts + base, tl.sum(s1, axis=0), mask=cm)
    tl.store(Parts + base + C, tl.sum(s2, axis=0), mask=cm)


@triton.jit
def dx_kernel(DY, X, DX, Mean, Scale, Shift, U, O, R, C, HW, stride_n, stride_c, stride_hw,
              ACT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
              FROM_G: tl.constexpr = False):
    """dx = scale * g + (x - mean) * u + o (u, o per channel from the sums, see cpu.cpp); g
    recomputed from dy, or with FROM_G read from DY (grad_sums_kernel's G; Shift unused)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cm = cs < C
    mask = (rows < R)[:, None] & cm[None, :]
    offs = _offsets(rows, cs, HW, stride_n, stride_c, stride_hw)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    sc = tl.load(Scale + cs, mask=cm, other=0.0)
    u = tl.load(U + cs, mask=cm, other=0.0)
    o = tl.load(O + cs, mask=cm, other=0.0)
    xc = x - tl.load(Mean + cs, mask=cm, other=0.0)[None, :]
    if FROM_G:
        g = dy
    else:
        sh = tl.load(Shift + cs, mask=cm, other=0.0)
        g = dy * _act_grad(xc * sc[None, :] + sh[None, :], ACT)
    dx = sc[None, :] * g + xc * u[None, :] + o[None, :]
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
