"""benchmarks/fused_mode.py: its verdicts from records, its bad-input lines, and (slow) the
--quick smoke run end to end."""
import os
import subprocess
import sys

import pytest

from fusebench.spec import CellSpec, Correctness, Record, StepStats
from tests.helpers import BENCHMARKS, load_benchmark

BENCH = BENCHMARKS / "fused_mode.py"



def _bench():
    return load_benchmark("fused_mode")


def _rec(mode, ms, act, passed=True, status="ok"):
    spec = CellSpec.for_model("efficientnet_b0", mode)
    st = StepStats.from_samples([ms, ms, ms]) if ms else None
    return Record(spec=spec, status=status, step_ms=st, activation_bytes=act,
                  correctness=Correctness(passed, 0.0, 0.0))


@pytest.mark.parametrize("fused_ms, compile_ms, act, passed, want", [
    (70.0, 70.0, 65, True, ["PASS", "PASS", "PASS", "PASS"]),     # 1.43x eager, 1.0x compile
    (80.0, 70.0, 75, True, ["FAIL", "FAIL", "FAIL", "PASS"]),     # 1.25x, 0.875x, 0.75x
    (70.0, None, 65, False, ["PASS", "n/a", "PASS", "FAIL"]),     # compile not run; wrong grads
])
def test_verdicts_from_records(fused_ms, compile_ms, act, passed, want):
    fm = _bench()
    key = ("efficientnet_b0", "cl", 2)
    grid = {(*key, "eager"): _rec("eager", 100.0, 100),
            (*key, "fused"): _rec("fused", fused_ms, act, passed)}
    if compile_ms:
        grid[(*key, "compile")] = _rec("compile", compile_ms, 100)
    effnet = [t for t in fm.TARGETS if "efficientnet" in t.families]
    got = [fm.verdict(t, fm.ratio(grid, key, t.what)) for t in effnet]
    order = ["fused/eager speed", "fused/compile speed", "act bytes fused/eager", "correctness"]
    assert [got[[t.name for t in effnet].index(n)] for n in order] == want


def _procs(mode, medians, spread=0.01, act=None):
    """A record of len(medians) worker processes, 5 steps each around its median."""
    spec = CellSpec.for_model("efficientnet_b3", mode)
    groups = [[m * (1 + spread * k) for k in (-2, -1, 0, 1, 2)] for m in medians]
    return Record(spec=spec, status="ok", step_ms=StepStats.from_processes(groups),
                  activation_bytes=act or (63 if mode == "fused" else 100),
                  correctness=Correctness(True, 0.0, 0.0))


@pytest.mark.parametrize("eager, fused, want", [
    ([400.0, 404.0, 396.0], [280.0, 282.0, 278.0], "PASS"),     # 1.43x, processes agree
    ([400.0, 404.0, 396.0], [340.0, 342.0, 338.0], "FAIL"),     # 1.18x, processes agree
    ([330.0, 470.0, 400.0], [260.0, 360.0, 300.0], "UNSURE"),   # ~1.31x, processes 15% apart
])
def test_speed_verdict_reads_the_interval_over_processes(eager, fused, want, capsys):
    fm = _bench()
    key = ("efficientnet_b3", "cl", 2)
    grid = {(*key, "eager"): _procs("eager", eager), (*key, "fused"): _procs("fused", fused)}
    r = fm.ratio(grid, key, "speed_eager")
    # the point estimate is compare's: mean of process medians, eager over fused
    assert r.gain == pytest.approx(sum(eager) / sum(fused))
    assert r.low < r.gain < r.high
    target = next(t for t in fm.TARGETS if t.what == "speed_eager")
    assert fm.verdict(target, r) == want
    fm.print_targets(grid, None)
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "fused/eager speed" in ln)
    assert line.split()[0] == want and f"[{r.low:.2f}, {r.high:.2f}]" in line
    assert ("processes per cell would resolve it" in line) == (want == "UNSURE")
    # the table's ms are what the ratio divides: the means of the process medians
    assert fm._ms(grid[(*key, "eager")]) == f"{sum(eager) / 3:.1f}"


def test_unsure_counts_against_strict():
    fm = _bench()
    key = ("efficientnet_b3", "cl", 2)
    grid = {(*key, "eager"): _procs("eager", [330.0, 470.0, 400.0]),
            (*key, "fused"): _procs("fused", [260.0, 360.0, 300.0])}
    assert fm.print_targets(grid, None) == 1      # UNSURE speed; act and correctness pass


def test_failed_cell_gives_no_ratio():
    fm = _bench()
    key = ("convnext_atto", "nchw", 1)
    grid = {(*key, "eager"): _rec("eager", None, None, status="error"),
            (*key, "fused"): _rec("fused", 50.0, 10)}
    assert fm.ratio(grid, key, "speed_eager") is None


@pytest.mark.parametrize("argv, needle", [(["--models", "resnet9"], "--models: unknown resnet9"),
                                          (["--threads", "0"], "--threads: expected positive"),
                                          (["--layouts", "nhwc"], "--layouts: unknown nhwc")])
def test_bad_flags_are_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        _bench().parse(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.slow
def test_quick_smoke_runs_every_cell(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(BENCH.parent.parent)}
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models",
                          "efficientnet_b0,convnext_official", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, env=env, timeout=1800)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    cells = [ln for ln in lines if ln.startswith(("efficientnet_b0 ", "convnext_official "))
             and " T1 " in ln]
    assert len(cells) == 8 and all(" ok " in ln for ln in cells), out.stdout
    verdicts = [ln.split()[0] for ln in lines if ln.startswith("  ") and " T1 " in ln]
    assert verdicts and set(verdicts) <= {"PASS", "FAIL", "UNSURE", "n/a"}
    assert "correctness" in out.stdout and (tmp_path / "r.json").exists()


@pytest.mark.parametrize("extra, shown", [({"rusage": {"minflt": 28359.2}}, "faults/step  28359"),
                                          ({}, "faults/step -")])
def test_cell_line_shows_the_page_faults_per_step(extra, shown, capsys):
    from tests.factories import model_record
    rec = model_record("efficientnet_b0", "fused", extra=extra)
    _bench()._print_cell("efficientnet_b0", "cl", 2, rec, 0.5, False)
    assert shown in capsys.readouterr().out
