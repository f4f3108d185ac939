"""`fusebench run` end to end: CliRunner in-process and a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fusebench.cli import app, main
from fusebench.results.document import load
from tests.helpers import TINY

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


def test_json_prints_only_the_document_and_exit_1_when_a_cell_is_not_ok(fault_modes, tmp_path):
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
        ["run", TINY, "--amp-dtype", "bfloat16", "--dtype", "bfloat16"],
        ["run", TINY, "--amp-dtype", "float64"],
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


# --- the CLI generated from the declarations ---------------------------------------------------

def _captured_request(monkeypatch, argv):
    """Run the CLI up to the plan and return the RunRequest it built (nothing runs)."""
    import fusebench.run.plan as plan
    import fusebench.run.session as session
    seen = []
    monkeypatch.setattr(plan, "plan_run", lambda req: seen.append(req) or [])
    monkeypatch.setattr(session, "execute", lambda specs, **kw: 0)
    assert main(argv) == 0
    return seen[0]


def _help(*command) -> str:
    res = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    return res.output


def test_compile_fullgraph_and_dynamic_reach_the_cells(monkeypatch):
    from fusebench.run.plan import plan_run
    req = _captured_request(monkeypatch, ["run", TINY, "-m", "compile", "--compile-fullgraph",
                                          "--no-compile-dynamic", "--compile-mode", "default"])
    assert req.mode_options["compile_fullgraph"] is True
    assert req.mode_options["compile_dynamic"] is False
    monkeypatch.undo()
    (spec,) = plan_run(req)
    assert dict(spec.mode_options) == {"compile_fullgraph": True, "compile_dynamic": False,
                                       "compile_mode": "default"}


def test_short_k_is_model_kwarg_in_run_and_info(monkeypatch):
    req = _captured_request(monkeypatch, ["run", TINY, "-k", "num_classes=10", "-k", "x = 1"])
    assert req.model_kwargs == ("num_classes=10", "x = 1")
    assert "-k" in _help("info") and "-k" in _help("run")


@pytest.mark.parametrize("bad", ["1x=3", "a=1,a=2"])
def test_run_and_info_parse_model_kwargs_by_the_same_rules(capsys, bad):
    args = [a for part in bad.split(",") for a in ("-k", part)]
    for command in (["run", TINY, "--no-save"], ["info", TINY]):
        assert main([*command, *args]) == 2, command
        assert "--model-kwarg" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["run"], ["kernel"], ["compare"], ["plot"], ["export"],
                                     ["env"], ["info"], ["list", "modes"], ["list"], []])
def test_bool_flags_render_as_flags(command):
    text = _help(*command)
    assert "<bool>" not in text
    if command == ["run"]:
        for flag in ("--channels-last", "--no-save"):
            line = next(ln for ln in text.splitlines() if f"{flag} " in ln)
            assert len(line.split(flag, 1)[1].strip(" │")) > 10, line   # has help text


def test_option_choices_are_the_registries_keys():
    from fusebench.commands import compare, export, kernel, plot, run
    from fusebench.dtypes import AMP_DTYPES, DTYPES, MODEL_DTYPES
    from fusebench.render.compare_table import TEXT_RENDERERS
    from fusebench.render.plot import PLOTS
    from fusebench.results.compare import METRICS
    from fusebench.render.export import EXPORTERS
    values = lambda enum: [m.value for m in enum]  # noqa: E731
    assert values(run.Dtype) == list(MODEL_DTYPES) and values(kernel.Dtype) == list(DTYPES)
    assert values(run.AmpDtype) == list(AMP_DTYPES)
    assert values(compare.MetricChoice) == list(METRICS)
    assert values(compare.CompareFormat) == ["table", *TEXT_RENDERERS]
    assert values(plot.Figure) == list(PLOTS) and values(export.ExportFormat) == list(EXPORTERS)


@pytest.mark.parametrize("amp_dtype", ["bfloat16", "float16"])
def test_amp_dtype_reaches_autocast_and_the_record(tmp_path, monkeypatch, amp_dtype):
    """--amp-dtype implies --amp, the model computes in that dtype, the record and label say it."""
    from pathlib import Path
    seen = tmp_path / "autocast.txt"
    monkeypatch.setenv("FUSEBENCH_TEST_AUTOCAST_FILE", str(seen))
    probe = f"{Path(__file__).parent / 'assets' / 'probe_models.py'}:autocast_probe"
    res = runner.invoke(app, ["run", probe, "-m", "eager", *FAST, "--amp-dtype", amp_dtype,
                              "--json", "--no-save"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)["records"][0]
    assert rec["spec"]["model"]["amp"] is True and rec["spec"]["model"]["amp_dtype"] == amp_dtype
    assert set(seen.read_text().split()) == {amp_dtype}
    short = {"bfloat16": "bf16", "float16": "fp16"}[amp_dtype]
    from fusebench.spec import CellSpec
    assert f"amp-{short}" in CellSpec.from_dict(rec["spec"]).config_label()
