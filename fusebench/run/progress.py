"""Progress display while cells run: cell k/n, label, phase. Written to stderr so --json's
stdout stays a clean document."""
from __future__ import annotations

import threading

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.progress import TimeElapsedColumn


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
            self._p.console.print(f"  {self._label}: {status}", highlight=False)
