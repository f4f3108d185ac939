"""What every Triton kernel family needs: is Triton usable on this device, and the two integer
helpers its launch grids use. Shared here so families never import each other."""
from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def _has_triton() -> bool:  # find_spec walks sys.path: once, not on every call
    return importlib.util.find_spec("triton") is not None


def available(device: str = "cuda") -> tuple[bool, str]:
    if not _has_triton():
        return False, "triton is not installed (pip install triton)"
    if str(device).startswith("cuda"):
        if not torch.cuda.is_available():
            return False, "CUDA is not available"
        return True, ""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
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
