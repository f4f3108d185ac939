"""Memory-efficient SiLU: y = x * sigmoid(x), saving only x for backward.

Four layers (timm activations_me style): silu_fwd / silu_bwd (pure tensor functions) ->
SiLUFunction -> silu_me (functional) -> SiLUMemEff (module). The naive `x * torch.sigmoid(x)`
keeps x *and* sigmoid(x) alive for backward; this keeps x and recomputes sigmoid(x) in backward.
(aten's F.silu also saves only x; the difference to it is none in memory, see docs/kernels.md.)"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.registry import get_impl, register_impl


def silu_reference(x: torch.Tensor) -> torch.Tensor:
    """float64 ground truth."""
    xd = x.double()
    return xd * torch.sigmoid(xd)


def silu_fwd(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


def silu_bwd(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dx = dy * s * (1 + x * (1 - s)), s = sigmoid(x), from the saved input alone (aten's
    silu_backward computes exactly this in one pass; it is differentiable again)."""
    return torch.ops.aten.silu_backward(dy, x)


class SiLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return silu_fwd(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return silu_bwd(dy, x)


def silu_me(x: torch.Tensor) -> torch.Tensor:
    """SiLU that saves only its input for backward."""
    return SiLUFunction.apply(x)


class SiLUMemEff(nn.Module):
    """Drop-in for nn.SiLU. `inplace` is accepted for signature compatibility and ignored (an
    in-place SiLU would overwrite the input this op saves). `impl` picks a registered "silu"
    impl: "function" (plain torch, any device), "cpu" (C++ kernel), "triton" (CUDA)."""

    def __init__(self, inplace: bool = False, impl: str = "function"):
        super().__init__()
        self.set_impl(impl)

    def set_impl(self, impl: str) -> None:
        self._fn = get_impl("silu", impl).fn     # resolved once; UsageError if unknown
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x)

    def extra_repr(self) -> str:
        return f"impl={self.impl}"


@register_impl("silu", "eager")
def silu_eager(x):
    """F.silu (aten): saves x."""
    return F.silu(x)


@register_impl("silu", "naive")
def silu_naive(x):
    """x * torch.sigmoid(x) as users write it: saves x and sigmoid(x)."""
    return x * torch.sigmoid(x)


@register_impl("silu", "function")
def silu_function(x):
    """autograd.Function in plain torch ops: saves only x."""
    return SiLUFunction.apply(x)
