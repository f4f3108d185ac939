"""`triton`: BN(train) + act forward and backward in Triton (CUDA; on CPU tensors under
TRITON_INTERPRET=1). Forward: a statistics launch (per-channel partial sums over row slices),
the (C,) finishing in float64 torch ops, one launch writing y = act(x * scale + shift).
Backward: a launch for the partial sums of g = dy * act'(z) and g * (x - mean) (z recomputed),
the (C,) finishing, one launch writing dx. Saves x and the (C,) mean / invstd only.

residual (optional, x's shape, either layout): y = act(BN(x) + residual), a ResNet block's
`bn3 -> += identity -> ReLU` with the add inside the write pass instead of its own read-read-
write pass. Backward then also returns dresidual = g = dy * act'(z + r): the sums launch
stores g (it is r's gradient anyway) and the dx launch reads g and x rather than dy, x and r
(for the identity act g = dy: the launches without residual, dresidual = dy)."""
from __future__ import annotations

import functools

import torch

from fusebench.kernels.bn_act.cpu import ACT_CODES, FROM_OUTPUT
from fusebench.kernels.checks import check_nchw
from fusebench.kernels.bn_act.function import bn_act_function, bn_add_relu_function
from fusebench.kernels.registry import register_impl
from fusebench.kernels.triton_support import (available, dense_layout, triton_cdiv,
                                              triton_next_pow2)

__all__ = ["available", "backward", "channel_sums", "elementwise", "forward", "kernels", "runs_on"]

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BLOCK_R, MAX_BLOCK_C = 64, 64      # a program's tile: rows x channels
TARGET_SPLITS = 256                # row slices per channel block in the reductions


@functools.cache
def kernels():
    from fusebench.kernels.bn_act import _triton_kernels
    return _triton_kernels


def runs_on(x: torch.Tensor) -> bool:
    return x.dtype in DTYPES and x.dim() == 4 and x.numel() > x.shape[1] \
        and available(str(x.device))[0]


def _geometry(x: torch.Tensor):
    """(R, C, HW, strides, block_c, rows per reduction program, splits)."""
    N, C, H, W = x.shape
    R, HW = N * H * W, H * W
    # the layout's strides, not x.stride(): torch calls a tensor contiguous whatever its size-1
    # dims' strides are ((N, C, H, 1) with stride(3) == H), and hw * stride_hw needs stride(w)
    # of the layout; every tensor of a launch (x, y, dy, residual, g) is indexed by these
    strides = (C * HW, HW, 1) if x.is_contiguous() else (C * HW, 1, C)
    block_c = min(triton_next_pow2(C), MAX_BLOCK_C)
    per = triton_cdiv(triton_cdiv(R, min(TARGET_SPLITS, triton_cdiv(R, BLOCK_R))), BLOCK_R) \
        * BLOCK_R
    # H and W flatten to one index for both dense layouts: stride(h) == W * stride(w)
    return R, C, HW, strides, block_c, per, triton_cdiv(R, per)


def channel_sums(kernel, x, *args, act=None, **extra):
    """The (2, C) float64 channel sums of a reduction kernel over x's rows; extra: the
    kernel's keyword arguments (a residual's)."""
    R, C, HW, strides, bc, per, splits = _geometry(x)
    parts = torch.empty((splits, 2, C), device=x.device, dtype=torch.float32)
    if act is not None:
        extra["ACT"] = act
    kernel[(triton_cdiv(C, bc), splits)](*args, parts, R, C, HW, *strides, per, **extra,
                                         BLOCK_R=BLOCK_R, BLOCK_C=bc)
    return parts.double().sum(0)


def elementwise(kernel, x, *args, act: int, **extra):
    R, C, HW, strides, bc, _, _ = _geometry(x)
    kernel[(triton_cdiv(R, BLOCK_R), triton_cdiv(C, bc))](*args, R, C, HW, *strides, ACT=act,
                                                         BLOCK_R=BLOCK_R, BLOCK_C=bc, **extra)


def _scale_shift(mean, invstd, weight, bias):
    """(mean, scale, shift) in float32: z = (x - mean) * scale + shift."""
    return mean.float(), (invstd * weight.double()).float(), bias.float()


def _residual(residual, x, fmt, read: bool = True):
    """The kernels' keyword arguments for a residual (none for None, or when not read):
    residual in x's dtype and layout, a copy only when it is in another."""
    if residual is None:
        return {}
    if residual.shape != x.shape:
        raise ValueError(f"bn_act triton: residual must have x's shape {tuple(x.shape)}, got "
                         f"{tuple(residual.shape)}")
    return {"Res": residual.to(x.dtype).contiguous(memory_format=fmt), "HAS_RES": True} \
        if read else {}


