"""Runner and worker: one process per cell; faults cost only their own cell."""
from __future__ import annotations

import pytest

from fusebench.results.document import ResultsWriter, load
from fusebench.run.runner import RunOptions, decay_batch, run_cells, run_one
from tests.helpers import GRAPH_BREAK, RAISING, WARNING, tiny_spec


def test_decay_batch_steps_down_like_timm():
    seq, b = [], 64
    while b:
        seq.append(b)
        b = decay_batch(b)
    assert seq == [64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1]


def test_faulty_cells_are_recorded_and_the_others_complete(fault_modes, tmp_path):
    specs = [tiny_spec(mode="eager"), tiny_spec(mode="test_crash"),
             tiny_spec(mode="test_hang", timeout=8.0), tiny_spec(mode="test_unavailable"),
             tiny_spec(mode="aot")]
    path = tmp_path / "r.json"
    writer = ResultsWriter(path, {"test": True})
    recs = run_cells(specs, writer, show_progress=False)
    by_mode = {r.spec.mode: r for r in recs}
    assert by_mode["eager"].status == "ok" and by_mode["eager"].step_ms.n == 3
    crash = by_mode["test_crash"]
    assert crash.status == "crashed" and crash.extra["signal"] == "SIGABRT"
    assert crash.extra["exit_code"] < 0
    hang = by_mode["test_hang"]
    assert hang.status == "timeout" and "8 s" in hang.error.message
    unav = by_mode["test_unavailable"]
    assert unav.status == "unavailable" and "planted" in unav.error.message
    assert by_mode["aot"].status == "ok" and by_mode["aot"].correctness.passed
    # everything that finished is on disk, in order, in a valid document
    doc = load(path)
    assert [r["spec"]["mode"] for r in doc["records"]] == [s.mode for s in specs]


def test_mismatch_after_second_call_is_caught(fault_modes):
    rec = run_one(tiny_spec(mode="test_corrupt_after_2", warmup=1, steps=2))
    assert rec.status == "mismatch"
    c = rec.correctness
    assert c.checked_at == ("first", "steady")
    assert "first: ok" in c.detail and "steady: " in c.detail and "grad rel err" in c.detail
    assert c.max_rel_err_grad > 0.1


def test_oom_retries_with_decayed_batch(fault_modes):
    rec = run_one(tiny_spec(mode="test_oom", batch_size=6))
    assert rec.status == "ok" and rec.spec.model.batch_size == 2
    assert rec.extra["oom_failed_batch_sizes"] == [6, 4, 3]
    assert rec.extra["requested_batch_size"] == 6
    rec = run_one(tiny_spec(mode="test_oom", batch_size=6), RunOptions(retry_oom=False))
    assert rec.status == "oom" and rec.spec.model.batch_size == 6


def test_python_warnings_become_events():
    rec = run_one(tiny_spec(model=WARNING))
    ev = [e for e in rec.events if e.category == "warning"]
    assert ev and ev[0].message == "tiny model warns every call"
    assert ev[0].source == "python:UserWarning"
    assert ev[0].count >= 1 + 1 + 3   # first call, warm-up, timed steps (and checks)


def test_factory_error_is_an_error_record():
    rec = run_one(tiny_spec(model=RAISING))
    assert rec.status == "error"
    assert "factory exploded on purpose" in rec.error.message


@pytest.mark.slow
def test_graph_break_recorded_for_compile():
    rec = run_one(tiny_spec(model=GRAPH_BREAK, mode="compile",
                            mode_options=(("compile_backend", "aot_eager"),)))
    assert rec.status == "ok", rec.error
    gb = [e for e in rec.events if e.category == "graph_break"]
    assert gb and gb[0].source == "dynamo"
    assert rec.correctness.passed


@pytest.mark.slow
def test_every_registered_mode_runs_through_a_worker():
    from fusebench.modes import get_mode, list_modes
    modes = [m for m in list_modes() if not m.startswith("test_")]
    opts = (("compile_backend", "aot_eager"),)   # inductor's C++ compile is covered elsewhere
    recs = run_cells([tiny_spec(mode=m, mode_options=opts) for m in modes], show_progress=False)
    for m, r in zip(modes, recs):
        assert r.spec.mode == m
        ok, reason = get_mode(m).available(dict(opts), "cpu")
        if not ok:          # e.g. cudagraphs on CPU: an honest unavailable record
            assert r.status == "unavailable" and r.error.message == reason, (m, r.status)
            continue
        assert r.status == "ok", (m, r.status, r.error, r.correctness)
        assert r.step_ms.n == 3 and r.throughput > 0
        if m != "eager":
            assert r.correctness.passed and r.correctness.checked_at == ("first", "steady")
