"""Progress display while cells run: cell k/n, label, phase, steps done/total and an ETA.
Written to stderr so --json's stdout stays a clean document.

`CellState` is the runner's side of the worker's stdout protocol (cell/report.py): the
last phase, step counts and every step time seen, so a cell that has to be killed still
becomes a record that says where it stopped and keeps its samples."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.progress import TimeElapsedColumn

from fusebench.protocol import PHASE_PREFIX, STATE_PREFIX


def _duration(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


@dataclass
class CellState:
    """What the runner knows of a running cell, from the worker's phase and state lines."""
    phase: str = "start"
    done: int = 0
    total: int | None = None
    eta_s: float | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)   # phase -> step ms
    facts: dict = field(default_factory=dict)                        # note(...) from the cell

    def feed(self, line: str) -> bool:
        """Take one stdout line; True when it changed what the display shows."""
        if line.startswith(PHASE_PREFIX):
            self.phase, self.done, self.total, self.eta_s = line[len(PHASE_PREFIX):], 0, None, None
            return True
        if not line.startswith(STATE_PREFIX):
            return False                 # the model's own prints
        try:
            msg = json.loads(line[len(STATE_PREFIX):])
        except ValueError:
            return False
        if not isinstance(msg, dict):
            return False
        if isinstance(msg.get("note"), dict):
            self.facts.update(msg["note"])
            return False
        self.done, self.total, self.eta_s = msg.get("done", 0), msg.get("total"), msg.get("eta_s")
        if isinstance(msg.get("ms"), (int, float)):
            self.samples.setdefault(msg.get("phase") or self.phase, []).append(float(msg["ms"]))
        return True

    def text(self) -> str:
        """'timing 5/20, ~12 s left' (the phase name alone before its first step)."""
        if not self.total:
            return self.phase
        out = f"{self.phase} {self.done}/{self.total}"
        return out + (f", ~{_duration(self.eta_s)} left" if self.eta_s is not None else "")

    def stopped(self) -> dict:
        """For the record of a cell that did not finish: where it was, and what it had timed."""
        return {"phase": self.phase, "steps_done": self.done, "steps_total": self.total,
                "samples_ms": {k: list(v) for k, v in self.samples.items()}}

    def where(self) -> str:
        """'in timing after 5/20 steps', for an error message."""
        steps = f" after {self.done}/{self.total} steps" if self.total else ""
        return f"in {self.phase}{steps}"


def outcome(rec) -> str:
    """A finished cell's line: 'ok (22 steps x 1.34 s)', 'timeout in timing after 5/22 steps'."""
    timing, stopped = rec.extra.get("timing"), rec.extra.get("stopped")
    if rec.status == "ok" and isinstance(timing, dict) and rec.step_ms:
        how = ", calibrated" if timing.get("source") == "budget" else ""
        return f"ok ({rec.step_ms.n} steps x {_seconds(rec.step_ms.median / 1e3)}{how})"
    if isinstance(stopped, dict):
        done, total = stopped.get("steps_done"), stopped.get("steps_total")
        steps = f" after {done}/{total} steps" if total else ""
        return f"{rec.status} in {stopped.get('phase')}{steps}"
    return rec.status


def _seconds(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


class CellProgress:
    def __init__(self, total: int, enabled: bool = True, console: Console | None = None):
        self.enabled = enabled
        self.total = total
        self._label = ""
        self._lock = threading.Lock()
        if enabled:
            self._p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(),
                               console=console or Console(stderr=True), transient=True)
            self._task = self._p.add_task("starting", total=total)

    def __enter__(self):
        if self.enabled:
            self._p.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self._p.__exit__(*exc)
        return False

    def start(self, index: int, label: str) -> None:
        self._label = f"cell {index + 1}/{self.total} {label}"
        self.phase("start")

    def phase(self, name: str) -> None:  # called from the worker's stdout reader thread
        if self.enabled:
            with self._lock:
                self._p.update(self._task, description=f"{self._label}: {name}")

    def done(self, status: str) -> None:
        if self.enabled:
            self._p.advance(self._task)
            self._p.console.print(f"  {self._label}: {status}", highlight=False,
                                  soft_wrap=True)
