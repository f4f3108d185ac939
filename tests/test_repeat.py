"""--repeat N (issue 13.4): several worker processes per cell, merged into one record, and a
compare whose interval resamples processes, so run-to-run drift is not called a regression."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.errors import UsageError
from fusebench.results import stats
from fusebench.results.compare import compare_files
from fusebench.results.document import load_records
from fusebench.run.repeat import merge_processes, per_process, resolve_repeat, run_processes
from fusebench.spec import CellSpec, Record, StepStats
from tests.factories import model_record, write_results
from tests.helpers import TINY


def _run_of_processes(rng, base_ms: float, n_proc: int, drift: float, within: float,
                      steps: int = 10) -> list[list[float]]:
    """n_proc processes: each drifts as a whole (lognormal `drift`), its steps scatter by
    `within`: the shape of timings on a shared machine."""
    return [list(base_ms * rng.lognormal(0, drift) * rng.lognormal(0, within, steps))
            for _ in range(n_proc)]


def _pairs(shift: float, drift: float, n_pairs: int = 10, n_proc: int = 3, seed: int = 7):
    rng = np.random.default_rng(seed)
    return [(_run_of_processes(rng, 100.0, n_proc, drift, 0.02),
             _run_of_processes(rng, 100.0 * shift, n_proc, drift, 0.02))
            for _ in range(n_pairs)]


def test_aa_with_large_process_drift_is_not_significant():
    pairs = _pairs(shift=1.0, drift=0.15)
    hier = [stats.speedup_ci_processes(a, b).significant for a, b in pairs]
    assert sum(hier) <= 1, hier
    # what one process per side (the steps only) says about the same data: noise called real
    flat = [stats.speedup_ci(a[0], b[0]).significant for a, b in pairs]
    assert sum(flat) >= 5, flat


def test_a_25_percent_slowdown_with_small_spread_is_flagged():
    pairs = _pairs(shift=1.25, drift=0.03)
    ratios = [stats.speedup_ci_processes(a, b) for a, b in pairs]
    assert all(r.significant and r.gain < 1 for r in ratios), [(r.gain, r.low, r.high)
                                                                for r in ratios]
    assert all(0.7 < r.gain < 0.9 for r in ratios)


def test_the_minimum_effect_follows_the_process_spread():
    calm = _pairs(1.0, 0.01, n_pairs=1)[0]
    wild = _pairs(1.0, 0.20, n_pairs=1)[0]
    assert stats.speedup_ci_processes(*calm).min_effect == pytest.approx(stats.MIN_EFFECT,
                                                                         abs=0.02)
    assert stats.speedup_ci_processes(*wild).min_effect > 0.1


# ----- the merged record ----------------------------------------------------------------------

_SPEC = CellSpec.for_model("convnext_tiny", "eager", batch_size=8, img_size=224, budget=30.0)
QUIET = {"window_s": 1.0, "worker_cores": 1, "cpu_count": 2, "others_cpu_s": 0.0,
         "others_frac": 0.0, "steal_frac": 0.0, "load1": 0.5}


def _procs(medians, **kw) -> list[Record]:
    return [model_record(base_ms=m, seed=i, n=8, sigma=0.01, compile_s=1.0 + i,
                         extra={"tflops": 1.0, "contention": {**QUIET, "others_frac": 0.05 * i}},
                         **kw)
            for i, m in enumerate(medians)]


def test_merge_keeps_each_process_and_pools_the_samples():
    recs = _procs([100.0, 120.0, 110.0])
    m = merge_processes(recs)
    assert m.step_ms.n == 24 and m.step_ms.process_sizes == (8, 8, 8)
    assert [round(x) for x in m.step_ms.process_medians] == [100, 120, 110]
    assert m.step_ms.median == pytest.approx(np.median([s for r in recs
                                                         for s in r.step_ms.samples]))
    assert m.throughput == pytest.approx(8 * 1000.0 / m.step_ms.median)
    assert m.compile_s == 2.0 and m.extra["repeat"] == 3
    assert [p["compile_s"] for p in m.extra["processes"]] == [1.0, 2.0, 3.0]
    assert m.extra["contention"]["others_frac"] == pytest.approx(0.1)    # the worst process
    assert m.extra["tflops"] == pytest.approx(recs[0].step_ms.median / m.step_ms.median)
    assert [tuple(g) for g in m.step_ms.process_groups()] == [r.step_ms.samples for r in recs]


def test_shared_cache_takes_the_cold_compile_of_the_first_process():
    m = merge_processes(_procs([100.0, 120.0, 110.0]), cold_first=True)
    assert m.compile_s == 1.0 and "shared" in m.extra["compile_cache"]
    assert [p["compile_s"] for p in m.extra["processes"]] == [1.0, 2.0, 3.0]


def test_a_cells_processes_share_one_compile_cache(monkeypatch):
    """Process 1 compiles cold into the cell's cache; 2..N reuse it (not N cold compiles)."""
    from fusebench.run import runner
    seen = []

    def fake_run_one(spec, opts, on_phase):
        seen.append(opts.cache_dir)
        return _procs([100.0])[0]
    monkeypatch.setattr(runner, "run_one", fake_run_one)
    spec = _procs([100.0])[0].spec
    runner.measure_cell(spec, runner.RunOptions(repeat=3), lambda _: None)
    assert len(seen) == 3 and seen[0] is not None and len(set(seen)) == 1
    assert not seen[0].exists()                      # removed with the cell
    seen.clear()
    runner.measure_cell(spec, runner.RunOptions(repeat=1), lambda _: None)
    assert seen == [None]                            # one process: its own fresh cache


