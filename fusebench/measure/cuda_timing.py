"""Kernel timing on CUDA the way triton.testing.do_bench does it, plus the device time.

Two times per kernel cell, each for the kernel's step and for a copy of the same tensor:
- step time: CUDA events around each repetition, with a cache-sized buffer written just before
  it (the L2 flush), so no repetition finds its inputs in L2. Host-inclusive: the GPU is idle
  at the start event (the host waited for the flush), so when the host issues kernels slower
  than the GPU runs them, the events span the host's launches.
- device time: the step captured once in a CUDA graph and replayed (no host launches), or, when
  capture fails (a host sync, a CPU op), the sum of the step's kernel times from torch.profiler.

A step slower than twice its device time is `launch_bound`: what was measured is the host
issuing kernels, not the kernels. `pct_of_copy` is given for both times.

The CUDA calls go through a small `Backend` (torch.cuda by default) so the loops run under test
on CPU with a fake one; the decisions (flush size, launch-bound, percentages) are pure functions.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

MiB = 2 ** 20
FLUSH_DEFAULT = 256 * MiB   # do_bench's fixed buffer, used when the L2 size is unknown
FLUSH_L2_MULTIPLE = 4       # write several L2s' worth: replacement is not strict LRU
FLUSH_MAX_MEM_FRACTION = 1 / 16
LAUNCH_BOUND_FACTOR = 2.0


# ------------------------------------------------------------------------------- pure decisions
def flush_bytes(l2_bytes: int | None, total_mem_bytes: int | None) -> int:
    """Size of the buffer written between repetitions: FLUSH_L2_MULTIPLE x the L2 (at least
    do_bench's 256 MiB), capped at 1/16 of device memory; 256 MiB when the L2 size is unknown."""
    want = max(FLUSH_L2_MULTIPLE * l2_bytes, FLUSH_DEFAULT) if l2_bytes else FLUSH_DEFAULT
    if total_mem_bytes:
        want = min(want, int(total_mem_bytes * FLUSH_MAX_MEM_FRACTION))
    return max(MiB, want // MiB * MiB)


def flush_bytes_for(props: Any) -> int:
    """flush_bytes from torch.cuda.get_device_properties(...) (or anything with its fields)."""
    return flush_bytes(getattr(props, "L2_cache_size", None), getattr(props, "total_memory", None))


def is_launch_bound(step_ms: float | None, device_ms: float | None,
                    factor: float = LAUNCH_BOUND_FACTOR) -> bool:
    return bool(step_ms and device_ms and step_ms > factor * device_ms)


def launch_bound_message(step_ms: float, device_ms: float) -> str:
    return (f"step {step_ms:.4g} ms is {step_ms / device_ms:.1f}x the device time "
            f"{device_ms:.4g} ms: launch overhead, not the kernels, sets the step time")


def gbps(nbytes: int, ms: float | None) -> float | None:
    return nbytes / ms / 1e6 if ms and ms > 0 else None


def pct(value: float | None, of: float | None) -> float | None:
    return 100.0 * value / of if value is not None and of else None


def bandwidth_fields(nbytes: int, copy_bytes: int, step_ms: float, device_ms: float | None,
                     copy_step_ms: float, copy_device_ms: float | None) -> dict[str, Any]:
    """The record's figures for both times: gbps / pct_of_copy from the step time (as on CPU),
    device_gbps / pct_of_copy_device from the device times of the kernel and of the copy."""
    step_gbps, copy_gbps = gbps(nbytes, step_ms), gbps(copy_bytes, copy_step_ms)
    dev_gbps, copy_dev_gbps = gbps(nbytes, device_ms), gbps(copy_bytes, copy_device_ms)
    return {"gbps": step_gbps, "pct_of_copy": pct(step_gbps, copy_gbps),
            "copy_gbps": copy_gbps, "device_gbps": dev_gbps, "copy_device_gbps": copy_dev_gbps,
            "pct_of_copy_device": pct(dev_gbps, copy_dev_gbps)}


def kernel_ms(profiler_events: Iterable[Any], n: int) -> float | None:
    """Mean device time per step from torch.profiler key_averages(): the sum of the device
    (kernel, memset, memcpy) self times, in us, over n steps. None when nothing ran on the GPU."""
    total_us = 0.0
    for e in profiler_events:
        if "cuda" in str(getattr(e, "device_type", "")).lower():
            total_us += float(getattr(e, "self_device_time_total", 0.0) or 0.0)
    return total_us / 1e3 / n if total_us > 0 and n > 0 else None


def median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# ------------------------------------------------------------------------------------- backend
class Backend:
    """The CUDA calls the timing loops make (torch.cuda); tests pass a CPU fake."""

    def __init__(self, device: str):
        import torch
        self.torch = torch
        self.device = torch.device(device)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def flush_buffer(self):
        props = self.torch.cuda.get_device_properties(self.device)
        return self.torch.empty(flush_bytes_for(props) // 4, dtype=self.torch.int32,
                                device=self.device)

    def capture(self, fn: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
        """fn captured in a CUDA graph -> its replay. Warm-up on a side stream first, as the
        CUDA-graphs notes prescribe (lazy init and autotuning must not land in the capture)."""
        cuda = self.torch.cuda
        side = cuda.Stream(self.device)
        side.wait_stream(cuda.current_stream(self.device))
        with cuda.stream(side):
            for _ in range(warmup):
                fn()
        cuda.current_stream(self.device).wait_stream(side)
        graph = cuda.CUDAGraph()
        with cuda.graph(graph):
            fn()
        return graph.replay

    def profile_kernel_ms(self, fn: Callable[[], object], n: int) -> float | None:
        from torch.profiler import ProfilerActivity, profile
        self.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            self.synchronize()
        return kernel_ms(prof.key_averages(), n)


# ------------------------------------------------------------------------------------- timing
@dataclasses.dataclass(frozen=True)
class DeviceTime:
    ms: float | None
    source: str                 # "graph_replay", "profiler", or "none"
    note: str = ""              # why the graph was not used, when it was not


def flushed_step_ms(be, step: Callable[[], object], n: int, setup=None,
                    flush=None) -> list[float]:
    """do_bench's loop: per repetition, (setup,) write the flush buffer, event, step, event.
    Unlike do_bench, the host waits for the flush before the start event: otherwise it issues
    the step's first launches while the GPU is still flushing, and that head start hides part
    of the launch overhead a host-inclusive time is meant to show."""
    flush = be.flush_buffer() if flush is None else flush
    starts = [be.event() for _ in range(n)]
    ends = [be.event() for _ in range(n)]
    be.synchronize()
    for s, e in zip(starts, ends):
        if setup is not None:
            setup()
        flush.zero_()
        be.synchronize()
        s.record()
        step()
        e.record()
    be.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def replay_ms(be, replay: Callable[[], None], n: int, flush) -> float:
    """Median device time of n graph replays, each after the flush (outside the events)."""
    return median(flushed_step_ms(be, replay, n, flush=flush))


def device_time(be, step: Callable[[], object], n: int, setup=None, flush=None) -> DeviceTime:
    """The step's device time. With a setup (bwd: the forward), setup+step and setup alone are
    each measured and subtracted. Graph replay first, the profiler's kernel sum if capture fails."""
    flush = be.flush_buffer() if flush is None else flush
    full = step if setup is None else (lambda: (setup(), step()))
    try:
        ms = replay_ms(be, be.capture(full), n, flush)
        if setup is not None:
            ms -= replay_ms(be, be.capture(setup), n, flush)
        return DeviceTime(max(ms, 0.0), "graph_replay")
    except Exception as e:   # capture refused (sync inside, CPU op): kernel times instead
        note = f"graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    be.synchronize()
    ms = be.profile_kernel_ms(full, n)
    if ms is None:
        return DeviceTime(None, "none", note)
    if setup is not None:
        ms -= be.profile_kernel_ms(setup, n) or 0.0
    return DeviceTime(max(ms, 0.0), "profiler", note)


@dataclasses.dataclass(frozen=True)
class KernelTiming:
    step_ms: list[float]
    device: DeviceTime
    copy_step_ms: list[float]
    copy_device: DeviceTime
    flush_bytes: int


def time_kernel(be, step, setup, copy: Callable[[], object], n: int,
                around_steps=contextlib.nullcontext) -> KernelTiming:
    """Step and device time of the kernel's step and of the copy it is held to. The flushed
    steps alone run inside `around_steps()` (NVML telemetry: energy per step)."""
    flush = be.flush_buffer()
    with around_steps():
        steps = flushed_step_ms(be, step, n, setup, flush)
    dev = device_time(be, step, n, setup, flush)
    copies = flushed_step_ms(be, copy, max(n, 5), None, flush)
    copy_dev = device_time(be, copy, max(n, 5), None, flush)
    nbytes = flush.numel() * flush.element_size()
    return KernelTiming(steps, dev, copies, copy_dev, nbytes)


def record_fields(t: KernelTiming, nbytes: int, copy_bytes: int, events) -> dict[str, Any]:
    """extra fields (and events) for a kernel record from one KernelTiming."""
    step_med, copy_med = median(t.step_ms), median(t.copy_step_ms)
    out = bandwidth_fields(nbytes, copy_bytes, step_med, t.device.ms, copy_med, t.copy_device.ms)
    out.update(device_ms=t.device.ms, device_time_source=t.device.source,
               copy_device_ms=t.copy_device.ms, l2_flush_bytes=t.flush_bytes)
    if t.device.note:
        events.add("info", "cuda_timing", t.device.note)
    if t.device.ms is None:
        events.add("info", "cuda_timing", "no device time: neither graph replay nor the "
                                          "profiler measured the step")
    if is_launch_bound(step_med, t.device.ms):
        events.add("launch_bound", "cuda_timing", launch_bound_message(step_med, t.device.ms))
    return out

