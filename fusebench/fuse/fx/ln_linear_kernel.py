"""LayerNorm (last dim) -> Linear in one Function that saves only the LN input and its (rows,)
statistics, not the normalised tensor the Linear's weight gradient needs: backward recomputes
it (aten's native_layer_norm again, so the same numbers). Eager keeps both x and LN(x) alive
until backward; this keeps x (which the residual stream holds anyway in a pre-norm block).
The Linear's bias may be left out (`bias=False`): the mlp pattern fuses fc1's bias itself."""
from __future__ import annotations

import functools

import torch

from fusebench.fuse import gemm
from fusebench.fuse.engine import MultiOpKernel, run_ops


def _ln(x, w, b, eps):
    return torch.native_layer_norm(x, (x.shape[-1],), w, b, eps)


@functools.cache
def ln_linear_kernel(eps: float, has_w: bool, has_b: bool, has_bias: bool) -> MultiOpKernel:
    """groups: ((ln weight?, ln bias?), (linear weight, linear bias?))."""
    def unpack(groups):
        (ln, (w, *b)) = groups
        ln = list(ln)
        lw = ln.pop(0) if has_w else None
        lb = ln.pop(0) if has_b else None
        return lw, lb, w, (b[0] if b else None)

    def fwd(x, groups):
        lw, lb, w, b = unpack(groups)
        n, mean, rstd = _ln(x, lw, lb, eps)
        return gemm.nt(n, w, b), (x, mean, rstd)

    def bwd(dy, saved, groups):
        (x, mean, rstd), (lw, lb, w, _) = saved, unpack(groups)
        n = _ln(x, lw, lb, eps)[0]                          # recomputed, not saved
        dy2, n2 = dy.reshape(-1, dy.shape[-1]), n.reshape(-1, n.shape[-1])
        dw = gemm.wgrad(dy2, n2)
        dn = gemm.nn(dy, w)
        dx, dlw, dlb = torch.ops.aten.native_layer_norm_backward(
            dn, x, (x.shape[-1],), mean, rstd, lw, lb, (True, has_w, has_b))
        ln_grads = tuple(g for g, has in ((dlw, has_w), (dlb, has_b)) if has)
        return dx, (ln_grads, (dw, dy2.sum(0)) if has_bias else (dw,))
    return MultiOpKernel(f"ln_linear[{eps:g}]", fwd, bwd)


def ln_linear(x, eps: float, lw, lb, w, b=None):
    """linear(layer_norm(x over the last dim, lw, lb, eps), w, b), saving x and the stats."""
    kernel = ln_linear_kernel(float(eps), lw is not None, lb is not None, b is not None)
    return run_ops(kernel, x, ((lw, lb), (w, b)))
