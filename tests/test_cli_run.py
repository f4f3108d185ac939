"""`fusebench run` end to end: CliRunner in-process and a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from fusebench.cli import app, main
from fusebench.results.document import load
from tests.helpers import TINY, with_fault_modes

runner = CliRunner()
FAST = ["-b", "2", "--steps", "2", "--warmup", "1", "--threads", "1"]


def test_run_saves_document_and_prints_table(tmp_path):
    res = runner.invoke(app, ["run", TINY, "-m", "eager,aot", *FAST, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    doc = load(files[0])
    assert doc["schema"] == "fusebench/2" and doc["env"]["torch"]["version"]
    recs = doc["records"]
    assert [r["spec"]["mode"] for r in recs] == ["eager", "aot"]
    for r in recs:
        assert r["status"] == "ok" and r["spec"]["model"]["img_size"] == 16 and r["params"] == 330  # conv 224 + bn 16 + fc 90
        assert r["step_ms"]["n"] == 2 and len(r["step_ms"]["samples"]) == 2
        assert r["throughput"] > 0 and r["activation_bytes"] > 0
    assert recs[1]["correctness"]["passed"] is True
    assert recs[1]["correctness"]["checked_at"] == ["first", "steady"]
    assert "vs eager" in res.output and "aot" in res.output


def test_json_prints_only_the_document_and_exit_1_when_a_cell_is_not_ok(monkeypatch, tmp_path):
    with_fault_modes(monkeypatch)
    res = runner.invoke(app, ["run", TINY, "-m", "eager,test_unavailable", *FAST, "--json",
                              "--no-save", "--out", str(tmp_path)])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert [r["status"] for r in doc["records"]] == ["ok", "unavailable"]
    assert doc["records"][1]["error"]["message"] == "planted: this mode never runs"
    assert not list(tmp_path.iterdir())          # --no-save writes nothing


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    cases = [
        ["run", "efficientnet_b9"],
        ["run", TINY, "-m", "eagre"],
        ["run", TINY, "-b", "0"],
        ["run", TINY, "-b", "8,,16"],
        ["run", TINY, "--img-size", "-3"],
        ["run", "convnext_atto", "--img-size", "16"],
        ["run", TINY, "--device", "cuda:7"],
        ["run", TINY, "--amp", "--dtype", "bfloat16"],
        ["run", TINY, "--ts-fuser", "bogus"],
        ["run", "no/such/file.py:f"],
        ["run", TINY, "--model-kwarg", "nonsense"],
    ]
    for argv in cases:
        code = main([*argv, "--out", str(tmp_path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, argv
        assert len(err) == 1 and err[0].startswith("fusebench: error:"), (argv, err)
        assert "Traceback" not in err[0]
    assert not list(tmp_path.iterdir())


def test_unknown_names_get_close_matches(capsys):
    assert main(["run", "convnext_tiy"]) == 2
    assert "did you mean convnext_tiny" in capsys.readouterr().err


def test_real_subprocess_json(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fusebench", "run", TINY, "-m", "eager",
                           "--bench", "infer", *FAST, "--json", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rec = doc["records"][0]
    assert rec["spec"]["model"]["bench"] == "infer" and rec["status"] == "ok"
    assert rec["activation_bytes"] is None        # nothing is saved for backward in inference
    saved = list(tmp_path.glob("*.json"))
    assert len(saved) == 1 and load(saved[0])["records"] == doc["records"]


def test_cells_carry_only_their_modes_non_default_options():
    from fusebench.run.plan import RunRequest, plan_run
    specs = plan_run(RunRequest(models=TINY, modes="eager,torchscript,aot",
                                mode_options={"ts_fuser": "none", "aot_compiler": "nop",
                                              "compile_backend": "inductor"}))
    assert {s.mode: s.mode_options for s in specs} == {
        "eager": (), "torchscript": (("ts_fuser", "none"),), "aot": ()}
