"""The models of benchmarks/aa_variance.py: a zoo model, and the same made slower on purpose.

`aa_models.py:a` and `aa_models.py:a2` build MODEL (env FUSEBENCH_AA_MODEL, default
convnext_atto) as they are: two names for one build, so one run can hold both sides of an A/A
pair as two cells (interleaved processes, run/schedule.py). `aa_models.py:slowed` builds the
same and sleeps FUSEBENCH_AA_SLOWDOWN (default 0.25) x the previous step's own time at the
start of each forward: every step (forward, backward, optimizer, the harness between steps)
then takes (1 + f) x as long, whatever the machine's speed. The benchmark saves the three
records under one model name, so `compare` pairs them as the same cell.
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


def _inner(**kwargs) -> nn.Module:
    from fusebench.models import create_model
    return create_model(os.environ.get("FUSEBENCH_AA_MODEL", "convnext_atto"), **kwargs)


def a(**kwargs) -> nn.Module:
    return Slowed(_inner(**kwargs), 0.0)     # the same wrapper: only the sleep differs


def a2(**kwargs) -> nn.Module:
    return a(**kwargs)


def slowed(**kwargs) -> nn.Module:
    return Slowed(_inner(**kwargs), float(os.environ.get("FUSEBENCH_AA_SLOWDOWN") or 0.25))
