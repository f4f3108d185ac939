"""Contention sampling: other processes' CPU is seen, our own work is not counted as theirs, and a
window too short for the counters is no verdict."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fusebench.measure.contention import (CONTENDED, MAX_HOLD_S, CpuSnapshot, CpuWindow,
                                          contention_fields, current_load, describe,
                                          is_contended, window_needed_s)


def _spin(cpu_seconds: float) -> None:
    # CPU time, not wall time: on a loaded machine a wall-clock spin may get half a core
    end = time.process_time() + cpu_seconds
    while time.process_time() < end:
        pass


def test_a_busy_neighbour_shows_as_contention():
    # one core fully busy in another process while the "worker" (us) sleeps
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)                       # let it start spinning
        with CpuWindow() as w:
            time.sleep(1.0)
    finally:
        hog.kill()
        hog.wait()
    f = w.result(threads=1)
    assert f["others_cpu_s"] >= 0.7           # ~1 CPU-second of the hog in a 1 s window
    assert f["others_frac"] >= 0.7
    assert is_contended(f)


def test_own_work_is_not_counted_as_others():
    a = CpuSnapshot.take()
    _spin(0.8)
    b = CpuSnapshot.take()
    f = contention_fields(a, b, threads=1)
    assert b.own - a.own >= 0.8               # the spin is ours, on the scheduler's clock
    # the window's non-idle CPU-seconds less ours: the 0.8 s spin is not in "others"
    busy = (b.t - a.t) * b.cpus - (b.idle - a.idle) - (b.steal - a.steal)
    assert f["others_cpu_s"] == pytest.approx(max(0.0, busy - (b.own - a.own)))
    assert f["others_cpu_s"] <= max(0.0, busy - 0.8) + 1e-6     # (busy may read under 0.8
    # by the idle counters' resolution: then nothing is left for others)


def test_fields_are_fractions_of_the_workers_cores():
    a = CpuSnapshot(t=0.0, idle=100.0, steal=1.0, own=10.0, cpus=2)
    b = CpuSnapshot(t=2.0, idle=100.0, steal=1.0, own=11.0, cpus=2)   # 4 busy, 1 ours
    f = contention_fields(a, b, threads=2)
    assert f["others_cpu_s"] == 3.0 and f["cpu_count"] == 2 and f["worker_cores"] == 2
    assert f["others_frac"] == 3.0 / (2.0 * 2)
    assert f["others_frac_min"] == (3.0 - f["resolution_s"]) / (2.0 * 2)
    quiet = contention_fields(a, CpuSnapshot(t=2.0, idle=102.9, steal=1.0, own=11.0, cpus=2),
                              threads=1)
    assert quiet["others_cpu_s"] == pytest.approx(0.1) and not is_contended(quiet)


def test_a_window_below_the_counters_resolution_is_not_a_verdict():
    # a 5 ms window of a sub-millisecond model on 2 idle-but-for-us CPUs: the other CPU's idle
    # counter did not reach its next tick, so 5 ms of its idleness read as busy. The estimate
    # says 50% of 2 cores; what the window saw *at least* is 0 (this read "232%" with the busy
    # counters, on an idle machine)
    a = CpuSnapshot(t=0.0, idle=100.0, steal=0.0, own=10.0, cpus=2)
    b = CpuSnapshot(t=0.005, idle=100.0, steal=0.0, own=10.005, cpus=2)
    f = contention_fields(a, b, threads=2)
    assert f["others_frac"] == pytest.approx(0.5)
    assert f["others_frac_min"] == 0.0 and not is_contended(f)
    # the same doubt over a window as long as window_needed_s asks is under half the threshold
    need = window_needed_s(2, cpus=2)
    assert f["resolution_s"] / (need * 2) <= CONTENDED / 2 + 1e-12
    # and a share the resolution cannot explain away still counts
    busy = contention_fields(a, CpuSnapshot(t=need, idle=100.0 + need * 0.5, steal=0.0,
                                            own=10.0 + need, cpus=2), threads=2)
    assert busy["others_frac"] == pytest.approx(0.25) and is_contended(busy)
    assert "25% (at least" in describe(busy)


def test_a_short_window_is_held_open_until_it_can_resolve():
    with CpuWindow(hold_for=2) as w:
        pass
    f = w.result(threads=2)
    assert f["window_s"] >= window_needed_s(2) > 0
    with CpuWindow() as w:                    # without hold_for: as long as its body
        pass
    assert w.result(threads=2)["window_s"] < window_needed_s(2)
    assert window_needed_s(1, cpus=256) == MAX_HOLD_S   # never longer than the cap


def test_current_load_reports_machine_fields():
    load = current_load(0.2)
    assert 0.0 <= load["busy_frac"] and load["cpu_count"] >= 1 and load["load1"] >= 0
