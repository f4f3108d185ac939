"""The timed part of a cell sized by a budget (issue 11.2): step-count calibration, --steps
overriding it, the CPU default batch, progress lines with done/total, and a timed-out cell's
record saying where it stopped with the samples it had."""
from __future__ import annotations

import dataclasses
import json

import pytest

from fusebench.errors import UsageError
from fusebench.measure import timer
from fusebench.run import autobatch, outline
from fusebench.run.plan import DEFAULT_BUDGET_S, RunRequest, fits_batch, plan_run
from fusebench.run.progress import CellState, outcome
from fusebench.spec import Record, StepStats
from tests.helpers import TINY, tiny_spec


class FakeClock:
    """A clock and a step that advances it by `ms(i)` for the i-th step (from 0)."""

    def __init__(self, ms):
        self.now, self.calls, self.ms = 0.0, 0, ms

    def __call__(self) -> float:
        return self.now

    def step(self) -> None:
        self.now += self.ms(self.calls) / 1e3
        self.calls += 1


# ------------------------------------------------------------------------ calibration
def test_calibrate_steps_is_budget_over_step_time_clamped():
    assert timer.calibrate_steps([100.0] * 4, budget_s=2.0) == 20
    assert timer.calibrate_steps([500.0, 100.0, 100.0], 2.0) == 20     # first (slow) one left out
    assert timer.calibrate_steps([1000.0] * 3, 1.0) == timer.MIN_STEPS   # enough samples anyway
    assert timer.calibrate_steps([0.01] * 3, 60.0) == timer.MAX_STEPS
    assert timer.calibrate_steps([1.0], 1.0, max_steps=50) == 50
    with pytest.raises(ValueError):
        timer.calibrate_steps([], 1.0)


def test_budgeted_timing_calibrates_from_the_warmup():
    clock = FakeClock(lambda i: 100.0)
    warm = timer.time_steps(clock.step, 3, "cpu", clock=clock)
    seen, totals = [], []
    samples, count = timer.time_budgeted(
        clock.step, "cpu", budget_s=2.0, steps=timer.MAX_STEPS, warm_ms=warm, clock=clock,
        on_step=lambda done, ms: seen.append((done, ms)), on_total=totals.append)
    assert len(samples) == 20 and count.steps == 20 and count.done == 20
    assert (count.source, count.calibrated_on, count.calibration_n) == ("budget", "warmup", 3)
    assert count.step_ms == pytest.approx(100.0) and totals == [20]
    assert [d for d, _ in seen] == list(range(1, 21)) and seen[-1][1] == pytest.approx(100.0)
    assert "budget 2 s" in count.describe()


def test_budgeted_timing_without_warmup_calibrates_on_the_first_timed_steps():
    clock = FakeClock(lambda i: 250.0)
    totals = []
    samples, count = timer.time_budgeted(clock.step, "cpu", budget_s=3.0, steps=100, warm_ms=[],
                                         clock=clock, on_total=totals.append)
    assert count.calibrated_on == "first timed" and count.calibration_n == timer.MIN_STEPS
    assert len(samples) == count.steps == 12 and totals == [timer.MIN_STEPS, 12]


def test_budgeted_timing_stops_at_the_time_cap_when_steps_get_slower():
    clock = FakeClock(lambda i: 100.0 if i < 3 else 1000.0)      # the machine got busy
    warm = timer.time_steps(clock.step, 3, "cpu", clock=clock)
    samples, count = timer.time_budgeted(clock.step, "cpu", budget_s=2.0, steps=200,
                                         warm_ms=warm, clock=clock)
    assert count.steps == 20 and count.done == len(samples) < 20
    assert sum(samples) / 1e3 <= timer.TIME_CAP * 2.0 + 1.0


def test_explicit_steps_override_the_budget():
    clock = FakeClock(lambda i: 100.0)
    samples, count = timer.time_budgeted(clock.step, "cpu", budget_s=None, steps=7,
                                         warm_ms=[100.0] * 3, clock=clock)
    assert len(samples) == 7 and count.source == "steps" and count.budget_s is None
    (given,) = plan_run(RunRequest(models=TINY, modes="eager", batch_sizes="2", steps=7,
                                   budget=5.0))
    assert (given.steps, given.budget) == (7, None)
    (default,) = plan_run(RunRequest(models=TINY, modes="eager", batch_sizes="2"))
    assert (default.budget, default.steps) == (DEFAULT_BUDGET_S, timer.MAX_STEPS)
    (chosen,) = plan_run(RunRequest(models=TINY, modes="eager", batch_sizes="2", budget=5.0))
    assert chosen.budget == 5.0
    (quick,) = plan_run(RunRequest(models=TINY, modes="eager", quick=True))
    assert (quick.budget, quick.steps) == (None, 5)
    for bad in (0.0, -1.0, float("nan"), 1e9):
        with pytest.raises(UsageError, match="--budget"):
            plan_run(RunRequest(models=TINY, modes="eager", budget=bad))


