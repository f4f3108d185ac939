"""Model size and work: parameter count and forward GFLOPs per sample."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode


def count_params(model: nn.Module) -> int:
    """All parameters (trainable or not); shared parameters count once."""
    return sum(p.numel() for p in model.parameters())


def forward_gflops_per_sample(model: nn.Module, example_input: torch.Tensor) -> float:
    """Forward FLOPs / batch size / 1e9. FlopCounterMode counts a multiply-add as 2 FLOPs.

    Only ops with a FLOP formula are counted (matmul, conv, attention...); elementwise ops,
    norms and pooling count 0, as in every common FLOP counter.
    """
    batch = example_input.shape[0]
    if batch < 1:
        raise ValueError("example_input needs a batch dimension of at least 1")
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(example_input)
    return counter.get_total_flops() / batch / 1e9
