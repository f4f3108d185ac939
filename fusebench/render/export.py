"""A results DataFrame (results/frame.py) as text for other tools: `fusebench export`."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice, repeat
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from pydantic_core import to_json

from fusebench.render.csvtext import fields, quote
from fusebench.render.escape import cell as safe_cell, cells as safe_cells
from fusebench.results.bulk import paused_gc, settled
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


def _to_json_texts(values: Sequence[Any]) -> list[str] | None:
    """_json of each value, from one call of pydantic-core over the whole column (the values
    with a separator string between them, written as one JSON list and split at the
    separators); None where that is not exact: text not pure ASCII without DEL (then _json
    takes the json module), or a value holding the separator's text (more pieces)."""
    mixed: list[Any] = [_SEP] * (2 * len(values) - 1)
    mixed[::2] = values
    try:
        b = _to_json(mixed)
    except (TypeError, ValueError):
        return None
    if not b.isascii() or b"\x7f" in b:
        return None
    parts = b.decode()[1:-1].split(_SEP_JSON)
    return parts if len(parts) == len(values) else None


def _json_all(values: Sequence[Any]) -> list[str]:
    """_json of each value of a column of lists and dicts, in one call of the encoder where
    that is exact (_to_json_texts), else one call per value."""
    if len(values) == 0:
        return []
    texts = _to_json_texts(values)
    return texts if texts is not None else list(map(_json, values))


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
            kinds = {float, type(None)} if none else {float}
            return (lambda vs: fields(_as_floats(vs), kinds)) if ints else \
                (lambda vs: fields(vs, kinds))
    if not kinds & {str, list, tuple, dict}:
        kinds |= {type(None)} if none else set()
        return lambda vs: fields(vs, kinds)     # each file's part: these types or fewer
    return _text_cells


Cells = Union[list[str], Iterator[str]]      # a column's cells in row order

_BLOCK = 2048      # values of a text column written at a time, as the rows are joined


def _text_cells(values: Sequence[Any]) -> list[str] | Iterator[str]:
    """fields(_column_text(values)): a column of text, lists or dicts as CSV cells; a long
    column a block at a time, as the rows are written. Why: the cells of 100,000 samples
    lists and specs are ~110 MB (page faults), a block's ~2 MB is reused memory. Exact: a
    cell's text depends only on its value (and the column's decision, made before)."""
    if len(values) <= _BLOCK:
        return _block_cells(values)
    blocks = (values[i:i + _BLOCK] for i in range(0, len(values), _BLOCK))
    return chain.from_iterable(map(_block_cells, blocks))   # no Python frame per cell


def _block_cells(values: Sequence[Any]) -> list[str]:
    first = values[0] if values else None
    if type(first) is list and values.count(first) == len(values) and \
            all(type(x) is str for x in first):
        # one list of texts throughout (correctness.checked_at): its cell written once. A
        # value equal to it is a list of the same texts (a str equals only a str)
        return fields(_column_text([first])) * len(values)
    fast = _number_list_cells(values)
    if fast is None:
        fast = _dict_cells(values)
    return fast if fast is not None else fields(_column_text(values))


# --- JSON cells without splitting and quoting passes ---------------------------------------------
# Two columns of a big export are most of its text: the step samples (lists of 40 numbers) and
# the spec (a dict of ~20 leaves, of which a sweep varies a few). Each fast path below writes
# exactly what fields(_column_text(values)) writes, or returns None (then that path is taken).

def _number_list_cells(values: Sequence[Any]) -> list[str] | None:
    """Cells of a column of lists of two or more numbers: their JSON from one pydantic-core
    call, split between lists and put in quotes (a comma in each). Numbers only: no string
    (no quote in the text) and no nested list or dict (one [ per list)."""
    if len(values) < 2 or not set(map(type, values)) <= {list, tuple} or \
            min(map(len, values)) < 2:      # 0 or 1 numbers: no comma, not quoted
        return None
    try:
        b = _to_json(values)
    except (TypeError, ValueError):
        return None
    if b.count(b"[") != len(values) + 1 or b'"' in b or b"{" in b or not b.isascii() \
            or b"\x7f" in b:
        return None
    parts = b.split(b"],[")      # bytes: the column's text is never copied whole
    del b
    parts[0], parts[-1] = parts[0][2:], parts[-1][:-2]
    return ['"[' + p.decode() + ']"' for p in parts]


_SCALARS = (str, int, bool, type(None))


def _constant(column: Sequence[Any]) -> bool:
    """Every value writes the same JSON: one type, one value (a float by its bits: -0.0 is
    not 0.0; 1, 1.0 and True are different types), or every list or dict empty."""
    first = column[0]
    if type(first) in (str, type(None)):    # equal only to their own type: no type scan
        return column.count(first) == len(column)
    kinds = set(map(type, column))
    if len(kinds) != 1:
        return False
    kind = kinds.pop()
    if kind is float:       # equal and not zero: the same bits (NaN is not equal to itself)
        return len(set(column)) == 1 and \
            (column[0] != 0 or len(set(map(float.hex, column))) == 1)
    if kind in _SCALARS:
        return len(set(column)) == 1
    return kind in (list, tuple, dict) and not any(column)


