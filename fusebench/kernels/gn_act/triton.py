"""`triton`: GroupNorm + act in Triton (CUDA; on CPU tensors under TRITON_INTERPRET=1), on
bn_act's kernels: those take statistics per channel of a (1, C', H, W) tensor, and an x whose
(n, c) planes are those channels is one GroupNorm sample-channel per BN channel. An NCHW x is
that view whole ((1, N*C, H, W), no copy); a channels-last x's planes share no one stride, so
each sample is launched as its own (1, C, H, W) view. Forward: the per-(n, c) shifted sums, the
(N, G) finishing in float64 torch ops, one act launch. Backward: the per-(n, c) sums of g and
g * (x - mean), the finishing, one dx launch. Saves x and the (N, G) mean / rstd only."""
from __future__ import annotations

import torch

from fusebench.kernels.bn_act import triton as bn
from fusebench.kernels.bn_act.cpu import ACT_CODES
from fusebench.kernels.checks import check_nchw
from fusebench.kernels.gn_act.function import gn_act_function_class
from fusebench.kernels.registry import register_impl
from fusebench.kernels.triton_support import available, dense_layout

__all__ = ["available", "backward", "forward", "runs_on"]

DTYPES = bn.DTYPES


def runs_on(x: torch.Tensor, groups: int) -> bool:
    return x.dtype in DTYPES and x.dim() == 4 and x.shape[1] % groups == 0 \
        and x.numel() > 0 and available(str(x.device))[0]


def _planes(t: torch.Tensor) -> list[tuple[torch.Tensor, slice]]:
    """(view with t's (n, c) planes as channels, which (n, c) they are in N*C order)."""
    N, C = t.shape[:2]
    if t.is_contiguous():
        return [(t.reshape(1, N * C, *t.shape[2:]), slice(0, N * C))]
    return [(t[n:n + 1], slice(n * C, (n + 1) * C)) for n in range(N)]


def _per_plane(kernel, tensors, *params, act: int | None = None, sums: bool = False):
    """Run a bn_act kernel over every plane view of `tensors` (the same layout), with the
    (N*C,) params sliced to each view; sums: the (2, N*C) float64 sums it returns."""
    out = []
    for views in zip(*(_planes(t) for t in tensors)):
        sl = views[0][1]
        args = (*(v for v, _ in views), *(p[sl] for p in params))
        if sums:
            out.append(bn.channel_sums(kernel, views[0][0], *args, act=act))
        else:
            bn.elementwise(kernel, views[0][0], *args, act=act)
    return torch.cat(out, 1) if sums else None


def _check(x, groups: int):
    check_nchw("gn_act triton", x, DTYPES)
    if x.shape[1] % groups:
        raise ValueError(f"gn_act triton: C={x.shape[1]} is not divisible by groups={groups}")


def _coefficients(mean, rstd, weight, bias, N, C, groups):
    """(mean, scale, shift) per (n, c), float32, flat: z = (x - mean) * scale + shift."""
    D = C // groups
    m = mean.double().repeat_interleave(D, 1)
    sc = rstd.double().repeat_interleave(D, 1) * weight.double()
    return (m.float().reshape(-1), sc.float().reshape(-1),
            bias.float().expand(N, C).reshape(-1).contiguous())


def forward(x, weight, bias, groups: int, eps: float, act: str):
    """(y, mean, rstd): mean / rstd (N, G) float32."""
    _check(x, groups)
    x, fmt = dense_layout(x)
    N, C, H, W = x.shape
    HW, D = H * W, C // groups
    k = x[:, :, 0, 0].float().reshape(-1).contiguous()   # shift: each plane's first value
    s, q = _per_plane(bn.kernels().stats_kernel, (x,), k, sums=True).reshape(2, N, groups, D)
    mc = k.double().reshape(N, groups, D) + s / HW         # each plane's mean and spread
    m2 = (q - s * s / HW).clamp_min(0)
    mean = mc.mean(-1)
    var = (m2.sum(-1) + HW * (mc - mean[..., None]).pow(2).sum(-1)) / (D * HW)
    rstd = torch.rsqrt(var + eps)
    y = torch.empty_like(x, memory_format=fmt)
    _per_plane(bn.kernels().act_kernel, (x, y), *_coefficients(mean, rstd, weight, bias, N, C,
                                                                groups), act=ACT_CODES[act])
    return y, mean.float(), rstd.float()


def backward(dy, x, weight, bias, mean, rstd, groups: int, act: str):
    """(dx, dweight, dbias): z and act'(z) recomputed from x, mean, rstd."""
    x, fmt = dense_layout(x)
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)
    N, C, H, W = x.shape
    HW, D, code = H * W, C // groups, ACT_CODES[act]
    m, sc, sh = _coefficients(mean, rstd, weight, bias, N, C, groups)
    sg, sgx = _per_plane(bn.kernels().grad_sums_kernel, (dy, x), sc, sh, m, act=code,
                         sums=True).reshape(2, N, C)
    r = rstd.double()
    wd = weight.double()
    w1 = (wd * sg).reshape(N, groups, D).sum(-1)
    w2 = (wd * sgx).reshape(N, groups, D).sum(-1)
    u = (-r ** 3 * w2 / (D * HW)).repeat_interleave(D, 1)
    o = (-r * w1 / (D * HW)).repeat_interleave(D, 1)
    dx = torch.empty_like(x, memory_format=fmt)
    _per_plane(bn.kernels().dx_kernel, (dy, x, dx), m, sc, sh, u.float().reshape(-1),
               o.float().reshape(-1), act=code)
    dw = (r.repeat_interleave(D, 1) * sgx).sum(0)
    return dx, dw.to(weight.dtype), sg.sum(0).to(bias.dtype)


GNActTritonFunction = gn_act_function_class(forward, backward, "GNActTritonFunction", once=True)


@register_impl("gn_act", "triton", available=available)
def gn_act_triton(x, weight, bias, groups, eps: float):
    """Triton (bn_act's kernels over the (n, c) planes): stats + act launch forward, sums + dx
    launch backward."""
    return GNActTritonFunction.apply(x, weight, bias, int(groups), float(eps), "silu")
