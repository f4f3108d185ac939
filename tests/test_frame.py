"""load_results -> DataFrame, and `fusebench export` to CSV / markdown."""
from __future__ import annotations

import io

import pandas as pd
import pytest
from typer.testing import CliRunner

import fusebench
from tests.factories import fake_env, kernel_record, model_record, modes_run, write_results
from fusebench.cli import app
from fusebench.render.export import to_markdown

runner = CliRunner()


@pytest.fixture
def two_files(tmp_path):
    a = write_results(tmp_path / "a.json", modes_run(seed=1) + [model_record(
        "convnext_tiny", "torchscript", status="error")])
    b = write_results(tmp_path / "b.json", [kernel_record("permute"), kernel_record("fused")],
                      env=fake_env(**{"torch.version": "2.12.0"}))
    return a, b


def test_load_results_rows_and_columns(two_files):
    df = fusebench.load_results(two_files)
    assert isinstance(df, pd.DataFrame) and len(df) == 5
    for col in ("file", "model", "mode", "status", "step_ms.median", "step_ms.p90",
                "step_ms.samples", "correctness.passed", "n_events", "env.torch.version",
                "env.cpu.model", "impl", "gbps", "shape"):
        assert col in df.columns, col
    assert set(df["env.torch.version"]) == {"2.13.0+cpu", "2.12.0"}
    ok = df[df["status"] == "ok"]
    assert (ok["step_ms.median"] > 0).all()
    assert len(ok.iloc[0]["step_ms.samples"]) == 40
    assert pd.isna(df[df["status"] == "error"].iloc[0]["step_ms.median"])
    # env columns come last
    first_env = min(i for i, c in enumerate(df.columns) if c.startswith("env."))
    assert all(c.startswith("env.") for c in df.columns[first_env:])
    # a single path works too
    assert len(fusebench.load_results(two_files[0])) == 3


def test_load_results_bad_file_is_usage_error(tmp_path):
    from fusebench.errors import UsageError
    with pytest.raises(UsageError):
        fusebench.load_results([tmp_path / "nope.json"])


def test_markdown_table_escapes_pipes():
    df = pd.DataFrame([{"model": "a|b", "mode": "eager", "throughput": 1234.5678}])
    md = to_markdown(df)
    assert md.splitlines()[0] == "| model | mode | throughput |"
    assert "a\\|b" in md and "1235" in md


def test_cli_export_csv_roundtrip(two_files):
    res = runner.invoke(app, ["export", str(two_files[0]), "--format", "csv"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(io.StringIO(res.stdout))
    assert len(df) == 3 and "env.torch.version" in df.columns
    assert df["step_ms.samples"].iloc[0].startswith("[")      # lists as JSON


def test_cli_export_markdown_to_file(two_files, tmp_path):
    out = tmp_path / "out" / "table.md"
    res = runner.invoke(app, ["export", *map(str, two_files), "--format", "markdown",
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = out.read_text().splitlines()
    assert lines[0].startswith("| model | mode | impl |") and len(lines) == 2 + 5


@pytest.mark.parametrize("args", [["--format", "xlsx"], []])
def test_cli_export_bad_input_exit2(tmp_path, args):
    p = tmp_path / "x.json"
    p.write_text('{"schema": "other/1"}')
    res = runner.invoke(app, ["export", str(p), *args])
    assert res.exit_code == 2, res.output
