"""The cyclic garbage collector, paused while a big results document is read and compared.

Reading 100,000 records allocates millions of dicts, lists and floats, all acyclic (parsed
JSON, NamedTuples, dataclasses): reference counting frees every one of them, but each
allocation burst still triggers the collector, whose full passes walk every live object.
Paused, load + compare of 100,000 records took ~20% less CPU (benchmarks/compare_scale.py);
what little cyclic garbage the pause leaves is collected once it ends.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic collection inside; the collector's state as it was afterwards (nests)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


BIG = 10_000   # records: below this a collection is cheap, and the CLI's tests run in-process


def settled(count: int) -> None:
    """`count` records are loaded and stay alive until the command ends: from a BIG count on,
    later collections skip what is alive now (gc.freeze) instead of walking it again."""
    if count >= BIG:
        gc.freeze()
