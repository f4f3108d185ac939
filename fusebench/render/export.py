"""A results DataFrame (results/frame.py) as text for other tools: `fusebench export`."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import to_json

from fusebench.render.csvtext import fields, quote
from fusebench.render.escape import cell as safe_cell, cells as safe_cells
from fusebench.results.bulk import paused_gc
from fusebench.results.columns import Const, FileColumns, file_columns
from fusebench.results.frame import SUMMARY_COLUMNS, as_paths, load_results, ordered_columns

if TYPE_CHECKING:      # pandas is imported by the DataFrame exports only (~0.5 s)
    import pandas as pd


# JSON cells (lists, dicts) are compact and ASCII-only: pydantic-core (installed with typer)
# writes them ~10x faster than the json module, whose per-float repr was most of the cost of a
# 100,000-record export (40 step samples a row). Its text is used only when it is pure ASCII
# without DEL: then every control character is a \uXXXX or \n-style escape, as the json
# module's ensure_ascii writes it; anything else goes through the json module (same
# separators). JSON of a list or dict starts with [ or {, never a formula: a safe cell.
_C_ENCODER = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, str, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
_JSON = json.JSONEncoder(default=str, separators=(",", ":"))


def _json_slow(v: Any) -> str:
    return "".join(_C_ENCODER(v, 0)) if _C_ENCODER else _JSON.encode(v)


def _to_json(v: Any) -> bytes:
    return to_json(v, inf_nan_mode="constants", fallback=str)


def _json(v: Any) -> str:
    try:
        b = _to_json(v)
    except (TypeError, ValueError):     # pydantic_core.PydanticSerializationError is one
        return _json_slow(v)
    return b.decode() if b.isascii() and b"\x7f" not in b else _json_slow(v)


_SEP = "\x00"                       # between a column's values in its one JSON text
_SEP_JSON = ',"\\u0000",'


def _json_all(values: Sequence[Any]) -> list[str]:
    """_json of each value of a column of lists and dicts, in one call of the encoder: the
    column's values with a separator string between them, written as one JSON list and split
    at the separators. Exact when the separator's text occurs only between values (a value
    holding it makes more pieces: then one call per value)."""
    if len(values) == 0:
        return []
    mixed: list[Any] = [_SEP] * (2 * len(values) - 1)
    mixed[::2] = values
    try:
        b = _to_json(mixed)
    except (TypeError, ValueError):
        return list(map(_json, values))
    if not b.isascii() or b"\x7f" in b:
        return list(map(_json, values))
    parts = b.decode()[1:-1].split(_SEP_JSON)
    return parts if len(parts) == len(values) else list(map(_json, values))


_CONTAINERS = (list, tuple, dict)


def _cell_text(v: Any) -> Any:
    """Lists/dicts as JSON so CSV cells stay one value each; text made safe for spreadsheets."""
    if v is None or type(v) in (int, float, bool):      # the common case, first
        return v
    if isinstance(v, _CONTAINERS):
        return _json(v)
    return safe_cell(v)


def _column_text(values) -> list[Any]:
    """_cell_text of every value. A column without lists or dicts maps each distinct string
    once (env columns repeat one value 100,000 times, names and modes a few); numbers, bools
    and None pass unchanged."""
    kinds = set(map(type, values))
    if kinds and kinds <= set(_CONTAINERS):
        return _json_all(values)
    if not kinds <= {str, int, float, bool, type(None)}:
        return [_cell_text(v) for v in values]
    return safe_cells(values)


def to_csv(df: pd.DataFrame) -> str:
    import pandas as pd
    # only non-numeric columns hold text, lists or dicts: numeric columns pass untouched
    out = df.copy(deep=False)
    for col in [c for c in out.columns if not pd.api.types.is_numeric_dtype(out[c])]:
        values = out[col].to_numpy(dtype=object)     # iterating a Series is slow
        out[col] = pd.Series(_column_text(values), index=out.index, dtype=object)
    return out.to_csv(index=False)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(_cell_text(v))


def to_markdown(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A markdown table of the summary columns (or `columns`); no tabulate dependency."""
    # imported here: compare_table brings numpy and the statistics (~0.2 s the CSV export
    # does not need)
    from fusebench.render.compare_table import markdown_table
    cols = [c for c in (columns or SUMMARY_COLUMNS) if c in df.columns]
    if df.empty or not cols:
        return markdown_table(cols or ["(no records)"], [])
    rows = [[_fmt(v) for v in rec] for rec in df[cols].itertuples(index=False, name=None)]
    return markdown_table(cols, rows)


# --- CSV straight from the rows ----------------------------------------------------------------
# to_csv(load_results(files)) without the DataFrame: pandas formats every cell of an object
# column in Python and took ~11 of the ~25 CPU-seconds of a 100,000-record export. The text is
# the same: each column is formatted as pandas formats the dtype it infers for it (int64, float64,
# bool or object), tests/test_export_fast.py compares the two byte for byte.
_INT64 = (-2 ** 63, 2 ** 63)


