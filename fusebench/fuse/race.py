"""Timing races between interchangeable implementations of one call, as cudnn.benchmark picks
a convolution algorithm: fuse/gemm.py's backends, fuse/patchify.py's GEMM or aten's conv."""
from __future__ import annotations

import math
import time
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
