"""The depthwise conv as PyTorch runs it (the baseline) and the float64 reference."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.registry import register_impl


def dwconv_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """float64 ground truth: stride 1, zero 'same' padding, groups = C."""
    b = bias.double() if bias is not None else None
    return F.conv2d(x.double(), weight.double(), b, padding=weight.shape[-1] // 2,
                    groups=weight.shape[0])


@register_impl("dwconv", "eager")
def dwconv_eager(x, weight, bias):
    """F.conv2d(groups=C) (aten/oneDNN forward and backward), as nn.Conv2d runs it."""
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=weight.shape[0])
