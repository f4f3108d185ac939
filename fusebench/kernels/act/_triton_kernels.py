"""Triton activation kernels. Imported lazily by act/triton.py on first use: `@triton.jit`
decides at import time whether to run interpreted (TRITON_INTERPRET=1, on CPU tensors).

SiLU is elementwise over the dense storage (any memory format). bias+GELU and the SE gate use
the ln2d tiling: one program = one sample n and a BLOCK_HW block of positions, holding all C
channels, so one kernel serves NCHW (stride_hw == 1) and channels-last (stride_c == 1) and the
per-channel reductions (dbias, sum_hw(dy * x)) come out as one partial row per program."""
import triton
import triton.language as tl

from fusebench.kernels._triton_math import (gelu_erf, gelu_erf_grad, gelu_tanh, gelu_tanh_grad,
                                             silu_grad)


@triton.jit
def _gelu(v, TANH: tl.constexpr):
    if TANH:
        return gelu_tanh(v)
    return gelu_erf(v)


@triton.jit
def _gelu_grad(v, TANH: tl.constexpr):
    if TANH:
        return gelu_tanh_grad(v)
    return gelu_erf_grad(v)


@triton.jit
def silu_fwd_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + offs, (x * tl.sigmoid(x)).to(Y.dtype.element_ty), mask=m)


