"""A results DataFrame (results/frame.py) as text for other tools: `fusebench export`."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from fusebench.render.compare_table import markdown_table
from fusebench.render.escape import cell as safe_cell, cells as safe_cells
from fusebench.results.bulk import paused_gc
from fusebench.results.frame import SUMMARY_COLUMNS, as_paths, file_rows, load_results, \
    ordered_columns


# ensure_ascii (the default) writes every control character as \uXXXX, and the text starts
# with [ or {, never a formula: JSON of a list or dict is already a safe cell
_JSON = json.JSONEncoder(default=str)
# JSONEncoder.encode builds its C encoder anew on every call (~as long as encoding a short
# list): one C encoder with the same settings serves every cell (no circular check: the values
# come from parsed JSON)
_C_ENCODER = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, str, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True)


def _json(v: Any) -> str:
    return "".join(_C_ENCODER(v, 0)) if _C_ENCODER else _JSON.encode(v)


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
    if not kinds <= {str, int, float, bool, type(None)}:
        return [_cell_text(v) for v in values]
    return safe_cells(values)


def to_csv(df: pd.DataFrame) -> str:
    # only non-numeric columns hold text, lists or dicts: numeric columns pass untouched
    out = df.copy(deep=False)
    for col in [c for c in out.columns if not pd.api.types.is_numeric_dtype(out[c])]:
        values = out[col].to_numpy(dtype=object)     # iterating a Series is slow
        out[col] = pd.Series(_column_text(values), index=out.index, dtype=object)
    return out.to_csv(index=False)


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(_cell_text(v))


def to_markdown(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A markdown table of the summary columns (or `columns`); no tabulate dependency."""
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


def _column_strings(values: list[Any]) -> list[Any]:
    """One column's cells as to_csv writes them (the csv module writes None as an empty cell
    and a float by repr, as pandas does): ints in a column with floats or gaps are floats
    (pandas makes it float64); lists and dicts are JSON; text is made safe for spreadsheets."""
    kinds = set(map(type, values))
    none = type(None) in kinds
    kinds.discard(type(None))
    if kinds and kinds <= {int, float} and (float in kinds or none):
        if int not in kinds or _INT64[0] <= min(v for v in values if type(v) is int) and \
                max(v for v in values if type(v) is int) < _INT64[1]:
            return ([v if type(v) is not int else float(v) for v in values]  # float64
                    if int in kinds else values)
    if not kinds & {str, list, tuple, dict}:
        return values           # ints, bools, floats, gaps: the csv module writes them as pandas
    return _column_text(values)


def csv_of_files(paths: str | Path | Iterable[str | Path]) -> str:
    """to_csv(load_results(paths)), byte for byte, without building the DataFrame."""
    with paused_gc():
        return _csv_of_files(paths)


def _csv_of_files(paths: str | Path | Iterable[str | Path]) -> str:
    tables = [t for t in map(file_rows, as_paths(paths)) if t.rows]
    if not tables:
        return to_csv(load_results([]))
    columns = ordered_columns(dict.fromkeys(
        c for t in tables for c in (*t.head, *t.columns, *t.env)))
    cols = []
    for c in columns:
        values: list[Any] = []
        for t in tables:
            const = t.head if c in t.head else t.env if c in t.env else None
            values += ([const[c]] * len(t.rows) if const is not None
                       else [r.get(c) for r in t.rows])
        cols.append(values)
    del tables      # the row dicts: the columns hold their values
    for i, values in enumerate(cols):
        cols[i] = _fields(_column_strings(values))
    if len(columns) < 2:        # the csv module quotes a row of one empty field: let it
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([columns, *zip(*cols)])
        return buf.getvalue()
    return ",".join(map(_quote, columns)) + "\n" + "".join(
        f"{line}\n" for line in map(",".join, zip(*cols)))


def _quoted_chars() -> frozenset[str]:
    """The characters that make csv.writer (QUOTE_MINIMAL, lineterminator "\\n", as pandas
    uses it) quote a field, asked of this Python's csv module (3.13 added "\\r")."""
    def quoted(c: str) -> bool:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([f"a{c}b", "x"])
        return buf.getvalue().startswith('"')
    return frozenset(c for c in map(chr, range(128)) if quoted(c))


_QUOTED = _quoted_chars()


def _quote(s: str) -> str:
    """One text field as csv.writer writes it: in quotes (inner quotes doubled) when needed."""
    if any(c in s for c in _QUOTED):
        return '"' + s.replace('"', '""') + '"'
    return s


def _fields(values: list[Any]) -> list[str]:
    """Each cell of a column as csv.writer writes it: None empty, a number or bool by str (a
    float's str is its repr), text quoted when needed; each distinct text quoted once."""
    kinds = set(map(type, values))
    if str not in kinds:
        return (["" if v is None else str(v) for v in values] if type(None) in kinds
                else list(map(str, values)))
    texts: dict[Any, str] = {v: _quote(v) for v in set(values) if type(v) is str}
    texts[None] = ""
    out = list(map(texts.get, values, values))
    if kinds - {str, type(None)}:
        out = [x if type(x) is str else str(x) for x in out]
    return out


EXPORTERS = {"csv": to_csv, "markdown": to_markdown}
# what `fusebench export` runs: files -> text
FILE_EXPORTERS = {"csv": csv_of_files,
                  "markdown": lambda paths: to_markdown(load_results(paths))}
