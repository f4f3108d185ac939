"""Cells of a CSV file as the csv module writes them (QUOTE_MINIMAL, lineterminator "\\n", as
pandas' to_csv and csv.DictWriter use it), a whole column at a time: the export of 100,000
records (render/export.py) and compare --format csv (render/compare_table.py).

Per column, not per cell: each distinct text is quoted once, a column of distinct texts that
all need quotes is quoted in one pass, and a column of numbers is written by pydantic-core's
float formatter (Rust, installed with typer) and brought to Python's repr (the digits are the
same shortest round trip; only where repr switches to an exponent and how it writes one
differ), byte for byte what str() gives (tests/test_csvtext.py).
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json


def _quoted_chars() -> frozenset[str]:
    """The characters that make csv.writer (QUOTE_MINIMAL, lineterminator "\\n", as pandas
    uses it) quote a field, asked of this Python's csv module (3.13 added "\\r"). Python 3.10's
    refuses a NUL in any field ("need to escape"); we write it as 3.11+ does, as it is."""
    def quoted(c: str) -> bool:
        buf = io.StringIO()
        try:
            csv.writer(buf, lineterminator="\n").writerow([f"a{c}b", "x"])
        except csv.Error:
            return False
        return buf.getvalue().startswith('"')
    return frozenset(c for c in map(chr, range(128)) if quoted(c))


_QUOTED = _quoted_chars()
_NEEDS_QUOTES = re.compile("[" + re.escape("".join(sorted(_QUOTED))) + "]")


def quote(s: str) -> str:
    """One text field as csv.writer writes it: in quotes (inner quotes doubled) when needed."""
    if _NEEDS_QUOTES.search(s):
        return '"' + s.replace('"', '""') + '"'
    return s


def fields(values: Sequence[Any], kinds: set[type] | None = None) -> list[str]:
    """Each cell of a column as csv.writer writes it: None empty, a number or bool by str (a
    float's str is its repr), text quoted when needed; each distinct text quoted once.
    `kinds`: the values' types (or more), where the caller knows them: no scan of them here
    (a superset only takes a slower path to the same text)."""
    kinds = set(map(type, values)) if kinds is None else kinds
    if str not in kinds:
        fast = number_fields(values, kinds)
        if fast is not None:
            return fast
        return (["" if v is None else str(v) for v in values] if type(None) in kinds
                else list(map(str, values)))
    if kinds == {str} and values and type(values[0]) is str and _quoted_all(values):
        return _quote_every(values)     # JSON cells: distinct texts, all quoted
    texts: dict[Any, str] = {v: quote(v) for v in set(values) if type(v) is str}
    texts[None] = ""
    out = list(map(texts.get, values, values))
    if kinds - {str, type(None)}:
        out = [x if type(x) is str else str(x) for x in out]
    return out


def _quoted_all(texts: Sequence[str]) -> bool:
    return len(texts) > 1000 and all(map(_NEEDS_QUOTES.search, texts))


def _quote_every(texts: Sequence[str]) -> list[str]:
    """quote() of each text, when each one needs quotes: in one pass over the joined column
    (a separator that none of them holds), not one call per text."""
    sep = "\x00"
    joined = sep.join(texts)
    if joined.count(sep) != len(texts) - 1:
        return list(map(quote, texts))
    if '"' in joined:
        joined = joined.replace('"', '""')
    return ('"' + joined.replace(sep, f'"{sep}"') + '"').split(sep)


# pydantic-core writes 1e-6 where repr writes 1e-06, and 0.00001234 (1e-5 <= |x| < 1e-4)
# where repr writes 1.234e-05: the two fixes that make its text repr's
_SHORT_EXPONENT = re.compile(r"e-(\d)(?!\d)")
# A pattern that starts with its literal is searched for by a fast scan; a lookbehind first
# (a whole number, not the end of 10.00001) made it try every position: ~40 ms a column of
# 100,000 floats. The sign, where there is one, stays in the text: repr(-x) is "-" + repr(x).
_POSITIONAL_SMALL = re.compile(r"0\.0000\d+")


def _repr_small(m: re.Match) -> str:
    at = m.start()
    if at and m.string[at - 1] in "0123456789.":      # inside a number (10.00001): as it is
        return m.group()
    return repr(float(m.group()))


def number_fields(values: Sequence[Any], kinds: set[type] | None = None) -> list[str] | None:
    """_fields of a column of floats and ints (None: empty), or None when it is not one.
    `kinds` as for fields."""
    kinds = set(map(type, values)) if kinds is None else kinds
    if not kinds or not kinds <= {float, int, type(None)} or len(values) < 100:
        return None
    first = values[0]
    if len(kinds) == 1 and values.count(first) == len(values) and first != 0:
        # one value (a sweep's params, its memory): written once. Not 0: -0.0 == 0.0
        return ["" if first is None else str(first)] * len(values)
    # few values (a constant, batch sizes)? The first 400 tell, without hashing every value
    distinct = set(values) if len(set(values[:400])) < 100 else None
    if distinct is not None and len(distinct) * 4 < len(values) and \
            not {float, int} <= kinds and 0.0 not in distinct:
        # each written once. Not where 0.0 and -0.0 (or 1 and 1.0) would share an entry
        texts = {v: "" if v is None else str(v) for v in distinct}
        return list(map(texts.__getitem__, values))
    try:
        text = to_json(list(values), inf_nan_mode="constants").decode()[1:-1]
    except (TypeError, ValueError):
        return None
    if float in kinds and ("N" in text or "I" in text):
        return None     # NaN or an infinity: str() writes nan / inf
    if float in kinds and "e-" in text:
        text = _SHORT_EXPONENT.sub(r"e-0\1", text)
    if float in kinds and "0.0000" in text:
        text = _POSITIONAL_SMALL.sub(_repr_small, text)
    cells = text.split(",")
    if len(cells) != len(values):
        return None
    return list(map(_NULL.get, cells, cells)) if type(None) in kinds else cells


_NULL = {"null": ""}
