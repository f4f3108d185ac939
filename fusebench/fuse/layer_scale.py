"""A layer scale (`gamma * fc2(g)`, ConvNeXt's and CaiT's) folded into fc2's weight and bias,
and the gradients of the three from the folded weight's: the MLP sites run fc2 with the folded
weight, so the multiply costs no pass over the activations."""
from __future__ import annotations

import torch


def _per_row(gamma: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return gamma.reshape(-1, *[1] * (w2.dim() - 1))


def fold(w2, b2, gamma):
    """(w2', b2') with fc2'(g) == gamma * fc2(g); (w2, b2) as they are where gamma is None.

    The sites fold in forward and again in backward rather than save w2': a saved weight would
    cost more than the activations it serves at a network's late stages (ConvNeXt-T's stage 4
    at b8, 160 px: 9.4 MB of w2' against 0.6 MB of rows), and folding costs fused mode no more
    than eager's multiply costs eager (with / without gamma: fused 1.018x, eager 1.026x;
    docs/fused.md, fortieth session)."""
    if gamma is None:
        return w2, b2
    return w2 * _per_row(gamma, w2), None if b2 is None else b2 * gamma


def unfold_grads(dw2f, db2f, w2, b2, gamma, gamma_shape) -> tuple[tuple, tuple]:
    """((dw2[, db2]), (dgamma,) or ()) from the folded weight's and bias's gradients."""
    if gamma is None:
        return ((dw2f, db2f) if b2 is not None else (dw2f,)), ()
    dgam = (dw2f * w2).flatten(1).sum(1) + (db2f * b2 if b2 is not None else 0)
    dw2 = dw2f * _per_row(gamma, w2)
    return ((dw2, db2f * gamma) if b2 is not None else (dw2,)), (dgam.reshape(gamma_shape),)
