"""The grn family's native impls: `cpu` (C++/OpenMP, kernels/act/grn.h, in the act kernels'
extension) and `triton` (kernels/act/_triton_kernels.py's grn_* kernels, launched here). Both
do what the torch pair does in two passes over h per direction (forward: the squares' sums,
then u; backward: the (n, c) sums of du * g and du [and u], then dh), and save what it saves."""
from __future__ import annotations

import torch

from fusebench.kernels.act import cpu, triton
from fusebench.kernels.act.triton import GLU_CODES as CODES   # cpu_math.h's ActCode too
from fusebench.kernels.grn.function import channel_grads, checked, grn_function
from fusebench.kernels.registry import register_impl
from fusebench.kernels.triton_support import triton_cdiv, triton_next_pow2

TILE = 4096                          # elements per Triton program: BLOCK_C * BLOCK_HW
# what each native pair computes in: the grn_mlp site runs GRN in torch ops for other dtypes
# (Triton would round float64 to float32; the C++ kernels have no float16)
DTYPES = {"cpu": cpu.DTYPES, "triton": triton.DTYPES}


def grn_cpu_fwd(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    return tuple(cpu.extension().grn_forward(h, b, gamma, beta, eps, CODES[act]))


def grn_cpu_bwd(du, h, b, gamma, beta, big, m, act: str = "gelu", want_u: bool = False):
    return tuple(cpu.extension().grn_backward(du, h, b, gamma, beta, big, m, CODES[act],
                                              want_u))


def _launch(h):
    """(grid, BLOCK_C, BLOCK_HW) over an (N, H, W, C) h: one image and BLOCK_HW rows a program."""
    N, H, W, C = h.shape
    bc = triton_next_pow2(C)
    bhw = max(1, min(triton_next_pow2(H * W), TILE // bc))
    return (triton_cdiv(H * W, bhw), N), bc, bhw


def _bias(b, h):
    return torch.zeros(h.shape[-1], device=h.device) if b is None else b.float().contiguous()


def grn_triton_fwd(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    h = h.contiguous()
    N, H, W, C = h.shape
    grid, bc, bhw = _launch(h)
    k, b32 = triton._kernels(), _bias(b, h)
    sq = torch.empty(N, grid[0], C, device=h.device, dtype=torch.float32)
    k.grn_sumsq_kernel[grid](h, b32, sq, C, H * W, ACT=CODES[act], BLOCK_C=bc, BLOCK_HW=bhw)
    big = sq.sum(1).sqrt_()
    m = big.mean(-1) + eps
    s = (1 + gamma.float().reshape(-1) * (big / m[:, None])).contiguous()
    u = torch.empty_like(h)
    k.grn_out_kernel[grid](h, b32, s, beta.float().reshape(-1).contiguous(), u, C, H * W,
                           ACT=CODES[act], BLOCK_C=bc, BLOCK_HW=bhw)
    return u, big, m


def grn_triton_bwd(du, h, b, gamma, beta, big, m, act: str = "gelu", want_u: bool = False):
    h = h.contiguous()
    du = du.to(h.dtype).contiguous()
    N, H, W, C = h.shape
    grid, bc, bhw = _launch(h)
    kern, b32 = triton._kernels(), _bias(b, h)
    big, m = big.float(), m.float()
    s = (1 + gamma.float().reshape(-1) * (big / m[:, None])).contiguous()
    u = torch.empty_like(h) if want_u else h         # h: a placeholder the kernel never writes
    ds, sdu = (torch.empty(N, grid[0], C, device=h.device, dtype=torch.float32)
               for _ in range(2))
    kern.grn_sums_kernel[grid](du, h, b32, s, beta.float().reshape(-1).contiguous(), u, ds, sdu,
                               C, H * W, ACT=CODES[act], WANT_U=want_u, BLOCK_C=bc,
                               BLOCK_HW=bhw)
    kk, dgamma, dbeta = channel_grads(ds.sum(1), sdu.sum(1), big, m, gamma, beta)
    dh = torch.empty_like(h)
    dbp = torch.empty(N * grid[0], C, device=h.device, dtype=torch.float32)
    kern.grn_grad_kernel[grid](du, h, b32, s, kk.contiguous(), dh, dbp, C, H * W,
                               ACT=CODES[act], BLOCK_C=bc, BLOCK_HW=bhw)
    db = dbp.sum(0).to(b.dtype).reshape(b.shape) if b is not None else None
    return (dh, db, dgamma, dbeta, u) if want_u else (dh, db, dgamma, dbeta)


_CPU = grn_function(grn_cpu_fwd, grn_cpu_bwd, "GRNCpuFunction", once=True)
_TRITON = grn_function(grn_triton_fwd, grn_triton_bwd, "GRNTritonFunction", once=True)


@register_impl("grn", "cpu", available=cpu.available)
def grn_cpu(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """C++/OpenMP: two passes over h per direction, g recomputed; saves h and the norms."""
    checked(h, gamma, beta, act)
    if h.dtype not in cpu.DTYPES or h.device.type != "cpu":
        raise TypeError(f"grn cpu: unsupported dtype {h.dtype} on {h.device.type} (CPU "
                        f"{', '.join(str(d).replace('torch.', '') for d in cpu.DTYPES)})")
    return _CPU.apply(h, b, gamma, beta, eps, act)


@register_impl("grn", "triton", available=triton.available)
def grn_triton(h, b, gamma, beta, eps: float = 1e-6, act: str = "gelu"):
    """Triton: two launches per direction, the (n, c) sums as per-program partial rows."""
    checked(h, gamma, beta, act)
    return _TRITON.apply(h, b, gamma, beta, eps, act)
