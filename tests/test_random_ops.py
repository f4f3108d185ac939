"""Which random ops a step draws (measure/random_ops.py): what decides whether the correctness
check needs a mode's twin."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.measure.random_ops import describe, random_ops


class Noisy(nn.Module):
    def forward(self, x):
        return x + torch.rand(x.shape)


CASES = [
    (lambda: nn.Dropout(0.1).train(), {"aten.bernoulli_": 1}),
    (lambda: nn.Dropout(0.1).eval(), {}),
    (lambda: nn.Dropout(0.0).train(), {}),             # p=0: aten returns its input
    (lambda: nn.Sequential(nn.Linear(4, 4), nn.GELU()), {}),
    (lambda: Noisy(), {"aten.rand": 1}),
]


@pytest.mark.parametrize("make, want", CASES, ids=["dropout", "eval", "p0", "plain", "rand"])
def test_random_ops_of_a_forward_and_backward(make, want):
    m, x = make(), torch.randn(3, 4, requires_grad=True)
    assert dict(random_ops(lambda: m(x).sum().backward())) == want
    assert x.grad is not None                     # the step itself ran


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_attention_draws_only_with_a_dropout(p):
    """SDPA's kernels carry the seeded tag for their dropout; with dropout_p 0 (an
    nn.MultiheadAttention built without dropout, training) they draw nothing: counting them
    made compile cells build a correctness twin for nothing (a Conformer: 15 s)."""
    mha = nn.MultiheadAttention(8, 2, dropout=p).train()
    x = torch.randn(5, 2, 8, requires_grad=True)
    state = torch.get_rng_state()
    ops = random_ops(lambda: mha(x, x, x, need_weights=False)[0].sum().backward())
    assert torch.equal(state, torch.get_rng_state()) == (p == 0)
    assert bool(ops) == (p > 0), ops
    assert x.grad is not None


def test_a_functional_dropout_in_float64_and_the_description():
    x = torch.randn(2, 5, dtype=torch.float64)
    ops = random_ops(lambda: F.dropout(F.dropout(x, 0.5), 0.2) + torch.randn_like(x))
    assert describe(ops) == "aten.bernoulli_ x2, aten.randn_like x1"
