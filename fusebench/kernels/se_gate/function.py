"""SE gate: y = x * sigmoid(g), g = gate logits (N, C, 1, 1) broadcast over H, W; with
hard (a slope, kernels/act/gate.py) the gate is hardsigmoid(g) = relu6(g + 3) / 6
(MobileNetV3's SE).

Four layers: se_gate_fwd / se_gate_bwd -> SEGateFunction -> se_gate -> SEGate. Saves x and the
small g; backward is dx = dy * sigmoid(g), dg = sum_hw(dy * x) * s * (1 - s). Eager autograd
saves x and sigmoid(g) (the same bytes); the gain is in time: the C++/Triton backward computes
dx and the per-channel dot in one pass instead of materialising dy * x."""
from __future__ import annotations

import torch
import torch.nn as nn

from fusebench.kernels.act.gate import gate_grad, gate_of
from fusebench.kernels.checks import check_gate
from fusebench.kernels.registry import get_impl, register_impl


def se_gate_reference(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """float64 ground truth."""
    return x.double() * torch.sigmoid(g.double())


def se_gate_fwd(x: torch.Tensor, g: torch.Tensor, hard: float = 0.0) -> torch.Tensor:
    return x * gate_of(g, hard)


def se_gate_bwd(dy, x, g, hard: float = 0.0):
    """(dx, dg) from the saved x and g."""
    s = gate_of(g, hard)                                        # (N, C, 1, 1)
    dx = dy * s
    dg = (dy * x).sum((2, 3), keepdim=True, dtype=s.dtype) * gate_grad(s, hard)
    return dx, dg.to(g.dtype)


class SEGateFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, g):
        ctx.save_for_backward(x, g)
        return se_gate_fwd(x, g)

    @staticmethod
    def backward(ctx, dy):
        x, g = ctx.saved_tensors
        return se_gate_bwd(dy, x, g)


def se_gate(x: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate_logits), gate_logits (N, C, 1, 1); saves x and gate_logits only."""
    check_gate(x, gate_logits)
    return SEGateFunction.apply(x, gate_logits)


class SEGate(nn.Module):
    """forward(x, gate_logits) = x * sigmoid(gate_logits): replaces SqueezeExcite's
    `x * self.gate(s)` (the fuser keeps pool -> conv_reduce -> act -> conv_expand and feeds
    their output here as the logits). `impl` picks a registered "se_gate" impl."""

    def __init__(self, impl: str = "function"):
        super().__init__()
        self.set_impl(impl)

    def set_impl(self, impl: str) -> None:
        self._fn = get_impl("se_gate", impl).fn
        self.impl = impl

    def forward(self, x: torch.Tensor, gate_logits: torch.Tensor) -> torch.Tensor:
        return self._fn(x, gate_logits)

    def extra_repr(self) -> str:
        return f"impl={self.impl}"


@register_impl("se_gate", "eager")
def se_gate_eager(x, gate_logits):
    """x * torch.sigmoid(g) (SqueezeExcite's own code): saves x and sigmoid(g)."""
    return x * torch.sigmoid(gate_logits)


@register_impl("se_gate", "function")
def se_gate_function(x, gate_logits):
    """autograd.Function in plain torch ops: saves x and g."""
    return se_gate(x, gate_logits)
