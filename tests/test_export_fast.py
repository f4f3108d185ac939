"""`fusebench export --format csv` writes from the rows (render/export.csv_of_files), not through
a DataFrame: the text must be the DataFrame's to_csv byte for byte (issue 14.7)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fusebench.render.export import csv_of_files, to_csv
from fusebench.results.frame import load_results
from tests.factories import document, fake_env, kernel_record, model_record, write_results
from tests.test_items import _mixed

ASSETS = Path(__file__).parent / "assets"


def _odd_env() -> dict:
    """Env values of every JSON type: lists, None, bools, numbers, text a spreadsheet runs."""
    env = fake_env()
    env["gpus"] = {"nvml": True, "devices": [{"name": "=cmd|' /C calc'!A0"}, {"name": "B"}]}
    env["note"], env["flags"], env["ratio"] = None, ["a", "b"], 0.5
    return env


def _files(tmp_path) -> dict[str, list[Path]]:
    mixed = write_results(tmp_path / "mixed.json", _mixed())
    odd = write_results(tmp_path / "odd.json", [
        model_record("=HYPERLINK(1)", "eager", extra={"gbps": 3, "tag": "x"}),
        model_record("m\x1b[2Jx", "compile", extra={"gbps": 2.5, "tag": None}),
        model_record("big", "eager", extra={"count": 2 ** 70}),
        kernel_record("sqm", base_ms=0.25)], env=_odd_env())
    doc = document([model_record("n", "eager")])
    doc["created"] = None
    nocreated = tmp_path / "nocreated.json"
    nocreated.write_text(json.dumps(doc))
    return {"mixed": [mixed], "odd": [odd], "no created": [nocreated],
            "fusebench/1": [ASSETS / "results_v1.json"],
            "several": [mixed, odd, nocreated, ASSETS / "results_v1.json"]}


@pytest.mark.parametrize("case", ["mixed", "odd", "no created", "fusebench/1", "several"])
def test_csv_without_the_frame_is_the_frames_csv(tmp_path, case):
    paths = _files(tmp_path)[case]
    fast = csv_of_files(paths)
    assert fast == to_csv(load_results(paths))
    assert fast.count("\n") > 1


def test_no_records_is_the_frames_csv(tmp_path):
    empty = write_results(tmp_path / "empty.json", [])
    assert csv_of_files([empty]) == to_csv(load_results([empty]))


def test_pieces_are_the_frames_csv_in_order(tmp_path, monkeypatch):
    """Rows joined a piece at a time (here 2 rows a piece: blocks end mid-file and at a
    file's end) make the same text, and `export -o` writes exactly that text."""
    from typer.testing import CliRunner

    from fusebench.cli import app
    from fusebench.render import export

    monkeypatch.setattr(export, "_ROWS_PER_PIECE", 2)
    paths = _files(tmp_path)["several"]
    pieces = list(export.csv_pieces(paths))
    assert len(pieces) > 4 and all(p.endswith("\n") for p in pieces)
    assert "".join(pieces) == to_csv(load_results(paths))
    out = tmp_path / "out.csv"
    res = CliRunner().invoke(app, ["export", *map(str, paths), "--format", "csv", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text() == "".join(pieces)


def test_pieces_raise_before_any_text(tmp_path):
    """A bad file anywhere in the list fails the call itself, not the iteration: nothing is
    written to stdout before the error."""
    from fusebench.errors import UsageError
    from fusebench.render.export import csv_pieces

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "fusebench/2", "records": [{"status": "ok"}]}')
    with pytest.raises(UsageError):
        csv_pieces([_files(tmp_path)["mixed"][0], bad])
