"""Per-step counts a busy machine does not change (measure/rusage.py, issue 13.6): page faults,
context switches and CPU time of the timed steps, in every model cell's record."""
from __future__ import annotations

import mmap

from fusebench.measure.rusage import UsageWindow


def test_window_counts_the_pages_its_steps_touch_per_step():
    pages, steps = 1024, 4
    with UsageWindow() as u:
        for _ in range(steps):
            m = mmap.mmap(-1, pages * mmap.PAGESIZE)      # fresh anonymous pages
            for off in range(0, len(m), mmap.PAGESIZE):
                m[off] = 1                                # first touch: one minor fault each
            m.close()
    r = u.result(steps)
    assert pages <= r["minflt"] < 2 * pages, r
    assert r["majflt"] == 0 and r["cpu_ms"] > 0
    assert {"nvcsw", "nivcsw", "thread_nvcsw", "thread_nivcsw"} <= set(r)


def test_result_before_the_window_closed_is_none():
    assert UsageWindow().__enter__().result(1) is None


def test_model_cell_records_counts_per_timed_step():
    from fusebench.cell.model_cell import run_cell
    from fusebench.spec import CellSpec
    from tests.helpers import TINY
    rec = run_cell(CellSpec.for_model(TINY, "eager", batch_size=2, warmup=1, steps=3,
                                      threads=1), lambda phase: None)
    r = rec.extra["rusage"]
    assert r["cpu_ms"] > 0 and r["minflt"] >= 0 and r["thread_nivcsw"] >= 0