def forward(x, weight, bias, running_mean, running_var, momentum: float, eps: float,
            act: str, residual=None):
    """(y, mean, invstd) in float32, y = act(BN(x) [+ residual]); running stats (or None)
    updated as aten does."""
    check_nchw("bn_act triton", x, DTYPES)
    x, fmt = dense_layout(x)
    res = _residual(residual, x, fmt)
    R = x.numel() // x.shape[1]
    k = x[0, :, 0, 0].float().contiguous()                  # shift: each channel's first value
    s = channel_sums(kernels().stats_kernel, x, x, k)
    m = s[0] / R
    var = (s[1] / R - m * m).clamp_min(0)
    mean, invstd = k.double() + m, torch.rsqrt(var + eps)
    if running_mean is not None:
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_((momentum * mean).to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_((momentum * var * R / (R - 1))
                                                .to(running_var.dtype))
    y = torch.empty_like(x, memory_format=fmt)
    elementwise(kernels().act_kernel, x, x, y, *_scale_shift(mean, invstd, weight, bias),
                 act=ACT_CODES[act], **res)
    return y, mean.float(), invstd.float()


def apply(x, weight, bias, mean, invstd, act: str, residual=None):
    """y = act(BN(x) [+ residual]) from the saved (C,) mean / invstd: the forward's act launch
    alone."""
    x, fmt = dense_layout(x)
    res = _residual(residual, x, fmt)
    y = torch.empty_like(x, memory_format=fmt)
    elementwise(kernels().act_kernel, x, x, y,
                 *_scale_shift(mean, invstd.double(), weight, bias), act=ACT_CODES[act], **res)
    return y


def backward(dy, x, weight, bias, mean, invstd, act: str, residual=None, output=None):
    """(dx, dweight, dbias), and dresidual last when residual is given (x's dtype and layout):
    z and act'(z [+ residual]) recomputed from x, mean, invstd (and residual). For relu / relu6
    the forward's output y may stand in for the residual (`output=y`: act' reads off y)."""
    if output is not None and (residual is not None or act not in FROM_OUTPUT):
        raise ValueError(f"bn_act triton: output= stands in for the residual with "
                         f"{'/'.join(sorted(FROM_OUTPUT))} only, got act {act!r}"
                         f"{' and a residual' if residual is not None else ''}")
    x, fmt = dense_layout(x)
    # the identity act's g = dy whatever r is: r is not read, the launches run as without it
    res = _residual(residual if output is None else output, x, fmt, read=act != "identity")
    if output is not None:
        res["RES_IS_OUT"] = True
    dy = dy.to(x.dtype).contiguous(memory_format=fmt)        # dy in x's layout: same strides
    R = x.numel() // x.shape[1]
    idd = invstd.double()
    m, scale, shift = _scale_shift(mean, idd, weight, bias)
    code = ACT_CODES[act]
    g = dy                       # g = dy * act'(z + r): stored by the sums launch when r is read
    if res:
        res["G"] = g = torch.empty_like(x, memory_format=fmt)
    sg, sgx = channel_sums(kernels().grad_sums_kernel, x, dy, x, scale, shift, m, act=code,
                           **res)
    sd = scale.double()
    u = -sd * idd * idd * sgx / R
    o = -sd * sg / R
    dx = torch.empty_like(x, memory_format=fmt)
    elementwise(kernels().dx_kernel, x, g, x, dx, m, scale, shift, u.float(), o.float(),
                act=code, FROM_G=bool(res))
    grads = dx, (idd * sgx).to(weight.dtype), sg.to(bias.dtype)
    return grads if residual is None and output is None else (*grads, g)


BNActTritonFunction = bn_act_function("BNActTritonFunction", forward, backward)


BNAddReLUTritonFunction = bn_add_relu_function("BNAddReLUTritonFunction", forward, backward)


@register_impl("bn_add_act", "triton", available=available)
def bn_add_act_triton(x, residual, weight, bias, eps: float):
    """Triton: the residual read in the act launch; backward's sums launch stores g."""
    return BNAddReLUTritonFunction.apply(x, residual, weight, bias, eps)


@register_impl("bn_act", "triton", available=available)
def bn_act_triton(x, weight, bias, eps: float):
    """Triton: a stats launch + an act launch forward, a sums launch + a dx launch backward."""
    return BNActTritonFunction.apply(x, weight, bias, eps, "silu")