@triton.jit
def silu_bwd_kernel(DY, X, DX, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(DX + offs, (dy * silu_grad(x)).to(DX.dtype.element_ty), mask=m)


@triton.jit
def _tile(pid_hw, n, C, HW, stride_n, stride_c, stride_hw, BLOCK_C: tl.constexpr,
          BLOCK_HW: tl.constexpr):
    cs = tl.arange(0, BLOCK_C)
    hws = pid_hw * BLOCK_HW + tl.arange(0, BLOCK_HW)
    cm = cs < C
    mask = cm[:, None] & (hws < HW)[None, :]
    offs = n * stride_n + cs[:, None] * stride_c + hws[None, :] * stride_hw  # (BLOCK_C, BLOCK_HW)
    return cs, cm, mask, offs


@triton.jit
def bias_gelu_fwd_kernel(X, B, Y, C, HW, stride_n, stride_c, stride_hw, TANH: tl.constexpr,
                         BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs = _tile(tl.program_id(0), n, C, HW, stride_n, stride_c, stride_hw,
                               BLOCK_C, BLOCK_HW)
    b = tl.load(B + cs, mask=cm, other=0.0).to(tl.float32)
    v = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32) + b[:, None]
    tl.store(Y + offs, _gelu(v, TANH).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def bias_gelu_bwd_kernel(DY, X, B, DX, DBp, Y, C, HW, stride_n, stride_c, stride_hw,
                         TANH: tl.constexpr, WANT_Y: tl.constexpr, BLOCK_C: tl.constexpr,
                         BLOCK_HW: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs = _tile(pid_hw, n, C, HW, stride_n, stride_c, stride_hw,
                               BLOCK_C, BLOCK_HW)
    b = tl.load(B + cs, mask=cm, other=0.0).to(tl.float32)
    v = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32) + b[:, None]
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    dx = tl.where(mask, dy * _gelu_grad(v, TANH), 0.0)
    tl.store(DX + offs, dx.to(DX.dtype.element_ty), mask=mask)
    if WANT_Y:                                                 # the recomputed forward output
        tl.store(Y + offs, _gelu(v, TANH).to(Y.dtype.element_ty), mask=mask)
    row = n * tl.num_programs(0) + pid_hw                      # one partial row per program
    tl.store(DBp + row * C + cs, tl.sum(dx, axis=1), mask=cm)


@triton.jit
def _gate(g, HARD: tl.constexpr):
    """sigmoid(g), or hardsigmoid(g) = clamp(g / 6 + 1/2, 0, 1)."""
    if HARD:
        return tl.minimum(tl.maximum(g / 6.0 + 0.5, 0.0), 1.0)
    return tl.sigmoid(g)


@triton.jit
def se_gate_fwd_kernel(X, G, Y, C, HW, stride_n, stride_c, stride_hw, BLOCK_C: tl.constexpr,
                       BLOCK_HW: tl.constexpr, HARD: tl.constexpr):
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs = _tile(tl.program_id(0), n, C, HW, stride_n, stride_c, stride_hw,
                               BLOCK_C, BLOCK_HW)
    s = _gate(tl.load(G + n * C + cs, mask=cm, other=0.0).to(tl.float32), HARD)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + offs, (x * s[:, None]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def se_gate_bwd_kernel(DY, X, G, DX, DOTp, C, HW, stride_n, stride_c, stride_hw,
                       BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr, HARD: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs = _tile(pid_hw, n, C, HW, stride_n, stride_c, stride_hw,
                               BLOCK_C, BLOCK_HW)
    s = _gate(tl.load(G + n * C + cs, mask=cm, other=0.0).to(tl.float32), HARD)
    x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DX + offs, (dy * s[:, None]).to(DX.dtype.element_ty), mask=mask)
    # partial sum_hw(dy * x) of sample n: DOTp is (N, programs along HW, C)
    row = n * tl.num_programs(0) + pid_hw
    tl.store(DOTp + row * C + cs, tl.sum(dy * x, axis=1), mask=cm)


# GLU gates: p = act(a) * b, elementwise over two contiguous tensors. ACT: 0 silu, 1 relu,
# 2 gelu (erf), 3 gelu (tanh): cpu_math.h's codes.
@triton.jit
def _glu_act(z, ACT: tl.constexpr):
    if ACT == 0:
        return z * tl.sigmoid(z)
    if ACT == 1:
        return tl.where(z > 0, z, 0.0)
    return _gelu(z, ACT == 3)


@triton.jit
def _glu_act_grad(z, ACT: tl.constexpr):
    if ACT == 0:
        return silu_grad(z)
    if ACT == 1:
        return tl.where(z > 0, 1.0, 0.0)
    return _gelu_grad(z, ACT == 3)


@triton.jit
def glu_fwd_kernel(A, B, P, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(A + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(P + offs, (_glu_act(a, ACT) * b).to(P.dtype.element_ty), mask=m)


@triton.jit
def glu_bwd_kernel(DP, A, B, DA, DB, P, n, ACT: tl.constexpr, WANT_P: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(A + offs, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + offs, mask=m, other=0.0).to(tl.float32)
    g = tl.load(DP + offs, mask=m, other=0.0).to(tl.float32)
    s = _glu_act(a, ACT)
    tl.store(DA + offs, (g * b * _glu_act_grad(a, ACT)).to(DA.dtype.element_ty), mask=m)
    tl.store(DB + offs, (g * s).to(DB.dtype.element_ty), mask=m)
    if WANT_P:
        tl.store(P + offs, (s * b).to(P.dtype.element_ty), mask=m)


# Packed: gate and up are the two halves of one (rows, 2H) projection output (a `chunk(2, -1)`
# spelling); read in place, and backward writes their gradient packed the same way.
@triton.jit
def glu_packed_fwd_kernel(AB, P, n, H, GATE, UP, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    src = (offs // H) * 2 * H + offs % H
    a = tl.load(AB + src + GATE, mask=m, other=0.0).to(tl.float32)
    b = tl.load(AB + src + UP, mask=m, other=0.0).to(tl.float32)
    tl.store(P + offs, (_glu_act(a, ACT) * b).to(P.dtype.element_ty), mask=m)


@triton.jit
def glu_packed_bwd_kernel(DP, AB, DAB, P, n, H, GATE, UP, ACT: tl.constexpr,
                          WANT_P: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    src = (offs // H) * 2 * H + offs % H
    a = tl.load(AB + src + GATE, mask=m, other=0.0).to(tl.float32)
    b = tl.load(AB + src + UP, mask=m, other=0.0).to(tl.float32)
    g = tl.load(DP + offs, mask=m, other=0.0).to(tl.float32)
    s = _glu_act(a, ACT)
    tl.store(DAB + src + GATE, (g * b * _glu_act_grad(a, ACT)).to(DAB.dtype.element_ty), mask=m)
    tl.store(DAB + src + UP, (g * s).to(DAB.dtype.element_ty), mask=m)
    if WANT_P:
        tl.store(P + offs, (s * b).to(P.dtype.element_ty), mask=m)


# The MLP in row blocks (fuse/mlp_blocks.py's GPU side): one program = BLOCK_M rows, looping
# over the hidden units BLOCK_H at a time: fc1's tile (a K loop over C), its bias + GELU, and
# the tile's share of fc2 accumulated in registers, so the hidden activation never goes through
# memory between the layers. Only h0 (fc1's output before its bias, the tensor backward
# rebuilds the GELU from) is written. w1 is (HID, C), w2 (O, HID), rows row-major.
@triton.jit
def mlp_fwd_kernel(X, W1, B1, W2, B2, R, OUT, H0, M, C, HID, O,
                   HAS_B2: tl.constexpr, HAS_R: tl.constexpr, TANH: tl.constexpr,
                   PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_O: tl.constexpr):
    rm = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    ro = tl.arange(0, BLOCK_O)
    mm, om = rm < M, ro < O
    acc = tl.zeros((BLOCK_M, BLOCK_O), dtype=tl.float32)
    for h in range(0, HID, BLOCK_H):
        rh = h + tl.arange(0, BLOCK_H)
        hm = rh < HID
        h0 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
        for k in range(0, C, BLOCK_K):
            rk = k + tl.arange(0, BLOCK_K)
            km = rk < C
            xt = tl.load(X + rm[:, None] * C + rk[None, :], mask=mm[:, None] & km[None, :],
                         other=0.0)
            w1t = tl.load(W1 + rh[None, :] * C + rk[:, None], mask=km[:, None] & hm[None, :],
                          other=0.0)
            h0 = tl.dot(xt, w1t, h0, input_precision=PRECISION)
        # the GELU from h0 as stored (rounded to the dtype), as backward rebuilds it
        h0 = h0.to(H0.dtype.element_ty)
        tl.store(H0 + rm[:, None] * HID + rh[None, :], h0, mask=mm[:, None] & hm[None, :])
        b1 = tl.load(B1 + rh, mask=hm, other=0.0).to(tl.float32)
        g = _gelu(h0.to(tl.float32) + b1[None, :], TANH)       # padded units: gelu(0) = 0
        w2t = tl.load(W2 + ro[None, :] * HID + rh[:, None], mask=hm[:, None] & om[None, :],
                      other=0.0)
        acc = tl.dot(g.to(W2.dtype.element_ty), w2t, acc, input_precision=PRECISION)
    if HAS_B2:
        acc += tl.load(B2 + ro, mask=om, other=0.0).to(tl.float32)[None, :]
    offs = rm[:, None] * O + ro[None, :]
    if HAS_R:
        acc += tl.load(R + offs, mask=mm[:, None] & om[None, :], other=0.0).to(tl.float32)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mm[:, None] & om[None, :])


# GRN after bias + act over a contiguous (N, H, W, C) h (kernels/grn/native.py): _tile's
# tiling with stride_c 1 and stride_hw C, one image n and BLOCK_HW rows per program; the
# (n, c) sums come out as one partial row per program, as bias_gelu's dbias does. g = act(h +
# b) is recomputed in every pass rather than written and read back. ACT: _glu_act's codes.
@triton.jit
def _grn_g(H, B, n, pid_hw, C, HW, ACT: tl.constexpr, BLOCK_C: tl.constexpr,
           BLOCK_HW: tl.constexpr):
    cs, cm, mask, offs = _tile(pid_hw, n, C, HW, HW * C, 1, C, BLOCK_C, BLOCK_HW)
    b = tl.load(B + cs, mask=cm, other=0.0).to(tl.float32)
    z = tl.load(H + offs, mask=mask, other=0.0).to(tl.float32) + b[:, None]
    return cs, cm, mask, offs, z, tl.where(mask, _glu_act(z, ACT), 0.0)


@triton.jit
def grn_sumsq_kernel(H, B, SQp, C, HW, ACT: tl.constexpr, BLOCK_C: tl.constexpr,
                     BLOCK_HW: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs, z, g = _grn_g(H, B, n, pid_hw, C, HW, ACT, BLOCK_C, BLOCK_HW)
    row = n * tl.num_programs(0) + pid_hw
    tl.store(SQp + row * C + cs, tl.sum(g * g, axis=1), mask=cm)


@triton.jit
def grn_out_kernel(H, B, S, BETA, U, C, HW, ACT: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_HW: tl.constexpr):
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs, z, g = _grn_g(H, B, n, tl.program_id(0), C, HW, ACT, BLOCK_C,
                                      BLOCK_HW)
    s = tl.load(S + n * C + cs, mask=cm, other=0.0)
    beta = tl.load(BETA + cs, mask=cm, other=0.0)
    tl.store(U + offs, (g * s[:, None] + beta[:, None]).to(U.dtype.element_ty), mask=mask)


@triton.jit
def grn_sums_kernel(DU, H, B, S, BETA, U, DSp, SDUp, C, HW, ACT: tl.constexpr,
                    WANT_U: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HW: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs, z, g = _grn_g(H, B, n, pid_hw, C, HW, ACT, BLOCK_C, BLOCK_HW)
    du = tl.load(DU + offs, mask=mask, other=0.0).to(tl.float32)
    if WANT_U:                                   # GRN's output, for fc2's weight gradient
        s = tl.load(S + n * C + cs, mask=cm, other=0.0)
        beta = tl.load(BETA + cs, mask=cm, other=0.0)
        tl.store(U + offs, (g * s[:, None] + beta[:, None]).to(U.dtype.element_ty), mask=mask)
    row = n * tl.num_programs(0) + pid_hw
    tl.store(DSp + row * C + cs, tl.sum(du * g, axis=1), mask=cm)
    tl.store(SDUp + row * C + cs, tl.sum(du, axis=1), mask=cm)


@triton.jit
def grn_grad_kernel(DU, H, B, S, K, DH, DBp, C, HW, ACT: tl.constexpr, BLOCK_C: tl.constexpr,
                    BLOCK_HW: tl.constexpr):
    pid_hw = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    cs, cm, mask, offs, z, g = _grn_g(H, B, n, pid_hw, C, HW, ACT, BLOCK_C, BLOCK_HW)
    du = tl.load(DU + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(S + n * C + cs, mask=cm, other=0.0)
    k = tl.load(K + n * C + cs, mask=cm, other=0.0)
    dh = tl.where(mask, (du * s[:, None] + g * k[:, None]) * _glu_act_grad(z, ACT), 0.0)
    tl.store(DH + offs, dh.to(DH.dtype.element_ty), mask=mask)
    row = n * tl.num_programs(0) + pid_hw
    tl.store(DBp + row * C + cs, tl.sum(dh, axis=1), mask=cm)
