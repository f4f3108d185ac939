"""What a cell tells the runner while it runs (cell/worker.py gives every cell a Reporter):
phases, steps done/total with the step's time and an ETA for the phase, and facts learnt on the
way. One stdout line each (prefixes in protocol.py); run/progress.py's CellState reads them, so
a cell the runner has to kill still becomes a record that says how far it got."""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable

from fusebench.protocol import PHASE_PREFIX, STATE_PREFIX


def print_phase(name: str) -> None:
    print(PHASE_PREFIX + name, flush=True)


def print_state(obj: dict) -> None:
    print(STATE_PREFIX + json.dumps(obj, allow_nan=False), flush=True)


class Reporter:
    """Called with a phase name (`reporter("warmup")`), as the plain phase callback was; plus
    `expect(total)`, `step(done, ms)` and `note(img_size=288)`."""

    def __init__(self, on_phase: Callable[[str], None] = print_phase,
                 on_state: Callable[[dict], None] = print_state,
                 clock: Callable[[], float] = time.monotonic):
        self._on_phase, self._on_state, self._clock = on_phase, on_state, clock
        self._phase, self._t0, self.total = "start", clock(), 0
        self.facts: dict = {}      # what note() said, for the worker's own error record

    @classmethod
    def of(cls, phase_fn) -> "Reporter":
        """A Reporter from what a cell was given: a plain callable (repro scripts, tests) hears
        the phase names only."""
        return phase_fn if isinstance(phase_fn, Reporter) else cls(phase_fn, lambda obj: None)

    def __call__(self, name: str) -> None:
        self._phase, self._t0, self.total = name, self._clock(), 0
        self._on_phase(name)

    def note(self, **facts) -> None:
        """Facts the runner keeps for a record it may have to write itself (img_size, ...)."""
        self.facts.update(facts)
        self._on_state({"note": facts})

    def expect(self, total: int) -> None:
        """The current phase will run `total` steps (may be revised: calibration)."""
        self.total = total

    def step(self, done: int, ms: float | None) -> None:
        """Step `done` of the current phase finished (ms None: its time is not known yet)."""
        spent = self._clock() - self._t0
        eta = spent / done * max(self.total - done, 0) if done > 0 else None
        self._on_state({"phase": self._phase, "done": done, "total": self.total,
                        "ms": ms if ms is None or math.isfinite(ms) else None,
                        "eta_s": round(eta, 1) if eta is not None else None})
