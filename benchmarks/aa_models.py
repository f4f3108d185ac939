"""The model of benchmarks/aa_variance.py: a zoo model that can be made slower on purpose.

`aa_models.py:slowed` builds MODEL (env FUSEBENCH_AA_MODEL, default convnext_atto) and, when
FUSEBENCH_AA_SLOWDOWN=f is set, sleeps f x the previous step's own time at the start of each
forward: every step (forward, backward, optimizer, the harness between steps) then takes
(1 + f) x as long, whatever the machine's speed. The env var, not a model kwarg, carries the
slowdown so the slowed run has the same cell identity and `compare` matches it with the A run.
"""
from __future__ import annotations

import os
import time

import torch.nn as nn


class Slowed(nn.Module):
    def __init__(self, inner: nn.Module, slowdown: float):
        super().__init__()
        self.inner, self.slowdown = inner, slowdown
        self._start: float | None = None       # when the previous step's forward began
        self._slept = 0.0                      # of that step, time spent sleeping

    def forward(self, x):
        now = time.perf_counter()
        if self.slowdown > 0 and self._start is not None:
            work = max(0.0, now - self._start - self._slept)
            self._slept = self.slowdown * work
            time.sleep(self._slept)
        self._start = now
        return self.inner(x)


def slowed(**kwargs) -> nn.Module:
    from fusebench.models import create_model
    inner = create_model(os.environ.get("FUSEBENCH_AA_MODEL", "convnext_atto"), **kwargs)
    return Slowed(inner, float(os.environ.get("FUSEBENCH_AA_SLOWDOWN") or 0.0))
