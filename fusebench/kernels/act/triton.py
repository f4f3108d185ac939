"""`triton`: Triton activation kernels (CUDA; on CPU tensors under TRITON_INTERPRET=1)."""
from __future__ import annotations

import functools

import torch

from fusebench.kernels.act.gate import gate_grad, gate_of
from fusebench.kernels.checks import check_bias_gelu, check_gate, check_nchw
from fusebench.kernels.triton_support import (available, dense_layout, triton_cdiv,
                                              triton_next_pow2)

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_C = 4096        # one program holds all C channels of its block of positions
TILE = 4096         # elements per program: BLOCK_C * BLOCK_HW
BLOCK = 1024        # elementwise SiLU: elements per program

__all__ = ["available"]


@functools.cache
def _kernels():
    from fusebench.kernels.act import _triton_kernels
    return _triton_kernels


def _check(op: str, x: torch.Tensor) -> None:
    check_nchw(f"{op} triton", x, DTYPES, MAX_C)


def _grid(x: torch.Tensor):
    """(grid, BLOCK_C, BLOCK_HW, strides) for the C x BLOCK_HW tiling of ln2d."""
    N, C, H, W = x.shape
    HW = H * W
    bc = triton_next_pow2(C)
    bhw = max(1, min(triton_next_pow2(HW), TILE // bc))
    # H and W flatten to one index for both dense layouts: stride(h) == W * stride(w)
    return (triton_cdiv(HW, bhw), N), bc, bhw, (x.stride(0), x.stride(1), x.stride(3))


# ------------------------------------------------------------------------------- SiLU
def silu_triton_fwd(x):
    x, fmt = dense_layout(x)
    y = torch.empty_like(x, memory_format=fmt)
    if x.numel():
        _kernels().silu_fwd_kernel[(triton_cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


def silu_triton_bwd(dy, x):
    x, fmt = dense_layout(x)
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)   # same strides as x: same flat index
    dx = torch.empty_like(x, memory_format=fmt)
    if x.numel():
        _kernels().silu_bwd_kernel[(triton_cdiv(x.numel(), BLOCK),)](dy, x, dx, x.numel(),
                                                                    BLOCK=BLOCK)
    return dx


class SiLUTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return silu_triton_fwd(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return silu_triton_bwd(dy, x)


# ------------------------------------------------------------------------------- bias + GELU
def bias_gelu_triton_fwd(x, bias, tanh: bool):
    x, fmt = dense_layout(x)
    y = torch.empty_like(x, memory_format=fmt)
    if x.numel():
        grid, bc, bhw, strides = _grid(x)
        _kernels().bias_gelu_fwd_kernel[grid](x, bias, y, x.shape[1], x.shape[2] * x.shape[3],
                                              *strides, TANH=tanh, BLOCK_C=bc, BLOCK_HW=bhw)
    return y


def bias_gelu_triton_bwd(dy, x, bias, tanh: bool, want_y: bool = False):
    """(dx, dbias); want_y: (dx, dbias, gelu(x + bias)) from the same tiles."""
    x, fmt = dense_layout(x)
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)
    dx = torch.empty_like(x, memory_format=fmt)
    y = torch.empty_like(x, memory_format=fmt) if want_y else dx   # dx: an unused pointer
    C = x.shape[1]
    if not x.numel():
        db = torch.zeros_like(bias)
        return (dx, db, y) if want_y else (dx, db)
    grid, bc, bhw, strides = _grid(x)
    dbp = torch.empty((grid[0] * grid[1], C), device=x.device, dtype=torch.float32)
    _kernels().bias_gelu_bwd_kernel[grid](dy, x, bias, dx, dbp, y, C, x.shape[2] * x.shape[3],
                                          *strides, TANH=tanh, WANT_Y=want_y, BLOCK_C=bc,
                                          BLOCK_HW=bhw)
    db = dbp.sum(0).to(bias.dtype)
    return (dx, db, y) if want_y else (dx, db)


class BiasGELUTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        ctx.save_for_backward(x, bias)
        ctx.tanh = approximate == "tanh"
        return bias_gelu_triton_fwd(x, bias, ctx.tanh)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, db = bias_gelu_triton_bwd(dy, x, bias, ctx.tanh)
        return dx, db, None


# ------------------------------------------------------------------------------- SE gate
def se_gate_triton_fwd(x, g, hard: float = 0.0):
    x, fmt = dense_layout(x)
    y = torch.empty_like(x, memory_format=fmt)
    if x.numel():
        grid, bc, bhw, strides = _grid(x)
        _kernels().se_gate_fwd_kernel[grid](x, g, y, x.shape[1], x.shape[2] * x.shape[3],
                                            *strides, BLOCK_C=bc, BLOCK_HW=bhw, HARD=bool(hard))
    return y


def se_gate_triton_bwd(dy, x, g, hard: float = 0.0):
    x, fmt = dense_layout(x)
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)
    dx = torch.empty_like(x, memory_format=fmt)
    N, C = x.shape[:2]
    if not x.numel():
        return dx, torch.zeros_like(g)
    grid, bc, bhw, strides = _grid(x)
    dotp = torch.empty((N, grid[0], C), device=x.device, dtype=torch.float32)
    _kernels().se_gate_bwd_kernel[grid](dy, x, g, dx, dotp, C, x.shape[2] * x.shape[3],
                                        *strides, BLOCK_C=bc, BLOCK_HW=bhw, HARD=bool(hard))
    s = gate_of(g.float(), hard).view(N, C)
    dg = dotp.sum(1) * gate_grad(s, hard)                       # (N, C)
    return dx, dg.view(g.shape).to(g.dtype)


class SEGateTritonFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return se_gate_triton_fwd(x, g)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, g = ctx.saved_tensors
        return se_gate_triton_bwd(dy, x, g)


def silu_triton(x):
    """Triton elementwise fwd/bwd over the dense storage; saves only x."""
    _check("silu", x)
    return SiLUTritonFunction.apply(x)


def se_gate_triton(x, gate_logits):
    """Triton: (n, block of H*W) tiles with all C; bwd writes dx + per-tile sum(dy * x)."""
    _check("se_gate", x)
    check_gate(x, gate_logits)
    return SEGateTritonFunction.apply(x, gate_logits.contiguous())


def bias_gelu_triton(x, bias, approximate: str = "none"):
    """Triton: add + GELU in one pass; bwd writes dx + per-tile dbias partials."""
    _check("bias_gelu", x)
    check_bias_gelu(x, bias, approximate)
    return BiasGELUTritonFunction.apply(x, bias.contiguous(), approximate)


# ------------------------------------------------------------------------------- GLU gates
# _triton_kernels' ACT, the same codes as cpu_math.h's ActCode (glu/native.py passes them to C++)
GLU_CODES = {"silu": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}


def _pair_dense(a, b):
    if a.shape != b.shape:
        raise ValueError(f"glu triton: a and b shapes differ: {tuple(a.shape)} vs "
                         f"{tuple(b.shape)}")
    if a.dtype not in DTYPES:
        raise TypeError(f"glu triton: unsupported dtype {a.dtype}")
    a = a.contiguous()
    return a, b.to(a.dtype).contiguous()


def glu_triton_fwd(a, b, act: str = "silu"):
    a, b = _pair_dense(a, b)
    p = torch.empty_like(a)
    if a.numel():
        _kernels().glu_fwd_kernel[(triton_cdiv(a.numel(), BLOCK),)](
            a, b, p, a.numel(), ACT=GLU_CODES[act], BLOCK=BLOCK)
    return p


def glu_triton_bwd(dp, a, b, act: str = "silu", want_p: bool = False):
    """(da, db), or (da, db, act(a) * b) with want_p."""
    a, b = _pair_dense(a, b)
    dp = dp.to(a.dtype).contiguous()
    da, db = torch.empty_like(a), torch.empty_like(a)
    p = torch.empty_like(a) if want_p else da           # not written when not wanted
    if a.numel():
        _kernels().glu_bwd_kernel[(triton_cdiv(a.numel(), BLOCK),)](
            dp, a, b, da, db, p, a.numel(), ACT=GLU_CODES[act], WANT_P=want_p, BLOCK=BLOCK)
    return (da, db, p) if want_p else (da, db)


def _packed(ab, gate_second: bool):
    if ab.dtype not in DTYPES:
        raise TypeError(f"glu triton: unsupported dtype {ab.dtype}")
    if ab.dim() == 0 or ab.shape[-1] % 2:
        raise ValueError(f"glu triton: a packed gate needs an even last dim, got "
                         f"{tuple(ab.shape)}")
    H = ab.shape[-1] // 2
    return ab.contiguous(), H, (H, 0) if gate_second else (0, H)


def glu_packed_triton_fwd(ab, act: str = "silu", gate_second: bool = False):
    """act(gate) * up for ab = [gate, up] along the last dim ([up, gate]: gate_second)."""
    ab, H, (gate, up) = _packed(ab, gate_second)
    p = ab.new_empty((*ab.shape[:-1], H))
    if p.numel():
        _kernels().glu_packed_fwd_kernel[(triton_cdiv(p.numel(), BLOCK),)](
            ab, p, p.numel(), H, gate, up, ACT=GLU_CODES[act], BLOCK=BLOCK)
    return p


def glu_packed_triton_bwd(dp, ab, act: str = "silu", gate_second: bool = False,
                          want_p: bool = False):
    """(d_ab,) packed as ab, or (d_ab, act(gate) * up) with want_p."""
    ab, H, (gate, up) = _packed(ab, gate_second)
    dp = dp.to(ab.dtype).contiguous()
    dab = torch.empty_like(ab)
    p = torch.empty_like(dp) if want_p else dp          # not written when not wanted
    if dp.numel():
        _kernels().glu_packed_bwd_kernel[(triton_cdiv(dp.numel(), BLOCK),)](
            dp, ab, dab, p, dp.numel(), H, gate, up, ACT=GLU_CODES[act], WANT_P=want_p,
            BLOCK=BLOCK)
    return (dab, p) if want_p else (dab,)


# ------------------------------------------------------------------------------- MLP in row blocks
MLP_MAX_O = 256     # fc2's output row of a block's accumulator stays in registers
MLP_MAX_HIDDEN = MAX_C
MLP_BLOCKS = dict(BLOCK_M=32, BLOCK_K=32, BLOCK_H=64)


def _mlp_precision(dtype: torch.dtype) -> str:
    """tl.dot's precision for float32 operands as torch's own matmuls would run them (TF32 only
    where torch allows it); 16-bit operands multiply in their own type either way."""
    return "tf32" if dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _mlp_check(x, w1, w2) -> None:
    if x.dim() != 2 or not x.is_contiguous():
        raise ValueError("mlp triton: x must be contiguous (rows, C)")
    if w1.dim() != 2 or w2.dim() != 2 or w1.shape[1] != x.shape[1] or w2.shape[1] != w1.shape[0]:
        raise ValueError("mlp triton: w1 must be (H, C) and w2 (O, H)")
    if x.dtype not in DTYPES:
        raise TypeError(f"mlp triton: float32, float16 or bfloat16 only, got {x.dtype}")
    if w2.shape[0] > MLP_MAX_O:
        raise ValueError(f"mlp triton: fc2's output is at most {MLP_MAX_O} wide, got "
                         f"{w2.shape[0]}")
    if w1.shape[0] > MLP_MAX_HIDDEN:    # backward's GELU pass holds a row of hidden units
        raise ValueError(f"mlp triton: at most {MLP_MAX_HIDDEN} hidden units, got "
                         f"{w1.shape[0]}")


def mlp_triton_forward(x, w1, b1, w2, b2, res, tanh: bool):
    """(out, h0): out = gelu(x w1^T + b1) w2^T [+ b2] [+ res] on rows x (M, C), one program per
    BLOCK_M rows; h0 = x w1^T, saved for backward (kernels/act/mlp_blocks.h's contract)."""
    _mlp_check(x, w1, w2)
    M, C, HID, O = x.shape[0], x.shape[1], w1.shape[0], w2.shape[0]
    if res is not None and tuple(res.shape) != (M, O):
        raise ValueError("mlp triton: res must be (rows, O)")
    out, h0 = x.new_empty((M, O)), x.new_empty((M, HID))
    if M:
        # a wide fc2 tile (BLOCK_H x BLOCK_O of w2, BLOCK_M x BLOCK_O of acc) over more threads
        blocks, bo = MLP_BLOCKS, max(16, triton_next_pow2(O))
        _kernels().mlp_fwd_kernel[(triton_cdiv(M, blocks["BLOCK_M"]),)](
            x, w1.contiguous(), b1.contiguous(), w2.contiguous(), out if b2 is None else b2,
            out if res is None else res.contiguous(), out, h0, M, C, HID, O,
            HAS_B2=b2 is not None, HAS_R=res is not None, TANH=tanh,
            PRECISION=_mlp_precision(x.dtype), BLOCK_O=bo, num_warps=4 if bo <= 64 else 8,
            **blocks)
    return out, h0


def mlp_triton_backward(dy, x, h0, b1, w1, w2, tanh: bool, has_b2: bool):
    """(dx, dw1, db1, dw2, db2 or None): the GEMMs on the device's library, the GELU's backward
    (which rebuilds the GELU's output for fc2's weight gradient) in one pass by the bias_gelu
    kernel over h0's rows, seen as a channels-last (1, HID, M, 1) image."""
    def image(t):
        return t.view(1, t.shape[0], 1, t.shape[1]).permute(0, 3, 1, 2)

    dg = dy.mm(w2)
    dh, db1, g = bias_gelu_triton_bwd(image(dg), image(h0), b1, tanh, want_y=True)
    dh, g = (t.permute(0, 2, 3, 1).reshape(h0.shape) for t in (dh, g))
    return (dh.mm(w1), dh.t().mm(x), db1, dy.t().mm(g),
            dy.sum(0) if has_b2 else None)
