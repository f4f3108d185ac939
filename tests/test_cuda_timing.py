"""do_bench-style CUDA kernel timing (measure/cuda_timing.py) on CPU: the pure decisions (flush
size from device properties, launch-bound, percentages, profiler sums) and the timing loops
driven through a fake backend that keeps a log of what a GPU would have been asked to do."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from fusebench.measure import cuda_timing as ct
from fusebench.measure.events import EventLog

MiB = 2 ** 20


@pytest.mark.parametrize("l2, total, want", [
    (50 * MiB, 141 * 2 ** 30, 256 * MiB),        # H200-class: 4 x 50 MiB < do_bench's 256 MiB
    (96 * MiB, 192 * 2 ** 30, 384 * MiB),        # a larger L2: 4 x L2
    (None, 80 * 2 ** 30, 256 * MiB),             # unknown L2: do_bench's buffer
    (40 * MiB, 2 * 2 ** 30, 128 * MiB),          # small device: capped at 1/16 of memory
    (0, None, 256 * MiB),
])
def test_flush_size_from_device_properties(l2, total, want):
    props = SimpleNamespace(L2_cache_size=l2, total_memory=total)
    assert ct.flush_bytes_for(props) == want
    if l2:
        assert want >= min(l2, (total or 2 ** 62) // 16)   # always at least one L2 when it fits


@pytest.mark.parametrize("step, device, bound", [
    (0.45, 0.085, True), (0.17, 0.085, False), (0.1701, 0.085, True), (1.0, None, False),
    (None, 0.1, False)])
def test_launch_bound_decision(step, device, bound):
    assert ct.is_launch_bound(step, device) is bound


def test_bandwidth_fields_give_pct_of_copy_for_both_times():
    f = ct.bandwidth_fields(nbytes=1_000_000, copy_bytes=2_000_000, step_ms=0.5, device_ms=0.1,
                            copy_step_ms=0.2, copy_device_ms=0.2)
    assert f["gbps"] == pytest.approx(2.0) and f["copy_gbps"] == pytest.approx(10.0)
    assert f["pct_of_copy"] == pytest.approx(20.0)
    assert f["device_gbps"] == pytest.approx(10.0)
    assert f["pct_of_copy_device"] == pytest.approx(100.0)
    none = ct.bandwidth_fields(1, 2, 0.5, None, 0.2, None)
    assert none["device_gbps"] is None and none["pct_of_copy_device"] is None


def test_profiler_sum_counts_device_events_only():
    ev = [SimpleNamespace(device_type="DeviceType.CUDA", self_device_time_total=300.0),
          SimpleNamespace(device_type="DeviceType.CUDA", self_device_time_total=100.0),
          SimpleNamespace(device_type="DeviceType.CPU", self_device_time_total=0.0)]
    assert ct.kernel_ms(ev, n=4) == pytest.approx(0.1)   # 400 us over 4 steps
    assert ct.kernel_ms(ev[2:], n=4) is None


class FakeEvent:
    def __init__(self, log):
        self.log, self.t = log, None

    def record(self):
        self.t = time.perf_counter()
        self.log.append("event")

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class FakeBackend:
    """What the loops ask of CUDA, on CPU: events are perf_counter stamps, the flush buffer a
    small tensor whose zero_() is logged, capture returns fn itself (or refuses)."""

    def __init__(self, capture_ok=True, kernel_ms=0.05):
        self.log: list[str] = []
        self.capture_ok, self._kernel_ms = capture_ok, kernel_ms

    def synchronize(self):
        self.log.append("sync")

    def event(self):
        return FakeEvent(self.log)

    def flush_buffer(self):
        buf = torch.empty(1024, dtype=torch.int32)
        log = self.log

        class Flush:
            def zero_(self):
                log.append("flush")
                buf.zero_()

            def numel(self):
                return buf.numel()

            def element_size(self):
                return buf.element_size()
        return Flush()

    def capture(self, fn, warmup=3):
        if not self.capture_ok:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.log.append("capture")
        return fn

    def profile_kernel_ms(self, fn, n):
        for _ in range(n):
            fn()
        self.log.append("profile")
        return self._kernel_ms


def test_flushed_loop_writes_the_buffer_before_every_timed_repetition():
    be, calls = FakeBackend(), []
    ms = ct.flushed_step_ms(be, lambda: (calls.append("step"), be.log.append("step")), n=3)
    assert len(ms) == 3 and all(m >= 0 for m in ms) and len(calls) == 3
    assert be.log[1:] == ["flush", "sync", "event", "step", "event"] * 3 + ["sync"]


def test_setup_runs_outside_the_events():
    be = FakeBackend()
    ct.flushed_step_ms(be, lambda: be.log.append("step"), n=2,
                       setup=lambda: be.log.append("setup"))
    assert be.log[1:-1] == ["setup", "flush", "sync", "event", "step", "event"] * 2


def test_device_time_by_graph_replay_and_launch_bound_event():
    be = FakeBackend()
    slow_host = lambda: time.sleep(0.002)          # noqa: E731  a step the host makes slow
    t = ct.time_kernel(be, slow_host, None, lambda: None, n=3)
    assert t.device.source == "graph_replay" and "capture" in be.log
    events = EventLog()
    # the fake replays the same host-bound fn, so fake a fast device time explicitly
    t = ct.KernelTiming(t.step_ms, ct.DeviceTime(0.1, "graph_replay"), t.copy_step_ms,
                        ct.DeviceTime(0.01, "graph_replay"), t.flush_bytes)
    fields = ct.record_fields(t, nbytes=10 ** 6, copy_bytes=10 ** 6, events=events)
    assert events.count("launch_bound") == 1
    assert fields["device_ms"] == 0.1 and fields["pct_of_copy_device"] == pytest.approx(10.0)
    assert fields["l2_flush_bytes"] == 4096


def test_capture_failure_falls_back_to_profiler_with_a_note():
    be = FakeBackend(capture_ok=False, kernel_ms=0.05)
    dev = ct.device_time(be, lambda: None, n=2, setup=lambda: None)
    assert dev.source == "profiler" and "graph capture failed" in dev.note
    assert dev.ms == 0.0        # setup+step minus setup alone: same fake kernel time
    events = EventLog()
    t = ct.KernelTiming([1.0], dev, [1.0], dev, 4096)
    ct.record_fields(t, 1, 1, events)
    assert any("graph capture failed" in e.message for e in events.events())
    assert events.count("launch_bound") == 0