def test_merged_noise_and_contention_events_are_judged_once():
    from fusebench.spec import Event
    busy = {**QUIET, "others_cpu_s": 0.6, "others_frac": 0.6}
    recs = [r.replace(events=(Event("noise", "fusebench", f"noisy {i}"),
                              Event("contention", "fusebench", f"busy {i}"),
                              Event("warning", "python", "same warning")),
                      extra={**r.extra, "contention": {**busy, "others_frac": 0.2 * (i + 1)}})
            for i, r in enumerate(_procs([100.0, 200.0]))]
    m = merge_processes(recs)
    kinds = sorted(e.category for e in m.events)
    assert kinds == ["contention", "noise", "warning"]        # one of each
    assert "40%" in next(e.message for e in m.events if e.category == "contention")  # the worst
    assert "over 2 processes" in next(e.message for e in m.events if e.category == "noise")


def test_a_failed_process_fails_the_cell_and_says_which():
    recs = _procs([100.0]) + [model_record(status="crashed")]
    m = merge_processes(recs, 3)
    assert m.status == "crashed" and m.extra["failed_process"] == 2 and m.extra["repeat"] == 3


def test_run_processes_stops_at_a_failure_and_reports_progress():
    out = iter(_procs([100.0]) + [model_record(status="timeout")] + _procs([100.0]))
    phases: list[str] = []
    seen = []

    def launch(spec):
        seen.append((spec.budget, spec.model.check))
        return next(out)
    rec = run_processes(_SPEC, 3, launch, phases.append)
    assert rec.status == "timeout" and phases == ["process 1 of 3", "process 2 of 3"]
    assert seen == [(10.0, True), (10.0, False)]     # the budget is shared; process 1 checks
    assert rec.spec.budget == 30.0


def test_a_fixed_step_count_stays_per_process():
    spec = dataclasses.replace(_SPEC, budget=None, steps=7)
    assert per_process(spec, 3) == spec


def test_wait_idle_waits_before_each_process_and_says_so():
    loads = iter([{"busy_frac": 0.0, "waited_s": 0.0, "cpu_count": 2},
                  {"busy_frac": 0.9, "waited_s": 300.0, "cpu_count": 2}])
    phases: list[str] = []

    def fake_wait(timeout_s, on_wait):
        load = next(loads)
        if load["waited_s"]:
            on_wait({**load, "waited_s": 1.0})
        return load
    recs = iter(_procs([100.0, 100.0]))
    rec = run_processes(_SPEC, 2, lambda s: next(recs), phases.append, wait_idle=True,
                        wait=fake_wait)
    assert [w["idle"] for w in rec.extra["wait_idle"]] == [True, False]
    assert any(p.startswith("waiting for an idle machine") for p in phases)
    assert any("still busy after 300 s" in p for p in phases)


def test_stepstats_round_trip_and_old_layout(tmp_path):
    m = merge_processes(_procs([100.0, 105.0]))
    d = m.step_ms.to_dict()
    assert d["process_sizes"] == [8, 8] and StepStats.from_dict(d) == m.step_ms
    single = StepStats.from_samples([1.0, 2.0]).to_dict()
    assert "process_sizes" not in single                   # one process: the layout as before
    assert StepStats.from_dict(single).process_groups() == [(1.0, 2.0)]
    path = write_results(tmp_path / "r.json", [m])
    _, (back,) = load_records(path)                        # schema-checked on load
    assert back.step_ms.process_medians == m.step_ms.process_medians


@pytest.mark.parametrize("given,quick,want", [(None, True, 1), (None, False, 3), (5, True, 5)])
def test_repeat_defaults(given, quick, want):
    assert resolve_repeat(given, quick) == want


