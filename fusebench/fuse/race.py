"""Timing races between interchangeable implementations of one call, as cudnn.benchmark picks
a convolution algorithm: fuse/gemm.py's backends, fuse/patchify.py's GEMM or aten's conv. Both
keep their verdicts per call key (Verdicts) and take a named choice or `auto` (Choice)."""
from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable


def best_times(sides: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """The fastest of `reps` timed runs of each side, in seconds. Each side runs once first to
    warm up (the first touch of its output, a library's primitive creation), then the sides
    alternate, so that a change in the machine's speed hits them alike."""
    best = dict.fromkeys(sides, math.inf)
    for fn in sides.values():
        fn()
    for _ in range(reps):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


class Verdicts(dict):
    """Each call key's winner, kept for the process: a call shape is raced once."""

    def winner(self, key, race: Callable[[], str]) -> str:
        if key not in self:
            self[key] = race()
        return self[key]

    def tally(self) -> Counter:
        """How many call keys each side won so far."""
        return Counter(self.values())

    def describe(self, what: str, noun: str, labels: dict[str, str]) -> str | None:
        """The event line: '<what>: auto raced N <noun>: <label> faster at k, ...' in `labels`'
        order, sides that won nothing left out (None: nothing raced yet)."""
        won = self.tally()
        if not won:
            return None
        return (f"{what}: auto raced {sum(won.values())} {noun}: "
                + ", ".join(f"{label} faster at {won[side]}" for side, label in labels.items()
                            if won[side]))


class Choice:
    """Which implementation a family of sites runs: one by name, or `auto` (raced per call
    shape). `check(name)` returns the name or raises UsageError; `set` changes the process's
    choice, `using` a block's."""

    def __init__(self, check: Callable[[str], str], default: str = "auto"):
        self._check, self.name = check, default

    def set(self, name: str) -> None:
        self.name = self._check(name)

    @contextlib.contextmanager
    def using(self, name: str):
        old, self.name = self.name, self._check(name)
        try:
            yield
        finally:
            self.name = old
