"""Peak memory measures the mode, not the harness (issue 13.2): the same cell has the same peak
with and without the correctness check and with the fork server on or off."""
from __future__ import annotations

import itertools
import statistics

import pytest

from fusebench.measure import memory
from fusebench.measure.memory import PeakMemory


class _FakeProc:
    """/proc/self/status fields the CPU peak reads, in KiB."""

    def __init__(self, **kib):
        self.kib = dict(kib)

    def __call__(self, field):
        return self.kib.get(field)


def test_library_pages_and_harness_leftovers_are_not_the_modes(monkeypatch):
    proc = _FakeProc(VmRSS=100_000, RssFile=40_000, VmHWM=100_000)
    monkeypatch.setattr(memory, "_status_kib", proc)
    monkeypatch.setattr(memory, "_reset_hwm", lambda: True)
    monkeypatch.setattr(memory, "pin_malloc", lambda: True)
    mem = PeakMemory("cpu")
    mem.reset()                                       # baseline: 100 MB RSS, 40 MB of files
    with mem.excluded():                              # the correctness reference
        proc.kib.update(VmRSS=103_000)                # leaves 3 MB of caches behind
    # the timed steps: 20 MB of tensors at the peak, and 5 MB of libtorch code paged in
    proc.kib.update(VmRSS=108_000, RssFile=45_000, VmHWM=128_000)
    assert mem.peak() == 20_000 * 1024


def test_pin_malloc_is_harmless_to_call_twice():
    assert memory.pin_malloc() == memory.pin_malloc()


def _peaks(monkeypatch, fs: str, checks=(True, False), reps: int = 3) -> dict[bool, float]:
    """Median peak of `reps` runs per check setting (one run varies by a few % on a busy
    machine: see docs/measurement.md)."""
    from fusebench.run import forkserver
    from fusebench.run.runner import run_one
    from fusebench.spec import CellSpec
    monkeypatch.setenv("FUSEBENCH_FORKSERVER", fs)
    out: dict[bool, list[int]] = {}
    for _, check in itertools.product(range(reps), checks):
        spec = CellSpec.for_model("convnext_atto", "aot", batch_size=4, img_size=64,
                                  check=check, warmup=1, steps=3, threads=1)
        rec = run_one(spec)
        assert rec.status == "ok", rec.error
        out.setdefault(check, []).append(rec.peak_mem_bytes)
    forkserver.shutdown()
    return {k: statistics.median(v) for k, v in out.items()}


@pytest.mark.slow
def test_same_peak_with_the_fork_server_on_or_off(monkeypatch):
    # before: the forked worker counted ~5 MB of libtorch code it paged in (~10% here)
    on, off = _peaks(monkeypatch, "1", (False,))[False], _peaks(monkeypatch, "0", (False,))[False]
    assert max(on, off) <= 1.05 * min(on, off), (on, off)


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="open: single runs of this aot cell vary by up to ~7% "
                   "on a busy machine and the check adds ~2% (median); see docs/measurement.md")
def test_same_peak_with_or_without_the_check(monkeypatch):
    peaks = _peaks(monkeypatch, "1")
    assert max(peaks.values()) <= 1.05 * min(peaks.values()), peaks