def _kinds(segments: list[list[Any] | Const]) -> set[type]:
    kinds: set[type] = set()
    for seg in segments:
        kinds |= {type(seg.value)} if isinstance(seg, Const) else set(map(type, seg))
    return kinds


def _ints(segments: list[list[Any] | Const]) -> list[int]:
    return [v for seg in segments for v in ((seg.value,) if isinstance(seg, Const) else seg)
            if type(v) is int]


def _as_floats(values: list[Any]) -> list[Any]:
    return [v if type(v) is not int else float(v) for v in values]


def _column_render(segments: list[list[Any] | Const]):
    """How one column's cells are written (a function of a list of its values), decided from
    all its values as pandas infers the column's dtype: ints in a column with floats or gaps
    are floats (float64); ints, bools, floats and gaps are written by the csv module's rules
    (None empty, a float by repr, as pandas does); lists and dicts are JSON; text is made safe
    for spreadsheets. Each value's cell depends only on it and the decision, so the function
    serves each file's part of the column (and a constant once)."""
    kinds = _kinds(segments)
    none = type(None) in kinds
    kinds.discard(type(None))
    if kinds and kinds <= {int, float} and (float in kinds or none):
        ints = _ints(segments) if int in kinds else ()
        if not ints or _INT64[0] <= min(ints) and max(ints) < _INT64[1]:
            return (lambda vs: fields(_as_floats(vs))) if ints else fields
    if not kinds & {str, list, tuple, dict}:
        return fields
    return lambda vs: fields(_column_text(vs))


def csv_of_files(paths: str | Path | Iterable[str | Path]) -> str:
    """to_csv(load_results(paths)), byte for byte, without building the DataFrame."""
    return "".join(csv_pieces(paths))


def csv_pieces(paths: str | Path | Iterable[str | Path]) -> Iterator[str]:
    """csv_of_files(paths) as consecutive pieces of text, for writing as they come: the
    whole text of 100,000 records (122 MB, and its encoding as much again) is never held at
    once. Every file is read and every cell written before this returns: an error is raised
    before any text is output."""
    with paused_gc():
        cells = _cells_of_files(paths)
    return iter([cells]) if isinstance(cells, str) else _row_pieces(*cells)


_ROWS_PER_PIECE = 1024       # ~1 MB of text a piece: reused memory, not a fresh mapping


def _cells_of_files(paths: str | Path | Iterable[str | Path]
                    ) -> str | tuple[list[str], list[list[list[str] | str]], list[FileColumns]]:
    """The whole text (no or one column), or the column names and each table's cells."""
    tables = [t for t in map(file_columns, as_paths(paths)) if t.n]
    if not tables:
        return to_csv(load_results([]))
    columns = ordered_columns(dict.fromkeys(
        c for t in tables for c in (*t.head, *t.names, *t.env)))
    parts: list[list[list[str] | str]] = [[] for _ in tables]    # each table's cells
    for c in columns:
        segments = [t.columns.get(c, _GAP) for t in tables]
        render = _column_render(segments)
        for part, seg, t in zip(parts, segments, tables):
            part.append(render([seg.value])[0] if isinstance(seg, Const) else render(seg))
            t.columns.pop(c, None)      # its values: only their text is kept
    if len(columns) < 2:        # the csv module quotes a row of one empty field: let it
        cells = [v for part, t in zip(parts, tables)
                 for v in ([part[0]] * t.n if isinstance(part[0], str) else part[0])]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([columns, *zip(cells)])
        return buf.getvalue()
    return columns, parts, tables


def _row_pieces(columns: list[str], parts: list[list[list[str] | str]],
                tables: list[FileColumns]) -> Iterator[str]:
    yield ",".join(map(quote, columns)) + "\n"
    for part, t in zip(parts, tables):
        rows = zip(*_merged(part, t.n))
        while block := list(map(",".join, islice(rows, _ROWS_PER_PIECE))):
            block.append("")
            yield "\n".join(block)


_GAP = Const(None)       # a column a file lacks: empty cells (NaN in the DataFrame)


def _merged(part: list[list[str] | str], n: int) -> list[Any]:
    """A table's columns for zip: runs of constant cells joined once, repeated n times."""
    out: list[Any] = []
    for cells in part:
        if isinstance(cells, str) and out and isinstance(out[-1], str):
            out[-1] += "," + cells
        else:
            out.append(cells)
    return [repeat(x, n) if isinstance(x, str) else x for x in out]


EXPORTERS = {"csv": to_csv, "markdown": to_markdown}
# what `fusebench export` runs: files -> its text, in pieces
FILE_EXPORTERS = {"csv": csv_pieces,
                  "markdown": lambda paths: iter([to_markdown(load_results(paths))])}
