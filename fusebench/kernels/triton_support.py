"""What every Triton kernel family needs: is Triton usable on this device, and the two integer
helpers its launch grids use. Shared here so families never import each other."""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re

import torch


@functools.cache
def _has_triton() -> bool:  # find_spec walks sys.path: once, not on every call
    return importlib.util.find_spec("triton") is not None


@dataclasses.dataclass(frozen=True)
class InterpreterLimit:
    """Triton interpreters older than `below` fail our kernels (where numpy is at least
    `numpy_from`, if given): measured with every kernel family's tests on CPU tensors."""
    below: tuple[int, int]
    numpy_from: tuple[int, int] | None
    why: str


INTERPRETER_LIMITS = (
    InterpreterLimit((3, 2), None, "computes wrong values for these kernels (measured on "
                                   "triton 3.0 and 3.1)"),
    InterpreterLimit((3, 7), (2, 4), "converts 1-element arrays with int(), which numpy 2.4 "
                                     "refuses (measured on triton 3.2-3.6; numpy < 2.4 runs "
                                     "them)"),
)

FIRST_RUNNING = max(limit.below for limit in INTERPRETER_LIMITS)


def _version(dist: str) -> tuple[int, int] | None:
    """(major, minor) of an installed distribution (nightlies ship triton as pytorch-triton)."""
    from importlib import metadata
    for name in (dist, f"pytorch-{dist}"):
        try:
            text = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        parts = re.match(r"(\d+)\.(\d+)", text)
        return (int(parts[1]), int(parts[2])) if parts else None
    return None


@functools.cache
def interpreter_reason() -> str:
    """Why this triton's interpreter cannot run our kernels, or "" where it can."""
    return interpreter_reason_for(_version("triton"), _version("numpy"))


def interpreter_reason_for(triton: tuple[int, int] | None, numpy: tuple[int, int] | None) -> str:
    for limit in INTERPRETER_LIMITS:
        if triton is None or triton >= limit.below:
            continue
        if limit.numpy_from is None or (numpy is not None and numpy >= limit.numpy_from):
            return (f"triton {triton[0]}.{triton[1]}'s interpreter (TRITON_INTERPRET=1) "
                    f"{limit.why}; triton >= {FIRST_RUNNING[0]}.{FIRST_RUNNING[1]} runs them")
    return ""


def available(device: str = "cuda") -> tuple[bool, str]:
    if not _has_triton():
        return False, "triton is not installed (pip install triton)"
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return True, ""
    if os.environ.get("TRITON_INTERPRET") == "1":
        reason = interpreter_reason()
        return not reason, reason
    return False, f"triton runs on CUDA (on {device} only with TRITON_INTERPRET=1)"


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dense_layout(x: torch.Tensor) -> tuple[torch.Tensor, torch.memory_format]:
    """x in a layout the NCHW/channels-last kernels index directly (a copy only when x is
    neither), and the memory format to give their outputs."""
    if x.is_contiguous():
        return x, torch.contiguous_format
    if x.is_contiguous(memory_format=torch.channels_last):
        return x, torch.channels_last
    return x.contiguous(), torch.contiguous_format