def test_repeat_out_of_range_is_a_usage_error():
    with pytest.raises(UsageError, match="--repeat"):
        resolve_repeat(0, False)


# ----- compare across runs --------------------------------------------------------------------

def _file(tmp_path, name, medians):
    return write_results(tmp_path / name, [merge_processes(_procs(medians))])


def test_compare_uses_the_processes(tmp_path):
    a = _file(tmp_path, "a.json", [100.0, 125.0, 90.0])      # drifting processes
    b = _file(tmp_path, "b.json", [118.0, 95.0, 110.0])
    cmp = compare_files([a, b], metric="step_ms", fail_pct=10)
    row = next(r for r in cmp.rows if not r.baseline)
    assert row.verdict == "not significant" and not cmp.regressions()
    assert row.ratio.min_effect > 0.1
    # "not significant" says how weak it is and what would resolve 10% (spread 17% -> 24)
    (note,) = cmp.notes
    assert f"resolve changes of {row.ratio.min_effect:.0%} or more" in note
    need = int(re.search(r"--repeat (\d+) per side would resolve 10%", note).group(1))
    assert 20 <= need <= 30                     # by hand: 8 x 0.17^2 / 0.1^2 = 24
    slow = _file(tmp_path, "c.json", [125.0, 126.0, 124.0])
    calm = _file(tmp_path, "d.json", [100.0, 101.0, 99.0])
    cmp = compare_files([calm, slow], metric="step_ms", fail_pct=10)
    assert cmp.regressions() and "slower" in cmp.rows[1].verdict and not cmp.notes


def test_processes_to_resolve():
    assert stats.processes_to_resolve([[100.0]], [[100.0]], 0.1) is None   # no spread known
    tight = [[100.0], [101.0], [99.0]]
    assert stats.processes_to_resolve(tight, tight, 0.1) == 2
    wide = [[100.0], [125.0], [90.0]]
    n = stats.processes_to_resolve(wide, tight, 0.1)
    # n processes per side with the same spread bring resolvable_effect down to the goal
    spread = [[m] for m in np.resize([100.0, 125.0, 90.0], n)]
    assert stats.resolvable_effect(spread, spread) <= 0.1 * 1.05


def test_one_process_per_side_gets_a_note(tmp_path):
    a = write_results(tmp_path / "a.json", [model_record(seed=1)])
    b = write_results(tmp_path / "b.json", [model_record(seed=2)])
    cmp = compare_files([a, b])
    assert any("--repeat" in n for n in cmp.notes)
    res = CliRunner().invoke(app, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "note: 1 comparison(s) rest on one worker process" in res.output
    js = CliRunner().invoke(app, ["compare", str(a), str(b), "--format", "json"])
    assert any("--repeat" in n for n in json.loads(js.stdout)["notes"])


# ----- end to end -----------------------------------------------------------------------------

def test_cli_repeat_2_runs_two_processes(tmp_path):
    res = CliRunner().invoke(app, ["run", TINY, "-m", "eager", "-b", "2", "--steps", "3",
                                   "--warmup", "1", "--threads", "1", "--repeat", "2",
                                   "--json", "--no-save", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)["records"][0]
    st = rec["step_ms"]
    assert st["n"] == 6 and st["process_sizes"] == [3, 3] and len(st["process_medians"]) == 2
    assert rec["extra"]["repeat"] == 2 and len(rec["extra"]["processes"]) == 2


def test_cli_bad_repeat_is_one_line(tmp_path):
    res = CliRunner().invoke(app, ["run", TINY, "--repeat", "0", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--repeat" in res.output


def _timed_file(tmp_path, name, medians, starts):
    m = merge_processes(_procs(medians))
    procs = [{**p, "started": t} for p, t in zip(m.extra["processes"], starts)]
    return write_results(tmp_path / name, [m.replace(extra={**m.extra, "processes": procs})])


@pytest.mark.parametrize("b_starts,apart", [((130.0, 160.0, 190.0), True),   # a later run
                                            ((15.0, 45.0, 75.0), False)])    # interleaved
def test_runs_taken_apart_in_time_get_a_note(tmp_path, b_starts, apart):
    a = _timed_file(tmp_path, "a.json", [100.0, 101.0, 99.0], (0.0, 30.0, 60.0))
    b = _timed_file(tmp_path, "b.json", [100.5, 101.5, 99.5], b_starts)
    cmp = compare_files([a, b], metric="step_ms")
    notes = [n for n in cmp.notes if "taken at different times" in n]
    assert len(notes) == apart
    if apart:
        assert notes[0].startswith("1 comparison(s)")
