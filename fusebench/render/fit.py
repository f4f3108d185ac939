"""A table that fits the console width by dropping columns, never by cutting a number.

rich shrinks every column with an ellipsis when a table is wider than the console, so
`3359.42` ms reads `335…`. FitTable is built at print time for the actual width: columns the
reader can do without (higher `drop`) go first until the table's minimum width fits, and the
caption names what was left out. `wide=True` keeps every column (print it on a console at
least width_needed() wide)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class Column:
    header: str
    justify: str = "left"
    drop: int = 0          # 0: always shown; otherwise the highest is dropped first
    wrap: bool = False     # may wrap at spaces (never inside a word: the word sets its minimum)
    fold: bool = False     # a name: when nothing is left to drop, it may break mid-word


@dataclass
class FitTable:
    columns: Sequence[Column]
    rows: list[tuple[list[Any], dict[str, Any]]] = field(default_factory=list)
    title: str | None = None
    caption: str | None = None
    wide: bool = False

    def add_row(self, *cells: Any, **kw: Any) -> None:
        self.rows.append((list(cells), kw))

    def add_section(self) -> None:
        if self.rows:
            self.rows[-1][1]["end_section"] = True

    def build(self, keep: Sequence[int], hidden: Sequence[str] = (),
              avail: int | None = None) -> Table:
        caption = self.caption
        if hidden:
            note = f"not shown at this width: {', '.join(hidden)} (--wide shows them)"
            caption = f"{caption}\n{note}" if caption else note
        t = Table(title=self.title, caption=caption, title_justify="left",
                  caption_justify="left")
        widths = self._widths(keep, avail)
        for i, w in zip(keep, widths):
            c = self.columns[i]
            t.add_column(c.header, justify=c.justify, no_wrap=not (c.wrap or c.fold), width=w,
                         overflow="fold" if c.fold else "ellipsis")
        for cells, kw in self.rows:
            t.add_row(*[cells[i] for i in keep], **kw)
        return t

    def _widths(self, keep: Sequence[int], avail: int | None) -> list[int | None]:
        """Content widths when the natural table is wider than avail: every column its
        minimum, the space left shared by the wrapping columns in proportion to what they
        would like. rich's own squeeze ignores no_wrap and longest words, and cuts."""
        lo = [self._col_min(i) for i in keep]
        hi = [self._col_max(i) for i in keep]
        frame = 3 * len(keep) + 1                 # borders and padding
        if avail is None or sum(hi) + frame <= avail:
            return [None] * len(keep)
        _fold(lo, [self.columns[i].fold for i in keep], sum(lo) + frame - avail)
        spare = max(avail - frame - sum(lo), 0)
        want = [h - m for h, m in zip(hi, lo)]
        total = sum(want) or 1
        out = [m + (w * spare) // total for m, w in zip(lo, want)]
        return out

    def fit(self, console: Console, options: ConsoleOptions) -> Table:
        """The table with as many columns as fit options.max_width without cutting a cell."""
        keep = list(range(len(self.columns)))
        if self.wide:
            return self.build(keep)
        order = sorted((i for i, c in enumerate(self.columns) if c.drop),
                       key=lambda i: (-self.columns[i].drop, -i))
        hidden: list[str] = []
        while self.min_width(keep) > options.max_width and order:
            i = order.pop(0)
            keep.remove(i)
            hidden.append(self.columns[i].header.replace("\n", " "))
        return self.build(keep, hidden, options.max_width)

    def min_width(self, keep: Sequence[int]) -> int:
        """Narrowest the kept columns can be without cutting a cell: rich's own measure
        ignores no_wrap, so a no_wrap cell counts whole, a wrapping one by its longest word."""
        return len(keep) + 1 + sum(2 + self._col_min(i) for i in keep)  # borders, padding

    def _texts(self, i: int) -> list[Any]:
        return [self.columns[i].header, *(cells[i] for cells, _ in self.rows)]

    def _col_min(self, i: int) -> int:
        return max(_cell_min(x, self.columns[i].wrap) for x in self._texts(i))

    def _col_max(self, i: int) -> int:
        return max(_cell_min(x, False) for x in self._texts(i))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        t = self.fit(console, options)
        need = self.width_needed(console) if self.wide else 0
        if need > options.max_width:   # --wide: as wide as it needs (print with crop=False)
            t.width = need
        yield t

    def width_needed(self, console: Console) -> int:
        """Columns the whole table needs unwrapped (for a --wide console)."""
        t = self.build(range(len(self.columns)))
        return Measurement.get(console, console.options.update(max_width=10_000), t).maximum

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.fit(console, options))


FOLD_MIN = 8   # a folded name keeps at least this many characters a line


def _fold(lo: list[int], foldable: list[bool], excess: int) -> None:
    """Narrow the widest foldable columns (names) by `excess` in all, in place."""
    while excess > 0:
        cands = [j for j, f in enumerate(foldable) if f and lo[j] > FOLD_MIN]
        if not cands:
            return
        j = max(cands, key=lambda j: lo[j])
        lo[j] -= 1
        excess -= 1


def _cell_min(cell: Any, wrap: bool) -> int:
    text = cell if isinstance(cell, Text) else Text.from_markup(str(cell))
    lines = text.plain.splitlines() or [""]
    pieces = [w for line in lines for w in line.split()] if wrap else lines
    return max((cell_len(p) for p in pieces), default=0)
