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
    assert verdicts and set(verdicts) <= {"PASS", "FAIL", "n/a"}
    assert "correctness" in out.stdout and (tmp_path / "r.json").exists()


@pytest.mark.parametrize("extra, shown", [({"rusage": {"minflt": 28359.2}}, "faults/step  28359"),
                                          ({}, "faults/step -")])
def test_cell_line_shows_the_page_faults_per_step(extra, shown, capsys):
    from tests.factories import model_record
    rec = model_record("efficientnet_b0", "fused", extra=extra)
    _bench()._print_cell("efficientnet_b0", "cl", 2, rec, 0.5, False)
    assert shown in capsys.readouterr().out
