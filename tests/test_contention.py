"""Contention sampling: other processes' CPU is seen, our own work is not counted as theirs."""
from __future__ import annotations

import subprocess
import sys
import time

from fusebench.measure.contention import (CpuSnapshot, CpuWindow, contention_fields,
                                          current_load, is_contended)


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
    assert b.own - a.own >= 0.6               # the spin is ours
    # whatever else ran meanwhile, our 0.8 CPU-seconds are not in "others"
    assert f["others_cpu_s"] <= (b.busy - a.busy) - 0.6 + 1e-6


def test_fields_are_fractions_of_the_workers_cores():
    a = CpuSnapshot(t=0.0, busy=100.0, steal=1.0, own=10.0)
    b = CpuSnapshot(t=2.0, busy=104.0, steal=1.0, own=11.0)   # 3 CPU-s others in 2 s
    f = contention_fields(a, b, threads=2)
    assert f["others_cpu_s"] == 3.0
    assert f["worker_cores"] == min(2, f["cpu_count"])
    assert f["others_frac"] == 3.0 / (2.0 * f["worker_cores"])
    quiet = contention_fields(a, CpuSnapshot(t=2.0, busy=101.1, steal=1.0, own=11.0), threads=1)
    assert not is_contended(quiet)


def test_current_load_reports_machine_fields():
    load = current_load(0.2)
    assert 0.0 <= load["busy_frac"] and load["cpu_count"] >= 1 and load["load1"] >= 0
