"""Per-step timing. CUDA events on GPU (device time, no host sync inside the loop); on CPU a
perf_counter around work that is synchronous by construction."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: str | torch.device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def time_steps(step: Callable[[], object], n: int, device: str | torch.device) -> list[float]:
    """Run `step` n times; return each step's time in milliseconds."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if _is_cuda(device):
        return _time_cuda(step, n, torch.device(device))
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _time_cuda(step, n: int, device: torch.device) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        for s, e in zip(starts, ends):
            s.record()
            step()
            e.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_call(fn: Callable[[], object], device: str | torch.device) -> tuple[float, object]:
    """Wall seconds of one synchronised call (first-call / compile cost) and its result."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out
