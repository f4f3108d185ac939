"""Triton kernels of the depthwise conv backward (K x K, stride S, zero padding P = K // 2).
Imported lazily by dwconv/triton.py: `@triton.jit` decides at import time whether to run
interpreted (TRITON_INTERPRET=1, on CPU tensors) or compiled.

Strides make one kernel serve NCHW and channels-last memory. Tiles are (positions, channels).
dx: one program = one sample, a block of input positions and a block of channels; each tap
gathers dy where S divides (h + P - i) and (w + P - j) (the transposed conv), masked.
dweight/dbias: one program = a block of (n, oh, ow) positions and a block of channels; it
writes its partial sums per tap, which the caller adds up (deterministic, no atomics).
Row and column indices are clamped to >= 0 before // and %, which round differently for
negative numbers on the GPU and in the interpreter."""
import triton
import triton.language as tl


@triton.jit
def dwconv_dx_kernel(DY, Wt, DX, C, H, W, OH, OW,
                     sdy_n, sdy_c, sdy_h, sdy_w, sdx_n, sdx_c, sdx_h, sdx_w,
                     K: tl.constexpr, S: tl.constexpr, P: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_p = tl.program_id(0)
    n = tl.program_id(1).to(tl.int64)
    ps = (pid_p * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)     # input positions h*W + w
    cs = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    pm = ps < H * W
    cm = cs < C
    h = ps // W
    w = ps % W
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for i in tl.static_range(K):
        hn = h + P - i
        hc = tl.where(hn >= 0, hn, 0)
        hv = (hn >= 0) & (hc % S == 0) & (hc // S < OH)
        for j in tl.static_range(K):
            wn = w + P - j
            wc = tl.where(wn >= 0, wn, 0)
            ok = hv & (wn >= 0) & (wc % S == 0) & (wc // S < OW) & pm
            offs = n * sdy_n + (hc // S) * sdy_h + (wc // S) * sdy_w
            m = ok[:, None] & cm[None, :]
            g = tl.load(DY + offs[:, None] + cs[None, :] * sdy_c, mask=m, other=0.0)
            wt = tl.load(Wt + cs * (K * K) + (i * K + j), mask=cm, other=0.0)
            acc += g.to(tl.float32) * wt.to(tl.float32)[None, :]
    out = DX + n * sdx_n + h[:, None] * sdx_h + w[:, None] * sdx_w + cs[None, :] * sdx_c
    tl.store(out, acc.to(DX.dtype.element_ty), mask=pm[:, None] & cm[None, :])


@triton.jit
def dwconv_dw_kernel(DY, X, Part, PartB, C, H, W, OH, OW, NP,
                     sdy_n, sdy_c, sdy_h, sdy_w, sx_n, sx_c, sx_h, sx_w,
                     K: tl.constexpr, S: tl.constexpr, P: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_p = tl.program_id(0)
    ps = (pid_p * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)     # (n, oh, ow) flattened
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    pm = ps < NP
    cm = cs < C
    n = ps // (OH * OW)
    r = ps % (OH * OW)
    oh = r // OW
    ow = r % OW
    m = pm[:, None] & cm[None, :]
    g = tl.load(DY + (n * sdy_n + oh * sdy_h + ow * sdy_w)[:, None] + cs[None, :] * sdy_c,
                mask=m, other=0.0).to(tl.float32)
    tl.store(PartB + pid_p * C + cs, tl.sum(g, axis=0), mask=cm)
    for i in tl.static_range(K):
        ih = oh * S - P + i
        for j in tl.static_range(K):
            iw = ow * S - P + j
            ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & pm
            xv = tl.load(X + (n * sx_n + ih * sx_h + iw * sx_w)[:, None] + cs[None, :] * sx_c,
                         mask=ok[:, None] & cm[None, :], other=0.0).to(tl.float32)
            tl.store(Part + (pid_p * (K * K) + i * K + j) * C + cs, tl.sum(g * xv, axis=0),
                     mask=cm)