# ------------------------------------------------------------------------ CPU default batch
def _probe_record(spec, median_ms: float, status: str = "ok") -> Record:
    st = StepStats.from_samples([median_ms] * 2) if status == "ok" else None
    return Record(spec.with_model(img_size=spec.model.img_size or 16), status, step_ms=st)


def test_cpu_default_batch_fits_the_budget_and_is_the_same_for_every_mode():
    specs = plan_run(RunRequest(models=TINY, modes="eager,torchscript,aot", device="cpu"))
    assert fits_batch(RunRequest(models=TINY), specs)
    probes = []

    def probe(spec):
        probes.append(spec)
        return _probe_record(spec, median_ms=800.0)     # 400 ms per sample
    fitted, picks = autobatch.fit_batches(specs, budget_s=30.0, probe=probe)
    # 30 s / 15 steps = 2 s per step -> 5 samples -> 4 on the ladder
    assert [s.model.batch_size for s in fitted] == [4, 4, 4]
    assert [s.mode for s in fitted] == [s.mode for s in specs]
    assert len(probes) == 1 and probes[0].mode == "eager" and not probes[0].model.check
    assert probes[0].model.batch_size == autobatch.PROBE_BATCH and probes[0].budget is None
    assert len(picks) == 3 and len(set(picks)) == 1
    c = picks[0]
    assert c.batch == 4 and c.standard == 32 and "400 ms/sample" in c.why and c.img_size == 16
    assert autobatch.pick(0.001, 2000.0, 32) == 32          # never above the standard batch
    assert autobatch.pick(5000.0, 2000.0, 32) == 1


def test_a_failed_probe_keeps_the_standard_batch():
    specs = plan_run(RunRequest(models=TINY, modes="eager", device="cpu"))
    fitted, (c,) = autobatch.fit_batches(specs, 30.0,
                                         probe=lambda s: _probe_record(s, 0, "error"))
    assert fitted[0].model.batch_size == 32 and "probe error" in c.why


def test_the_batch_is_fitted_only_when_the_run_picks_it():
    def plan(**kw):
        req = RunRequest(models=TINY, modes="eager", device="cpu", **kw)
        return fits_batch(req, plan_run(req))
    assert plan()
    assert not plan(batch_sizes="8") and not plan(quick=True)
    cuda = [dataclasses.replace(s, device="cuda") for s in plan_run(RunRequest(models=TINY))]
    assert not fits_batch(RunRequest(models=TINY), cuda)        # CUDA: the standard batch


def test_outline_says_cells_batch_steps_and_time():
    specs = plan_run(RunRequest(models="efficientnet_b3", modes="eager,compile",
                                channels_last=True, device="cpu"))
    choice = autobatch.BatchChoice(model="efficientnet_b3", bench="train", img_size=288,
                                   batch=4, standard=32, probe_ms=800.0, why="probe says so")
    specs = [s.with_model(batch_size=4) for s in specs]
    lines = outline.describe(specs, [choice] * len(specs))
    text = "\n".join(lines)
    assert lines[0].startswith("fusebench run: 2 cells on cpu: efficientnet_b3 x eager, compile")
    assert "batch 4 (CPU default" in text and "288 px" in text and "channels_last" in text
    assert "probe says so" in text and "~30 s of timed steps" in text
    assert "estimated time: ~" in text and "compiling" in text
    total, known, first = outline.estimate(specs, [1.6, 1.6])
    assert known and total > 2 * 30 + first
    _, unknown, _ = outline.estimate(specs)
    assert not unknown                              # no probe: steps not counted, said so
    assert "not known before the run" in "\n".join(outline.describe(specs))
    three = "\n".join(outline.describe(specs, [choice] * len(specs), repeat=3))
    assert "3 worker processes" in three and "~10 s of 30 s of timed steps" in three
    total3, _, first3 = outline.estimate(specs, [1.6, 1.6], repeat=3)
    assert first < first3 < 3 * first          # one cold compile, then the cell's warm cache
    assert total3 > total                      # three starts, warm-ups and checks
    assert "AMP" not in text


@pytest.mark.parametrize("amp_dtype, device, shown", [("bfloat16", "cuda", "AMP bfloat16"),
                                                      (None, "cuda", "AMP float16"),
                                                      (None, "cpu", "AMP bfloat16")])
def test_outline_says_when_the_cells_run_under_autocast(amp_dtype, device, shown):
    specs = [dataclasses.replace(s, device=device).with_model(amp=True, amp_dtype=amp_dtype)
             for s in plan_run(RunRequest(models="efficientnet_b3", modes="eager",
                                          device="cpu"))]
    assert f"float32, {shown} autocast" in outline.describe(specs)[1]