def _leaves(nodes: Sequence[Any], path: tuple, out: dict[tuple, Sequence[Any]]) -> bool:
    """The leaves under dicts `nodes` (one per record) by key path into `out`, when every
    record's dict there has the same keys in the same order (False when not: no template).
    A non-empty dict is descended; anything else is a leaf."""
    if set(map(type, nodes)) != {dict} or len(set(map(tuple, nodes))) != 1:
        return False
    keys = tuple(nodes[0])
    columns = zip(*map(itemgetter(*keys), nodes)) if len(keys) > 1 else \
        [list(map(itemgetter(*keys), nodes))] if keys else []
    for key, column in zip(keys, columns):
        if type(column[0]) is dict and column[0]:
            if not _leaves(column, path + (key,), out):
                return False
        else:
            out[path + (key,)] = column
    return True


_SLOT = "\x00%d\x00"     # a varying leaf in the template (its JSON text must occur once)


def _dict_cells(values: Sequence[Any]) -> list[str] | None:
    """Cells of a column of dicts of one layout: one template (the first dict's JSON, its
    varying leaves as slots) filled with those leaves' JSON. Exact when every piece is what
    pydantic-core writes for the whole dict: keys in one order, and the template and every
    leaf's text pure ASCII without DEL (else _json takes the json module: None here)."""
    if len(values) < 2:
        return None
    leaves: dict[tuple, Sequence[Any]] = {}
    if not _leaves(values, (), leaves):
        return None
    varying = [p for p, column in leaves.items() if not _constant(column)]
    skeleton = _skeleton(values[0], {p: _SLOT % i for i, p in enumerate(varying)})
    try:
        template = _to_json(skeleton)
    except (TypeError, ValueError):
        return None
    if not template.isascii() or b"\x7f" in template or b'"' not in template:
        return None         # without a quote ({}) the csv module would not quote the cell
    pieces = _split_at_slots(template.decode(), len(varying))
    texts = [_to_json_texts(leaves[p]) for p in varying]
    if pieces is None or any(t is None for t in texts):
        return None
    quoted = [t if '"' not in "".join(t) else [x.replace('"', '""') for x in t]
              for t in texts]     # type: ignore[union-attr]
    # each cell: '"' + its JSON with quotes doubled + '"' (it always holds a key's quotes)
    pieces = [p.replace('"', '""') for p in pieces]
    pieces[0], pieces[-1] = '"' + pieces[0], pieces[-1] + '"'
    if not varying:
        return [pieces[0]] * len(values)
    rows = [repeat(pieces[0])]
    for column, piece in zip(quoted, pieces[1:]):
        rows += (column, repeat(piece))
    return list(map("".join, zip(*rows)))


def _skeleton(d: dict[str, Any], slots: dict[tuple, str], path: tuple = ()) -> dict[str, Any]:
    """d with the leaf at each path of `slots` replaced by its slot text."""
    out = {}
    for k, v in d.items():
        p = path + (k,)
        out[k] = slots[p] if p in slots else \
            _skeleton(v, slots, p) if type(v) is dict and v else v
    return out


def _split_at_slots(template: str, n: int) -> list[str] | None:
    """The template's text around its n slots' JSON (in order), or None when a slot's text
    is not there exactly once (a constant that holds it: no template)."""
    pieces = []
    for i in range(n):
        slot = '"' + (_SLOT % i).replace("\x00", "\\u0000") + '"'
        if template.count(slot) != 1:
            return None
        before, template = template.split(slot)
        pieces.append(before)
    pieces.append(template)
    return pieces


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
        if not isinstance(cells, str):
            # what was loaded stays alive until the rows are written: the first collection
            # after the pause would walk all of it (100,000 records: ~0.3 s) for nothing
            settled(sum(t.n for t in cells[2]))
    return iter([cells]) if isinstance(cells, str) else _row_pieces(*cells)


_ROWS_PER_PIECE = 1024       # ~1 MB of text a piece: reused memory, not a fresh mapping


def _cells_of_files(paths: str | Path | Iterable[str | Path]
                    ) -> str | tuple[list[str], list[list[Cells | str]], list[FileColumns]]:
    """The whole text (no or one column), or the column names and each table's cells."""
    tables = [t for t in map(file_columns, as_paths(paths)) if t.n]
    if not tables:
        return to_csv(load_results([]))
    columns = ordered_columns(dict.fromkeys(
        c for t in tables for c in (*t.head, *t.names, *t.env)))
    parts: list[list[Cells | str]] = [[] for _ in tables]    # each table's cells
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


def _row_pieces(columns: list[str], parts: list[list[Cells | str]],
                tables: list[FileColumns]) -> Iterator[str]:
    yield ",".join(map(quote, columns)) + "\n"
    with paused_gc():       # text columns written as the rows go (_text_cells): no GC walks
        for part, t in zip(parts, tables):
            rows = zip(*_merged(part, t.n))
            while block := list(map(",".join, islice(rows, _ROWS_PER_PIECE))):
                block.append("")
                yield "\n".join(block)


_GAP = Const(None)       # a column a file lacks: empty cells (NaN in the DataFrame)


def _merged(part: list[Cells | str], n: int) -> list[Any]:
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
