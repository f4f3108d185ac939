"""Peak memory measures the mode, not the harness (issue 13.2): the same cell has the same peak
with and without the correctness check and with the fork server on or off."""
from __future__ import annotations

import itertools

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


@pytest.mark.slow
def test_same_peak_with_or_without_check_and_fork_server(monkeypatch):
    from fusebench.run import forkserver
    from fusebench.run.runner import run_one
    from fusebench.spec import CellSpec
    peaks = {}
    for fs, check in itertools.product(("1", "0"), (True, False)):
        monkeypatch.setenv("FUSEBENCH_FORKSERVER", fs)
        spec = CellSpec.for_model("convnext_atto", "aot", batch_size=4, img_size=64,
                                  check=check, warmup=1, steps=3, threads=1)
        rec = run_one(spec)
        assert rec.status == "ok", rec.error
        peaks[(fs, check)] = rec.peak_mem_bytes
    forkserver.shutdown()
    assert max(peaks.values()) <= 1.05 * min(peaks.values()), peaks
