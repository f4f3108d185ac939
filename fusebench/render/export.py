"""A results DataFrame (results/frame.py) as text for other tools: `fusebench export`."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pandas as pd

from fusebench.render.compare_table import markdown_table
from fusebench.render.escape import cell as safe_cell
from fusebench.results.frame import SUMMARY_COLUMNS


# ensure_ascii (the default) writes every control character as \uXXXX, and the text starts
# with [ or {, never a formula: JSON of a list or dict is already a safe cell
_JSON = json.JSONEncoder(default=str)


def _cell_text(v: Any) -> Any:
    """Lists/dicts as JSON so CSV cells stay one value each; text made safe for spreadsheets."""
    if v is None or type(v) in (int, float, bool):      # the common case, first
        return v
    if isinstance(v, (list, tuple, dict)):
        return _JSON.encode(v)
    return safe_cell(v)


def _column_text(values) -> list[Any]:
    """_cell_text of every value; each distinct string is made safe once (env columns repeat
    one value 100,000 times, names and modes a few)."""
    done: dict[str, Any] = {}
    out = []
    for v in values:
        if type(v) is str:
            t = done.get(v)
            if t is None:
                t = done[v] = safe_cell(v)
            out.append(t)
        else:
            out.append(_cell_text(v))
    return out


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


EXPORTERS = {"csv": to_csv, "markdown": to_markdown}
