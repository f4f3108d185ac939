"""The SE gate's (N, C)-sized maths, shared by every se_gate impl and se_project: s from the
logits g, and ds/dg from s. The x-sized work (x * s and its backward) is the impls' own.

`hard` is 0 for sigmoid, else the hardsigmoid's slope inside its clamps: ATEN_SIXTH for
F.hardsigmoid / nn.Hardsigmoid (aten's backward multiplies by 1.0f / 6.0f, a float constant,
in float64 too: 3e-8 off 1/6), EXACT_SIXTH for relu6(g + 3) / 6 written out (autograd of the
division). Each gives the same numbers as eager for its spelling."""
from __future__ import annotations

import torch
import torch.nn.functional as F

ATEN_SIXTH = float(torch.tensor(1 / 6, dtype=torch.float32))
EXACT_SIXTH = 1 / 6


def gate_of(g: torch.Tensor, hard: float = 0.0) -> torch.Tensor:
    """s = sigmoid(g), or hardsigmoid(g) (aten's: relu6(g + 3) / 6, the same bits)."""
    return F.hardsigmoid(g) if hard else torch.sigmoid(g)


def gate_grad(s: torch.Tensor, hard: float = 0.0) -> torch.Tensor:
    """ds/dg from s itself, so a backward needs only s: s (1 - s), or `hard` where 0 < s < 1
    (aten takes -3 < g < 3 strictly: the same set, up to the rounding of g + 3 within one ulp
    of either end)."""
    return ((s > 0) & (s < 1)).to(s.dtype) * hard if hard else s * (1 - s)
