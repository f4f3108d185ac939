"""LN2d baselines as users write them, plus the float64 reference used by tests."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.registry import register_impl


def ln2d_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float):
    """float64 two-pass reference: the ground truth for every impl."""
    xd = x.double()
    mean = xd.mean(dim=1, keepdim=True)
    var = (xd - mean).pow(2).mean(dim=1, keepdim=True)
    y = (xd - mean) * torch.rsqrt(var + eps)
    return y * weight.double()[None, :, None, None] + bias.double()[None, :, None, None]


@register_impl("ln2d", "permute")
def ln2d_permute(x, weight, bias, eps: float):
    """permute to NHWC -> F.layer_norm -> permute back (timm's LayerNorm2d)."""
    x = x.permute(0, 2, 3, 1)                                   # (N, H, W, C)
    x = F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    return x.permute(0, 3, 1, 2)                                # (N, C, H, W)


@register_impl("ln2d", "sqm")
def ln2d_sqm(x, weight, bias, eps: float):
    """one-pass E[x^2]-E[x]^2 by hand: imprecise at large mean (ConvNeXt's is twopass, not this)."""
    u = x.mean(1, keepdim=True)
    s = (x * x).mean(1, keepdim=True) - u * u
    x = (x - u) * torch.rsqrt(s + eps)
    return x * weight[:, None, None] + bias[:, None, None]


@register_impl("ln2d", "twopass")
def ln2d_twopass(x, weight, bias, eps: float):
    """channels-first two-pass mean, then mean((x-u)^2), by hand (ConvNeXt's official LayerNorm)."""
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    x = (x - u) / torch.sqrt(s + eps)
    return x * weight[:, None, None] + bias[:, None, None]


@register_impl("ln2d", "channels_last")
def ln2d_channels_last(x, weight, bias, eps: float):
    """F.layer_norm over a channels-last view: no copy when x is already channels-last."""
    # permute of a channels_last NCHW tensor is a contiguous NHWC view, so layer_norm reads it
    # in place; for an NCHW-contiguous input this costs the same as `permute`.
    y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), weight, bias, eps)
    return y.permute(0, 3, 1, 2)
