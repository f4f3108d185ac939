"""Hostile text in results files is shown, never obeyed: rich markup, mathtext, spreadsheet
formulas and terminal escapes in model names and other text fields. And a worker's malformed
record becomes an `error` record for its cell."""
from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console

from fusebench.cli import main
from fusebench.render import escape
from fusebench.results.document import record_from_worker
from fusebench.spec import CellSpec
from tests.factories import model_record, write_results

HOSTILE = ["[/bad]", "[bold red]x[/]", "$\\foo{$", "=HYPERLINK(\"http://x\",\"y\")",
           "+cmd|' /C calc'!A0", "@SUM(1)", "\x1b[2J\x1b[31mred", "bell\x07nul\x00", "-x"]


def test_helpers():
    assert escape.printable("a\x1b[2Jb\x00") == "a\\x1b[2Jb\\x00"
    assert escape.printable("tab\tnew\nline") == "tab\tnew\nline"
    assert escape.rich_text("[/bad]").plain == "[/bad]"
    assert escape.cell("=1+1") == "'=1+1" and escape.cell("-x") == "'-x"
    assert escape.cell("-1.5") == "-1.5" and escape.cell(3) == 3 and escape.cell(None) is None
    assert escape.cell(escape.cell("@x")) == "'@x"      # idempotent
    Console(file=io.StringIO()).print(escape.markup("[/bad] \x1b[2J"))   # no MarkupError


@pytest.fixture
def hostile_file(tmp_path):
    recs = []
    for i, name in enumerate(HOSTILE):
        recs += [model_record(name, "eager", base_ms=100.0, seed=2 * i),
                 model_record(name, "compile", base_ms=80.0, seed=2 * i + 1)]
    return write_results(tmp_path / "hostile.json", recs)


def _run(capsys, argv) -> tuple[str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in out + err
    return out, err


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_compare_shows_hostile_names(capsys, hostile_file, fmt, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    out, _ = _run(capsys, ["compare", hostile_file, "--format", fmt])
    assert "\x1b[2J" not in out and "\x07" not in out and "\x00" not in out
    if fmt == "table":
        assert "[/bad]" in out and "$\\foo{$" in out
    if fmt in ("markdown", "csv"):
        assert "'=HYPERLINK" in out and "'+cmd" in out and "'@SUM" in out
    if fmt == "csv":
        cells = [c for row in csv.reader(io.StringIO(out)) for c in row]
        assert not any(c.startswith(("=", "+", "@")) for c in cells)


@pytest.mark.parametrize("fmt", ["csv", "markdown"])
def test_export_quotes_formulas_and_controls(capsys, hostile_file, tmp_path, fmt):
    target = tmp_path / f"out.{fmt}"
    _run(capsys, ["export", hostile_file, "--format", fmt, "-o", target])
    text = target.read_text()
    assert "\x1b" not in text and "\x00" not in text and "\\x1b[2J" in text
    assert "'=HYPERLINK" in text
    if fmt == "csv":
        for row in csv.DictReader(io.StringIO(text)):
            assert not any(str(v).startswith(("=", "+", "@")) for v in row.values())


@pytest.mark.parametrize("kind", ["speedup", "throughput"])
def test_plot_with_mathtext_and_markup_names(capsys, hostile_file, tmp_path, kind):
    target = tmp_path / f"{kind}.png"
    _run(capsys, ["plot", hostile_file, "--figure", kind, "-o", target])
    assert target.stat().st_size > 1000


def test_run_and_kernel_tables_escape_text():
    from fusebench.render.kernel_table import kernel_table
    from fusebench.render.run_table import run_table
    from tests.factories import kernel_record
    buf = io.StringIO()
    con = Console(file=buf, width=250)
    con.print(run_table([model_record(n, "eager", seed=i) for i, n in enumerate(HOSTILE)]))
    con.print(kernel_table([kernel_record("[/bad]\x1b[2J")]))
    text = buf.getvalue()
    assert "[/bad]" in text and "\x1b[2J" not in text


# --------------------------------------------------------------- a worker's malformed record
SPEC = CellSpec.for_model("convnext_atto", "eager", batch_size=2)


@pytest.mark.parametrize("content", [
    "garbage", "", "{}", '{"model": 1}', "[1, 2]", '{"spec": 5, "status": "ok"}',
    json.dumps({**model_record().to_dict(), "throughput": "fast"}),
    json.dumps({**model_record().to_dict(), "status": "great"}),
    json.dumps(model_record().to_dict()).replace("1.5", "NaN", 1),
    "[" * 100_000 + "]" * 100_000])
def test_malformed_worker_record_is_an_error_record(tmp_path, content):
    p = tmp_path / "record.json"
    p.write_text(content)
    rec = record_from_worker(p, SPEC)
    assert rec.status == "error" and rec.spec == SPEC
    assert rec.error.type == "MalformedRecord"
    assert "the worker's record was malformed" in rec.error.message


def test_a_missing_dependency_is_an_error_record_not_a_crash(tmp_path, monkeypatch):
    """A GPU image without pydantic (2026-12-04): each cell says why, the run goes on."""
    import sys
    monkeypatch.setitem(sys.modules, "fusebench.results.schema", None)   # import fails
    p = tmp_path / "record.json"
    p.write_text(json.dumps(model_record("convnext_atto", batch_size=2).to_dict()))
    rec = record_from_worker(p, SPEC)
    assert rec.status == "error" and rec.spec == SPEC and rec.error.type == "ImportError"
    assert "could not check the worker's record" in rec.error.message


def test_good_worker_record_is_read(tmp_path):
    p = tmp_path / "record.json"
    good = model_record("convnext_atto", batch_size=2)
    p.write_text(json.dumps(good.to_dict()))
    assert record_from_worker(p, SPEC) == good


def test_runner_reads_worker_records_through_the_validator():
    import inspect
    from fusebench.run import runner
    assert "record_from_worker(" in inspect.getsource(runner._Worker.wait)
