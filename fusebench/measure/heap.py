"""glibc malloc settings for the timed steps of a CPU cell: a registry of named policies.

glibc's mmap threshold starts at 128 KiB and rises to the size of the largest mmapped block
freed so far (up to 32 MiB), the trim threshold with it: a process's history decides whether a
step's activations come from fresh mmaps (unmapped at free) or from the heap (kept, and
fragmenting). The float64 correctness run frees blocks twice the size of the step's, so after it
more of the timed steps' tensors stayed on the heap: --no-check changed the peak by ~5%. Every
policy here fixes the thresholds (mallopt also turns the dynamic rise off), so that what ran
before a cell's window does not decide its allocator.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

# mallopt parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20       # where glibc's dynamic rise ends on 64-bit (its maximum)


@dataclass(frozen=True)
class HeapPolicy:
    name: str
    trim_threshold: int     # free heap top above this goes back to the OS; -1: never
    short: str              # the CLI's help
    doc: str
    mmap_threshold: int = MMAP_THRESHOLD   # blocks this big are mmapped (unmapped at free)

    def apply(self) -> bool:
        """Set this policy; False where there is no glibc (nothing is changed then)."""
        return (_mallopt(_M_MMAP_THRESHOLD, self.mmap_threshold)
                and _mallopt(_M_TRIM_THRESHOLD, self.trim_threshold))


def _mallopt(param: int, value: int) -> bool:
    """glibc's mallopt; False where there is none (or it refused the value)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(param, value))
    except (OSError, AttributeError):
        return False


HEAP_POLICIES: dict[str, HeapPolicy] = {}


def _register(p: HeapPolicy) -> None:
    HEAP_POLICIES[p.name] = p


# The default. Under `trim` an efficientnet_b3 eager step (b8, 160 px) re-faulted 56,000-69,000
# pages that glibc had just given back and ran up to 1.25x slower than here, while the fused
# steps moved both ways: the allocator, not the modes, made up part of fused/eager
# (docs/measurement.md, fifteenth session).
_register(HeapPolicy(
    "keep", -1, "the heap is never trimmed, as under tcmalloc or jemalloc",
    "freed heap memory stays with the process: after warm-up a step reuses the pages it "
    "faulted in, as under the caching allocators torch.backends.xeon.run_cpu preloads "
    "(tcmalloc by default, or jemalloc). Blocks of 32 MiB and more stay mmapped: with mmap off "
    "too (M_MMAP_MAX 0), posix_memalign's padding kept a freed 64 MiB block from fitting the "
    "next request of the same size, and the heap grew by 64 MiB per step"))
_register(HeapPolicy(
    "trim", 2 * MMAP_THRESHOLD, "plain glibc after warm-up (64 MiB trim threshold)",
    "glibc's thresholds where its dynamic rise ends (32 MiB mmap, 64 MiB trim): the heap top "
    "goes back to the OS whenever more than 64 MiB of it is free, as in a plain glibc process "
    "after warm-up; whether a step crosses that depends on the heap's history"))

DEFAULT_HEAP = "keep"


def heap_policy(name: str | None) -> HeapPolicy:
    """The policy called name; None: the default."""
    if name is None:
        name = DEFAULT_HEAP
    try:
        return HEAP_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown heap policy {name!r}; choose from "
                         f"{', '.join(HEAP_POLICIES)}") from None


def set_trim_threshold(nbytes: int) -> None:
    """Only the trim threshold (the correctness run's own arena between windows: see
    PeakMemory.aside)."""
    _mallopt(_M_TRIM_THRESHOLD, nbytes)
