"""Text from results files, made safe for where it is shown. One helper per destination.

A results file is input like any other: a model name may hold rich markup (`[/bad]` breaks a
table), matplotlib mathtext (`$\\foo{$` breaks a plot), a spreadsheet formula (`=HYPERLINK(...)`
runs when the CSV is opened) or terminal escapes (ANSI `\\x1b[2J` clears the screen). Every
renderer passes record text through the helper for its destination:

  printable(s)   control characters shown as \\xNN (the base of every other helper)
  rich_text(s)   a rich Text: never parsed as markup
  markup(s)      for a rich markup string: printable + rich's escape
  PLOT_TEXT_RC   matplotlib settings under which labels are plain text (no mathtext)
  cell(v)        for CSV / markdown cells: printable + a leading `'` on formula-like text
  cells(values)  cell() of a whole column
"""
from __future__ import annotations

import functools
import re
from typing import Any

from rich.markup import escape as _rich_escape
from rich.text import Text

# C0 and C1 controls and DEL; tab and newline are layout and stay
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# what spreadsheets read as a formula at the start of a cell (OWASP's list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def printable(s: Any) -> str:
    """str(s) with control characters (ESC, BEL, NUL, ...) shown as \\xNN."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(s))


def rich_text(s: Any, style: str = "") -> Text:
    """A rich Text cell: its content is never read as markup."""
    return Text(printable(s), style=style)


def markup(s: Any) -> str:
    """Text to embed in a rich markup string."""
    return _rich_escape(printable(s))


# figures are drawn under these rc settings: a `$` in a label is a dollar sign, never mathtext
PLOT_TEXT_RC = {"text.parse_math": False}


@functools.lru_cache(maxsize=4096)
def _text_cell(v: str) -> str:
    v = printable(v)
    if v.startswith(FORMULA_START) and not _is_number(v):
        return "'" + v
    return v


def cell(v: Any) -> Any:
    """A CSV / markdown cell: text made printable, and a formula-like start quoted with `'`
    so a spreadsheet shows it instead of running it. Numbers and None pass unchanged."""
    if not isinstance(v, str):
        return v
    if len(v) > 200:            # long, unique texts (JSON of samples): not worth caching
        return _text_cell.__wrapped__(v)
    return _text_cell(v)        # names, modes, env values repeat on every row


def cells(values: list[Any]) -> list[Any]:
    """cell() of each value of a column of hashable values, each distinct text made safe once
    (a column of 100,000 rows holds a few names, modes, verdicts)."""
    safe = {v: cell(v) for v in set(values) if isinstance(v, str)}
    return list(map(safe.get, values, values))     # a non-text value is its own default


def _is_number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False
