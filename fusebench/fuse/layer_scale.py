"""A layer scale (`gamma * fc2(g)`, ConvNeXt's and CaiT's) folded into fc2's weight and bias,
and the gradients of the three from the folded weight's: the MLP sites run fc2 with the folded
weight, so the multiply costs no pass over the activations. Where fc2's weight is larger than
its output (a late stage's few rows), the layer-by-layer site scales the output instead
(`on_rows`, `scaled`, `scaled_grads`)."""
from __future__ import annotations

import torch


def _along(gamma: torch.Tensor, t: torch.Tensor, cdim: int) -> torch.Tensor:
    """gamma shaped to broadcast along t's channel dim cdim."""
    return gamma.reshape(-1, *[1] * (t.dim() - 1 - cdim % t.dim()))


def fold(w2, b2, gamma):
    """(w2', b2') with fc2'(g) == gamma * fc2(g); (w2, b2) as they are where gamma is None.

    The sites fold in forward and again in backward rather than save w2': a saved weight would
    cost more than the activations it serves at a network's late stages (ConvNeXt-T's stage 4
    at b8, 160 px: 9.4 MB of w2' against 0.6 MB of rows), and folding costs fused mode no more
    than eager's multiply costs eager (with / without gamma: fused 1.018x, eager 1.026x;
    docs/fused.md, fortieth session)."""
    if gamma is None:
        return w2, b2
    return w2 * _along(gamma, w2, 0), None if b2 is None else b2 * gamma


def unfold_grads(dw2f, db2f, w2, b2, gamma, gamma_shape) -> tuple[tuple, tuple]:
    """((dw2[, db2]), (dgamma,) or ()) from the folded weight's and bias's gradients."""
    if gamma is None:
        return ((dw2f, db2f) if b2 is not None else (dw2f,)), ()
    dgam = (dw2f * w2).flatten(1).sum(1) + (db2f * b2 if b2 is not None else 0)
    dw2 = dw2f * _along(gamma, w2, 0)
    return ((dw2, db2f * gamma) if b2 is not None else (dw2,)), (dgam.reshape(gamma_shape),)


def on_rows(w2: torch.Tensor, out_numel: int) -> bool:
    """Scale fc2's output by gamma rather than fold gamma into its weight: where the weight is
    the larger, the fold's weight-sized passes (w2 * gamma in forward and again in backward,
    gamma's and w2's gradients: four reads of a cold weight a step) cost more than two passes
    over the output. ConvNeXt-atto's stage 4 at b8, 160 px: 200 rows x 320 against a 320 x 1280
    weight (the fold's [320, 1280] multiplies took 0.27 ms each in the 2-thread step, 2.9 ms of
    fold and unfold a step in all; docs/fused.md, forty-second session)."""
    return w2.numel() > out_numel


def scaled(t, gamma, cdim: int, res=None):
    """gamma * t along t's channel dim [+ res], one pass over t."""
    g = _along(gamma, t, cdim)
    return t * g if res is None else torch.addcmul(res, t, g)


def scaled_grads(dy, t, gamma, cdim: int, gamma_shape) -> tuple:
    """(dt, dgamma) of scaled(t, gamma): t is fc2's unscaled output, saved in forward."""
    g = _along(gamma, t, cdim)
    other = [d for d in range(t.dim()) if d != cdim % t.dim()]
    return dy * g, (dy * t).sum(other).reshape(gamma_shape)