# ------------------------------------------------------------------------ progress protocol
def test_reporter_lines_carry_done_total_and_an_eta():
    from fusebench.cell.report import Reporter
    from fusebench.protocol import PHASE_PREFIX, STATE_PREFIX
    lines, now = [], [0.0]
    rep = Reporter(on_phase=lambda n: lines.append(PHASE_PREFIX + n),
                   on_state=lambda o: lines.append(STATE_PREFIX + json.dumps(o)),
                   clock=lambda: now[0])
    rep.note(img_size=288)
    rep("timing")
    rep.expect(20)
    for i in range(5):
        now[0] += 2.0
        rep.step(i + 1, 2000.0)
    state = CellState()
    for line in ["model prints this", *lines]:
        state.feed(line)
    assert state.text() == "timing 5/20, ~30 s left"
    assert state.facts == {"img_size": 288} and state.samples == {"timing": [2000.0] * 5}
    assert state.stopped() == {"phase": "timing", "steps_done": 5, "steps_total": 20,
                               "samples_ms": {"timing": [2000.0] * 5}}
    state.feed(PHASE_PREFIX + "check")
    assert state.text() == "check"


def test_progress_from_a_real_cell_counts_warmup_and_timing_steps():
    from fusebench.run.runner import run_one
    seen = []
    rec = run_one(tiny_spec(warmup=2, steps=3, check=False), on_phase=seen.append)
    assert rec.status == "ok", rec.error
    assert "warmup 2/2" in " ".join(seen) and any(s.startswith("timing 3/3") for s in seen)
    assert rec.extra["timing"]["source"] == "steps" and len(rec.extra["warmup_ms"]) == 2
    assert outcome(rec).startswith("ok (3 steps x ")


def test_a_budgeted_cell_records_what_it_chose():
    from fusebench.run.runner import run_one
    rec = run_one(tiny_spec(warmup=2, steps=timer.MAX_STEPS, budget=0.3, check=False))
    assert rec.status == "ok", rec.error
    t = rec.extra["timing"]
    assert t["source"] == "budget" and t["budget_s"] == 0.3 and t["calibrated_on"] == "warmup"
    assert timer.MIN_STEPS <= t["steps"] <= timer.MAX_STEPS and rec.step_ms.n == t["done"]
    assert rec.spec.budget == 0.3


def test_a_timed_out_cell_says_where_it_stopped_and_keeps_its_samples(all_fault_modes):
    from fusebench.run.runner import run_one
    # calls: first, 2 warm-up, 2 timed; the 6th (3rd timed step) hangs
    rec = run_one(tiny_spec(mode="test_hang_after_5", warmup=2, steps=10, check=False,
                            timeout=8.0))   # the tiny cell reaches the hang in ~1 s
    assert rec.status == "timeout"
    assert rec.spec.model.img_size == 16                       # the size it ran at, not null
    assert rec.compile_s is not None and rec.compile_s > 0     # its first call had finished
    stopped = rec.extra["stopped"]
    assert (stopped["phase"], stopped["steps_done"], stopped["steps_total"]) == ("timing", 2, 10)
    assert len(stopped["samples_ms"]["timing"]) == 2 and len(stopped["samples_ms"]["warmup"]) == 2
    assert "in timing after 2/10 steps" in rec.error.message
    assert outcome(rec) == "timeout in timing after 2/10 steps"
    Record.from_dict(json.loads(json.dumps(rec.to_dict())))   # survives the document


# ------------------------------------------------------------------------ the CLI
def test_cli_run_outlines_fits_the_cpu_batch_and_records_it(tmp_path, capsys):
    from fusebench.cli import main
    rc = main(["run", TINY, "-m", "eager", "--budget", "0.5", "--warmup", "2", "--no-check",
               "--threads", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    lines = err.splitlines()
    assert lines[0].startswith("fitting the CPU batch to the budget: eager probe")
    assert lines[1].startswith("fusebench run: 1 cells on cpu")
    assert "(CPU default: fitted to the budget; -b N to choose), 16 px" in lines[2]
    assert any(ln.startswith("  estimated time: ~") for ln in lines[:7])
    (path,) = tmp_path.glob("*.json")
    (rec,) = json.loads(path.read_text())["records"]
    choice = rec["extra"]["batch_choice"]
    assert "ms/sample at batch 2" in choice["why"] and choice["batch"] == rec["spec"]["model"][
        "batch_size"]
    assert rec["extra"]["timing"]["source"] == "budget" and rec["spec"]["budget"] == 0.5


def test_cli_refuses_a_bad_budget(tmp_path, capsys):
    from fusebench.cli import main
    for bad in ("0", "-3", "nan", "inf"):
        rc = main(["run", TINY, "--budget", bad, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "--budget" in err[0], err
        assert not (tmp_path / "out").exists()


def test_a_crashed_cell_says_in_which_phase_and_keeps_its_image_size(all_fault_modes):
    from fusebench.run.runner import run_one
    rec = run_one(tiny_spec(mode="test_segv_compile", check=False))   # SIGSEGV in prepare
    assert rec.status == "crashed"
    assert rec.error.message.endswith("in compile") and rec.spec.model.img_size == 16
    assert rec.extra["stopped"]["phase"] == "compile" and rec.compile_s is None
    assert outcome(rec) == "crashed in compile"
