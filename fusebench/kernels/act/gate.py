"""The SE gate's (N, C)-sized maths, shared by every se_gate impl and se_project: s from the
logits g, and ds/dg from s. The x-sized work (x * s and its backward) is the impls' own."""
from __future__ import annotations

import torch
import torch.nn.functional as F


# aten's hardsigmoid_backward multiplies by 1.0f / 6.0f, a float constant, in every dtype
# (float64 included: 3e-8 off 1/6); the same constant gives the same numbers as eager
SIXTH = float(torch.tensor(1 / 6, dtype=torch.float32))


def gate_of(g: torch.Tensor, hard: bool = False) -> torch.Tensor:
    """s = sigmoid(g), or hardsigmoid(g) (aten's: relu6(g + 3) / 6)."""
    return F.hardsigmoid(g) if hard else torch.sigmoid(g)


def gate_grad(s: torch.Tensor, hard: bool = False) -> torch.Tensor:
    """ds/dg from s itself, so a backward needs only s: s (1 - s), or SIXTH where 0 < s < 1
    (aten's hardsigmoid_backward takes -3 < g < 3 strictly: the same set, up to the rounding
    of g + 3 within one ulp of either end)."""
    return ((s > 0) & (s < 1)).to(s.dtype) * SIXTH if hard else s * (1 - s)
