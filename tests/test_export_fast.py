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
