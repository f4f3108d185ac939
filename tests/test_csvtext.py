"""The column-at-a-time CSV writers (issue 14.7) write what the csv module writes, byte for
byte: render/csvtext.fields, compare --format csv (render_csv), and the export's columns
(results/columns.py) are file_rows' rows."""
from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from fusebench.render.compare_table import _dict_rows, render_csv
from fusebench.render.csvtext import fields, number_fields
from fusebench.render.export import _json, _json_all
from fusebench.results.columns import file_columns
from fusebench.results.compare import compare_modes, get_metric
from fusebench.results.document import load_exact
from fusebench.results.frame import file_rows
from tests.factories import write_results
from tests.test_items import _mixed
from tests.test_scale import _records


def _writer_cells(values) -> list[str]:
    """Each value as csv.writer writes it as one field of a row of two. A NUL, which Python
    3.10's writer refuses, is written as 3.11+ writes it: as an ordinary character (\x01
    stands in for it)."""
    out = []
    for v in values:
        nul = isinstance(v, str) and "\x00" in v and not _writes_nul()
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([v.replace("\x00", "\x01") if nul else v,
                                                       "x"])
        cell = buf.getvalue()[:-3]
        out.append(cell.replace("\x01", "\x00") if nul else cell)
    return out


def _writes_nul() -> bool:
    try:
        csv.writer(io.StringIO()).writerow(["a\x00b"])
    except csv.Error:
        return False
    return True


def _floats(n: int, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)
    edge = [0.0, -0.0, 5e-324, 1e-5, 1.5e-5, 9.99e-5, 1e-4, 1e-6, 1e15, 1e16, 1e22, 0.1 + 0.2,
            1.7976931348623157e308, 2.5, 100.0, 10.00001, -100.00005, 1230.000012, 1.0000123,
            -1.5e-05, -9.99e-05, 10.0000123, -0.00001234]
    return edge + [float(x) for x in xs]


@pytest.mark.parametrize("column", [
    _floats(3000),
    _floats(500, 1) + [None] * 50,
    [1e-05] * 400 + [1e-06] * 400,                      # few values: each written once
    [0.0, -0.0] * 200,
    list(range(-300, 300)) + [2 ** 70, None],
    [1, 2.0, None] * 100,
    [True, False, None] * 50,
    [float("nan"), float("inf"), 1.0] * 50,
    ["a", "b,c", 'say "hi"', "two\nlines", "", None, 3, 2.5] * 20,
    [json.dumps([i, i + 0.5]) for i in range(1500)],    # distinct texts that all need quotes
    ['x\x00y,z'] + [f"[{i},1]" for i in range(1500)],  # one that holds the separator
    # one value throughout (written once), and columns that only look like it
    [1.0e-05] * 300, [2 ** 40] * 300, [None] * 300, [float("nan")] * 300,
    [-0.0] * 300, [0.0] * 299 + [-0.0], [0] * 300, [1] * 299 + [1.0], [1.0] * 299 + [True],
])
def test_fields_are_what_the_csv_module_writes(column):
    assert fields(column) == _writer_cells(column)
    assert fields(tuple(column)) == _writer_cells(column)       # columns.py gives tuples
    kinds = set(map(type, column))
    assert fields(column, kinds | {int, float, type(None)}) == _writer_cells(column)


def test_number_fields_is_repr_for_every_float():
    xs = _floats(20000, 2)
    assert number_fields(xs) == [repr(x) for x in xs]
    assert number_fields(["a"] * 200) is None


def test_json_cells_are_ascii_json_of_the_same_values():
    values = [[1.5, 1e-06, 2 ** 70], {"a": ["x", "\x00", "é", "\x7f", "\u2028"]}, [], {},
              ("t", 1), ["=cmd"]]
    texts = _json_all(values)
    assert texts == [_json(v) for v in values]
    for v, t in zip(values, texts):
        assert t.isascii() and json.loads(t) == (list(v) if isinstance(v, tuple) else v)
        assert "\x7f" not in t and "\x00" not in t


def test_compare_csv_is_dictwriters_text():
    cmp = compare_modes(_mixed() * 3, get_metric("throughput"))
    rows = _dict_rows(cmp)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    assert render_csv(cmp) == buf.getvalue()


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float)
                      and math.isnan(a) and math.isnan(b))


def test_columns_are_the_rows(tmp_path):
    """Every record layout, interleaved (several layouts in one file)."""
    recs = _records() + _mixed() + _records()[::-1]
    path = write_results(tmp_path / "r.json", recs)
    assert load_exact(path) is not None         # the columnar path, not the rows
    fc, fr = file_columns(path), file_rows(path)
    assert fc.n == len(fr.rows) and fc.names == fr.columns
    assert fc.env == tuple(fr.env) and fc.head == tuple(fr.head)
    for c in fr.columns:
        got = list(fc.columns[c])
        want = [r.get(c) for r in fr.rows]
        assert all(_same(a, b) for a, b in zip(got, want)) and len(got) == len(want), c


def test_records_checked_in_pieces_are_the_whole_documents(tmp_path, monkeypatch):
    """schema._in_pieces (big files: the records checked a piece of the text at a time) gives
    what one check of the whole document gives, and refuses what it refuses."""
    from fusebench.results import schema
    recs = _records() + _mixed()
    raw = write_results(tmp_path / "r.json", recs).read_bytes()
    monkeypatch.setattr(schema, "PIECE", 300)      # a few records a piece
    whole = schema._DOCUMENT.validate_json(raw)
    assert schema._in_pieces(raw) == whole and schema.parse_exact(raw) == whole
    for i in (0, len(recs) // 2, len(recs) - 1):     # a bad record in any piece
        bad = json.loads(raw)
        bad["records"][i]["status"] = 3
        bad_raw = (json.dumps(bad, indent=1) + "\n").encode()
        with pytest.raises(ValidationError):
            schema._in_pieces(bad_raw)
        assert schema.parse_exact(bad_raw) is None
    compact = json.dumps(json.loads(raw)).encode()             # another layout: checked whole
    assert schema._in_pieces(compact) is None and schema.parse_exact(compact) == whole
