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


@pytest.mark.parametrize("case", ["mixed", "odd", "several"])
def test_text_columns_in_blocks_are_the_frames_csv(tmp_path, monkeypatch, case):
    """Long text columns are written a block of values at a time (here 2 or 3: blocks end
    inside a file, and layouts, types and fast paths change from block to block)."""
    from fusebench.render import export
    paths = _files(tmp_path)[case]
    want = to_csv(load_results(paths))
    for block in (2, 3):
        monkeypatch.setattr(export, "_BLOCK", block)
        assert csv_of_files(paths) == want


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


# --- the JSON-cell fast paths (render/export._number_list_cells, _dict_cells) ---------------------
def _slow_cells(values):
    from fusebench.render.csvtext import fields
    from fusebench.render.export import _column_text
    return fields(_column_text(values))


_NUMBER_LISTS = {
    "floats": ([[1.5, 2.25], [126.2496, 131.7581, 0.1]] * 3, True),
    "every kind of number": ([[float("nan"), float("inf")], [-0.0, 0.0, 1e-05, 1e16],
                              [2 ** 70, -3, True, None], (1.0, 2.0)], True),
    "one number": ([[1.0, 2.0], [3.0]], False),         # no comma: the csv module does not quote
    "empty": ([[1.0, 2.0], []], False),
    "text": ([[1.0, 2.0], [1.0, "a,b"]], False),
    "nested": ([[1.0, 2.0], [[1.0], [2.0]]], False),
    "a dict": ([[1.0, 2.0], [{"a": 1}, 2.0]], False),
}


@pytest.mark.parametrize("values", [
    [["first", "steady"]] * 5,                  # one list of texts: its cell written once
    [["first", "steady"]] * 4 + [("first", "steady")],
    [["a,b", '"q"']] * 3 + [["a,b", '"q"', "c"]],
    [["=SUM(1)"]] * 3, [[]] * 3, [["1"], [1], [1.0]], [[1], [1.0], [True]],
])
def test_block_cells_are_the_slow_cells(values):
    from fusebench.render.export import _block_cells
    assert _block_cells(values) == _slow_cells(values)


@pytest.mark.parametrize("case", list(_NUMBER_LISTS))
def test_number_list_cells_are_the_slow_cells(case):
    from fusebench.render.export import _number_list_cells, _text_cells
    values, fast = _NUMBER_LISTS[case]
    cells = _number_list_cells(values)
    assert (cells is not None) == fast
    assert _text_cells(values) == _slow_cells(values)
    if fast:
        assert cells == _slow_cells(values)


def _specs(names, **vary) -> list[dict]:
    """Spec dicts of one layout, as a results file holds them: names vary, plus `vary`
    (key -> one value per spec, set at the top level of each spec)."""
    specs = [model_record(n, "eager" if i % 2 else "compile", batch_size=2 ** (i % 4)
                          ).to_dict()["spec"] for i, n in enumerate(names)]
    for key, values in vary.items():
        for s, v in zip(specs, values):
            s[key] = v
    return specs


_HOSTILE = ['=HYPERLINK("http://x","y")', 'a"b""c', "back\\slash", "%s%d%%", "m\x1b[2Jx",
            "new\nline", "tab\tcr\r", "+cmd", "@SUM(1)", "", "\x00", "\u0000%d"]


def _dict_cases() -> dict[str, tuple[list[dict], bool]]:
    names = [f"model_{i:03d}" for i in range(12)]
    kw = _specs(names)
    for s in kw:
        s["model"]["kwargs"] = {"depth": 2, "act": "gelu"}     # constant, not empty: descended
    kw_leaf = _specs(names)             # {} first: a leaf, whose JSON varies
    kw_leaf[3]["model"]["kwargs"] = {"depth": 3}
    kw_vary = json.loads(json.dumps(kw))
    kw_vary[3]["model"]["kwargs"] = {"depth": 3}
    order = _specs(names)
    order[5] = dict(reversed(order[5].items()))
    collide = _specs(names, cache_dir=["\x000\x00"] * 12)     # holds a slot's text
    return {
        "names": (_specs(names), True),
        "hostile text": (_specs(_HOSTILE), True),
        "numbers": (_specs(names, seed=[1, 1.0, True, 2 ** 70, -1, 0] * 2,
                           budget=[1e-05, 0.5, -0.0, 0.0, 1e16, float("inf")] * 2,
                           timeout=[float("nan")] * 12), True),
        "zero signs": (_specs(names, budget=[0.0] * 11 + [-0.0], timeout=[2.5] * 12,
                              seed=[0] * 11 + [0.0]), True),
        "lists": (_specs(names, threads=[[], (), [1, "a"], None] * 3), True),
        "constant kwargs": (kw, True),
        "kwargs as a varying leaf": (kw_leaf, True),
        "kwargs of another layout": (kw_vary, False),
        "key order": (order, False),
        "unicode": (_specs([*names[:-1], "modèle"]), False),
        "DEL": (_specs([*names[:-1], "a\x7fb"]), False),
        "slot text in a constant": (collide, False),
        "empty dicts": ([{}, {}, {}], False),
        "not all dicts": ([{"a": 1}, [1, 2]], False),
    }


@pytest.mark.parametrize("case", list(_dict_cases()))
def test_dict_cells_are_the_slow_cells(case):
    from fusebench.render.export import _dict_cells, _text_cells
    values, fast = _dict_cases()[case]
    slow = _slow_cells(values)
    cells = _dict_cells(values)
    assert (cells is not None) == fast
    if fast:
        assert cells == slow
    assert _text_cells(values) == slow


def test_csv_of_many_records_with_hostile_varying_values(tmp_path):
    """A file whose specs take the template (names with quotes, formulas, control
    characters, %) and samples the number-list path: still byte for byte the frame's CSV."""
    from fusebench.render.export import _dict_cells
    recs = [model_record(n, m, batch_size=b, seed=i) for i, (n, m, b) in enumerate(
        (n, m, b) for n in _HOSTILE[:9] for m in ("eager", "compile") for b in (1, 8))]
    path = write_results(tmp_path / "hostile.json", recs)
    text = csv_of_files([path])
    assert text == to_csv(load_results([path]))
    specs = [json.loads(line)["spec"] for line in [json.dumps(r.to_dict()) for r in recs]]
    assert _dict_cells(specs) is not None        # the template path was the one tested


def test_loaded_columns_are_settled_before_the_rows_are_written(tmp_path, monkeypatch):
    """csv_pieces tells bulk.settled how many rows stay alive while they are written (a big
    export then freezes them: the first collection after the GC pause would walk them all)."""
    from fusebench.render import export
    counts = []
    monkeypatch.setattr(export, "settled", counts.append)
    paths = _files(tmp_path)["several"]
    text = "".join(export.csv_pieces(paths))
    assert counts == [text.count("\n") - 1]
