"""Transparent-huge-page hint for fresh CPU outputs, for the copy the kernels are held to.

The bundled C++ kernels madvise(MADV_HUGEPAGE) their large outputs before writing them (see
ln2d/cpu.cpp: page faults on a fresh tens-of-MiB output cost more than the arithmetic). A % of
copy bandwidth is only fair if the copy it is measured against may do the same, so the
reference copy uses this helper on its own fresh output."""
from __future__ import annotations

import ctypes
import functools
import sys

import torch

_MADV_HUGEPAGE = 14   # linux/mman.h
_HUGE = 1 << 21       # 2 MiB pages on x86-64 and aarch64 (4K base pages)
_MIN_BYTES = 32 << 20  # as huge_pages.h: only where glibc surely maps fresh memory


@functools.cache
def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def available() -> bool:
    return _madvise() is not None


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Hint huge pages for the 2 MiB-aligned part of t's (untouched) CPU storage; True if asked.

    Only a hint: where THP is off, or the pages were touched already, nothing changes."""
    fn = _madvise()
    if fn is None or t.device.type != "cpu" or t.nbytes < _MIN_BYTES:
        return False
    p = t.data_ptr()
    start, end = (p + _HUGE - 1) & ~(_HUGE - 1), (p + t.nbytes) & ~(_HUGE - 1)
    return end > start and fn(start, end - start, _MADV_HUGEPAGE) == 0


def empty_like_huge(x: torch.Tensor) -> torch.Tensor:
    """torch.empty_like(x) with the huge-page hint on its fresh storage (as our kernels do)."""
    out = torch.empty_like(x)
    advise_huge_pages(out)
    return out
