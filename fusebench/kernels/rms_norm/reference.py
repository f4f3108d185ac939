"""RMSNorm baselines as users write them, plus the float64 reference the tests use."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.registry import register_impl


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """float64 ground truth for every impl."""
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@register_impl("rms_norm", "eager")
def rms_norm_eager(x, weight, eps: float):
    """F.rms_norm (torch.nn.RMSNorm's forward; on CPU aten composes it of pow/mean/rsqrt/mul)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


@register_impl("rms_norm", "naive")
def rms_norm_naive(x, weight, eps: float):
    """written out as LLaMA's and HF's RMSNorm do: weight * (x * rsqrt(mean(x^2) + eps))."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
