"""The GPU check's helpers on a machine without a GPU: scripts/missing_deps.py (what the device
image lacks of pyproject's dependencies), gpu_check.sh stopping before any step when one is
missing, and scripts/gpu_kernels.py running the kernel cells in one process (Triton under
TRITON_INTERPRET=1 on CPU tensors) into a results document gpu_summary.py reads."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fusebench.results.document import load_records
from tests.helpers import interpreted_triton, load_script

ROOT = Path(__file__).resolve().parents[1]


md = load_script("missing_deps")


def _pyproject(tmp_path: Path, deps: list[str]) -> Path:
    p = tmp_path / "pyproject.toml"
    p.write_text("[project]\nname = 'x'\ndependencies = [" + ", ".join(repr(d) for d in deps)
                 + "]\n[project.optional-dependencies]\ntest = ['pytest>=7']\n")
    return p


def test_this_environment_has_every_declared_dependency():
    assert md.main([]) == 0
    assert md.main(["--extra", "test"]) == 0


def test_missing_and_too_old_are_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(md, "PYPROJECT", _pyproject(
        tmp_path, ["torch>=2.4", "no-such-package-fusebench>=1", "pytest>=999"]))
    assert md.main([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2
    assert out[0].startswith("no-such-package-fusebench>=1") and "not installed" in out[0]
    assert out[1].startswith("pytest>=999") and "installed: " in out[1]


def test_pin_prints_installed_versions_and_unknown_extra_is_usage_error(tmp_path, monkeypatch,
                                                                        capsys):
    import pytest as pt
    monkeypatch.setattr(md, "PYPROJECT", _pyproject(tmp_path, ["pytest>=7"]))
    assert md.main(["--pin"]) == 0
    assert capsys.readouterr().out.strip() == f"pytest=={pt.__version__}"
    assert md.main(["--extra", "nope"]) == 2
    assert "no optional-dependency group" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_gpu_check_stops_before_any_step_when_a_dependency_is_missing(tmp_path):
    (tmp_path / "scripts").mkdir()
    for f in ("gpu_check.sh", "missing_deps.py"):
        shutil.copy(ROOT / "scripts" / f, tmp_path / "scripts" / f)
    _pyproject(tmp_path, ["no-such-package-fusebench>=1"])
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(tmp_path / "scripts/gpu_check.sh")], capture_output=True,
                       text=True, timeout=60,
                       env={**os.environ, "OUT": str(out), "PYTHON": sys.executable})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "no-such-package-fusebench>=1  (not installed)" in r.stdout
    assert not (out / "env.log").exists()       # no step started


gk = load_script("gpu_kernels")


def test_gpu_kernels_runs_every_impl_in_one_process(tmp_path, monkeypatch, capsys):
    interpreted_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rc = gk.main([str(tmp_path), "--device", "cpu", "--families", "silu,bn_act",
                  "--dtypes", "float32", "--shape", "2,8,4,4", "--steps", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    _, recs = load_records(tmp_path / "kernels.json")
    got = {(r.spec.kernel.family, r.spec.kernel.impl, r.spec.channels_last): r for r in recs}
    for fam in ("silu", "bn_act"):
        for cl in (False, True):
            r = got[(fam, "triton", cl)]
            assert r.status == "ok" and r.correctness.passed
            assert r.correctness.max_rel_err_grad < 1e-5
    assert len(out.splitlines()) == len(recs) + 1
    gs = load_script("gpu_summary")
    s = gs.summarize(gs.records_under(tmp_path))
    assert {r["family"] for r in s["kernels"]} == {"silu", "bn_act"}
    assert json.dumps(s, default=str)


def test_gpu_kernels_unknown_family_or_bad_shape_is_usage_error(tmp_path, capsys):
    assert gk.main([str(tmp_path), "--families", "nope"]) == 2
    assert "unknown kernel families" in capsys.readouterr().err
    assert gk.main([str(tmp_path), "--shape", "2,8,4"]) == 2
    assert "expected 4 comma-separated sizes" in capsys.readouterr().err
    assert not (tmp_path / "kernels.json").exists()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_gpu_check_smoke_on_cpu(tmp_path):
    """The script's plumbing end to end on CPU (SMALL=1: tiny shapes; the heavy steps, each
    command tested on its own elsewhere, skipped): every step that runs leaves a log without
    a traceback, and the summary is written."""
    skip = ("kernels run_effnet_fused run_effnet_fused_bn_act_triton run_effnet_other_modes "
            "run_effnet_reduce_overhead")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "DEVICE": "cpu",
           "SMALL": "1", "SKIP": skip, "BUDGET": "300"}
    r = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh")], capture_output=True,
                       text=True, timeout=400, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "== kernel_ln2d_float32: rc=0" in r.stdout
    assert "== sites: rc=0" in r.stdout and "16 of 16 models ok" in r.stdout
    assert "== mlp: rc=0" in r.stdout and "4 of 4 shapes ok" in r.stdout
    assert "== run_effnet_fused: skipped (SKIP)" in r.stdout
    logs = list(tmp_path.glob("*.log"))
    assert logs and not [p.name for p in logs if "Traceback" in p.read_text()]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert {t["name"] for t in s["targets"]} >= {"triton_kernel_cells_not_ok",
                                                 "effnet_b3_fused_over_eager"}
    assert any(r["impl"] == "triton" and r["status"] == "ok" for r in s["kernels"])


def test_gpu_mlp_checks_the_triton_blocks_and_says_when_they_are_off(monkeypatch, capsys):
    """scripts/gpu_mlp.py's smoke on CPU (interpreted): every shape ok; then with the blocks'
    forward 1% off, each shape says MISMATCH and the exit code is 1."""
    import dataclasses

    from fusebench.fuse import mlp_blocks
    interpreted_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    gpu_mlp = load_script("gpu_mlp")
    assert gpu_mlp.main(["--device", "cpu", "--small"]) == 0
    assert "4 of 4 shapes ok" in capsys.readouterr().out
    impl = mlp_blocks.IMPLS["triton"]

    def off(*args):
        out, h0 = impl.forward(*args)
        return out * 1.01, h0
    monkeypatch.setitem(mlp_blocks.IMPLS, "triton", dataclasses.replace(impl, forward=off))
    assert gpu_mlp.main(["--device", "cpu", "--small"]) == 1
    out = capsys.readouterr().out
    assert out.count("MISMATCH") == 4 and "0 of 4 shapes ok" in out
