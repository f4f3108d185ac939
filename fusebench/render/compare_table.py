"""Renderers for a Comparison: rich table, markdown, csv, json. One function per format."""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from fusebench.render.csvtext import fields, quote
from fusebench.render.escape import cell as csv_cell, cells as csv_cells, markup as escape
from rich.text import Text

from fusebench.render.fit import Column, FitTable
from fusebench.render.names import display_name
from fusebench.results.compare import Comparison, Row


def _headers(cmp: Comparison) -> list[str]:
    m = cmp.metric
    cols = ["model", "config", "mode"]
    if cmp.axis == "runs":
        cols.append("run")
    cols.append(f"{m.label} ({m.unit})")
    if m.name == "step_ms":
        cols.append("IQR (ms)")
    cols.append(f"vs {cmp.baseline}")
    return cols


def _cells(cmp: Comparison, r: Row) -> list[str]:
    m = cmp.metric
    value = m.show(r.value) if r.status == "ok" else r.status
    out = [r.model, r.config, r.variant]
    if cmp.axis == "runs":
        out.append(r.run)
    out.append(value)
    if m.name == "step_ms":
        out.append("—" if r.iqr is None else f"{r.iqr:.3f}")
    out.append(r.verdict + (" REGRESSION" if r.regression else ""))
    return out


def _geo_cells(cmp: Comparison, g) -> list[str]:
    cells = f"({g.cells} cell{'s' if g.cells != 1 else ''})"
    out = [f"geometric mean\n{cells}", "", "" if cmp.axis == "runs" else g.label]
    if cmp.axis == "runs":
        out.append(g.label)
    out.append("")
    if cmp.metric.name == "step_ms":
        out.append("")
    out.append(g.verdict)
    return out


def _best_worst(cmp: Comparison) -> dict[int, str]:
    """Row index -> 'best' | 'worst' within each group of comparable rows."""
    marks: dict[int, str] = {}
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(cmp.rows):
        if r.value is not None:
            groups.setdefault(r.group, []).append(i)
    sign = 1 if cmp.metric.higher_is_better else -1
    for idxs in groups.values():
        if len(idxs) < 2:
            continue
        vals = [sign * cmp.rows[i].value for i in idxs]
        if max(vals) == min(vals):
            continue
        marks[idxs[vals.index(max(vals))]] = "best"
        marks[idxs[vals.index(min(vals))]] = "worst"
    return marks


def _verdict_style(r: Row) -> str:
    if r.regression:
        return "bold red"
    if r.ratio is None or r.baseline:
        return "dim" if r.baseline else "yellow"
    if not r.ratio.significant or r.noise:
        return "dim"
    return "green" if r.ratio.gain > 1 else "red"


def short_labels(labels: Sequence[str]) -> dict[str, str]:
    """Each run label -> the part that tells it from the others: the common prefix and
    suffix cut at a separator ('conv_a.json', 'conv_b.json' -> 'a', 'b')."""
    labels = list(dict.fromkeys(labels))
    if len(labels) < 2:
        return {x: x for x in labels}
    pre = len(os.path.commonprefix(labels))
    suf = len(os.path.commonprefix([x[::-1] for x in labels]))
    while pre and labels[0][pre - 1] not in _SEPARATORS:
        pre -= 1
    while suf and labels[0][-suf] not in _SEPARATORS:
        suf -= 1
    short = {x: x[pre:len(x) - suf] for x in labels}
    if any(not v for v in short.values()) or len(set(short.values())) < len(labels):
        return {x: x for x in labels}
    return short


_SEPARATORS = "._-/ "


def _caption(cmp: Comparison, runs: dict[str, str]) -> str | None:
    lines = [escape(cmp.env_summary)] if cmp.env_summary else []
    lines += [escape(f"run {v} = {k}") for k, v in runs.items() if k != v]
    noisy = dict.fromkeys(f"? {r.variant}" + (f" in {runs.get(r.run, r.run)}" if r.run else "")
                          + f": {r.noise}" for r in cmp.rows if r.noise)
    if noisy:
        lines += [escape(n) for n in noisy]
        lines.append("[dim]?: a side of this ratio is noisy; its CI may be too narrow, rerun[/]")
    return "\n".join(lines) or None


def _title(cmp: Comparison) -> tuple[str, set[str]]:
    """The title, plus the columns it makes redundant (one model, one config)."""
    title = f"{cmp.metric.label}: {cmp.axis} vs {cmp.baseline}"
    same: set[str] = set()
    for col, values in (("model", {r.model for r in cmp.rows}),
                        ("config", {r.config for r in cmp.rows})):
        if len(values) == 1 and len(cmp.rows) > 1:
            title += f" · {display_name(values.pop()) if col == 'model' else values.pop()}"
            same.add(col)
    return title, same


def _columns(cmp: Comparison, runs: dict[str, str]) -> list[Column]:
    heads = _headers(cmp)
    value = f"{cmp.metric.label} ({cmp.metric.unit})"
    cols = []
    for h in heads:
        if h == value:
            cols.append(Column(f"{cmp.metric.label}\n({cmp.metric.unit})", "right"))
        elif h == "IQR (ms)":
            cols.append(Column("IQR\n(ms)", "right", drop=1))
        elif h == heads[-1]:
            # the verdict may wrap between words (its numbers stay whole)
            cols.append(Column(f"vs {runs.get(cmp.baseline, cmp.baseline)}", wrap=True))
        else:   # names: model, config, mode, run
            cols.append(Column(h, wrap=(h == "config"), fold=True))
    return cols


def _table_row(cmp: Comparison, r: Row, mark: str | None, runs: dict[str, str]) -> list[Any]:
    cells: list[Any] = [escape(c) for c in _cells(cmp, r)]
    cells[0] = escape(display_name(r.model))
    if cmp.axis == "runs":
        cells[3] = escape(runs.get(r.run, r.run))
    vi = _headers(cmp).index(f"{cmp.metric.label} ({cmp.metric.unit})")
    if mark:
        cells[vi] = Text(_cells(cmp, r)[vi], style="bold green" if mark == "best" else "bold red")
    cells[-1] = Text(_cells(cmp, r)[-1] + ("?" if r.noise else ""), style=_verdict_style(r))
    return cells


# A terminal table past a few hundred rows is read by no one, and rich lays out every cell
# (~1.5 ms a row here: 100,000 rows took minutes). Bigger comparisons show their first rows,
# whole groups, and say how to get the rest; csv, markdown and json always have every row.
TABLE_MAX_ROWS = 500


def shown_rows(cmp: Comparison, max_rows: int | None = TABLE_MAX_ROWS) -> int:
    """How many of cmp.rows the table shows: all, or the groups that fit in max_rows (at least
    the first group). max_rows None or 0: all."""
    n = len(cmp.rows)
    if not max_rows or n <= max_rows:
        return n
    cut = max_rows
    while cut > 0 and cmp.rows[cut].group == cmp.rows[cut - 1].group:
        cut -= 1        # never split a group: its rows are compared with each other
    if cut == 0:        # one group bigger than the cap: show that group whole
        cut = next((i for i in range(1, n) if cmp.rows[i].group != cmp.rows[0].group), n)
    return cut


def more_rows_line(cmp: Comparison, shown: int) -> str | None:
    """'... 99,500 more rows (49,750 cells) not shown: ...', or None when all are shown."""
    rest = cmp.rows[shown:]
    if not rest:
        return None
    groups = len({r.group for r in rest})
    what = "cells" if cmp.axis == "modes" else "cell/mode pairs"
    return (f"... {len(rest):,} more rows ({groups:,} {what}) not shown; the geometric mean "
            f"counts them all. Every row: --max-rows 0, --format csv|json|markdown, or "
            f"`fusebench export`")


def comparison_table(cmp: Comparison, wide: bool = False,
                     max_rows: int | None = TABLE_MAX_ROWS) -> FitTable:
    """The compare table (a FitTable: it fits the console it is printed on); at most max_rows
    rows (shown_rows), then a line saying how many more there are."""
    runs = short_labels([r.run for r in cmp.rows]) if cmp.axis == "runs" else {}
    title, same = _title(cmp)
    keep = [i for i, h in enumerate(_headers(cmp)) if h not in same]
    cols = _columns(cmp, runs)
    shown = shown_rows(cmp, max_rows)
    more = more_rows_line(cmp, shown)   # in the caption: a cell would widen its column
    caption = "\n".join(x for x in ([f"[yellow]{escape(more)}[/]"] if more else [])
                         + [_caption(cmp, runs) or ""] if x)
    t = FitTable([cols[i] for i in keep], title=title, caption=caption or None, wide=wide)
    marks = _best_worst(cmp)
    for i, r in enumerate(cmp.rows[:shown]):
        cells = _table_row(cmp, r, marks.get(i), runs)
        last_of_group = i + 1 < shown and cmp.rows[i + 1].group != r.group
        t.add_row(*[cells[j] for j in keep], end_section=last_of_group)
    t.add_section()
    for g in cmp.geomean:
        style = "dim" if not g.ratio.significant else ("green" if g.ratio.gain > 1 else "red")
        cells = [escape(c) for c in _geo_cells(cmp, g)]
        if cmp.axis == "runs":
            cells[3] = escape(runs.get(g.label, g.label))
        cells[-1] = Text(_geo_cells(cmp, g)[-1], style=style)
        t.add_row(*[cells[j] for j in keep], style="italic")
    return t


def render_table(cmp: Comparison, console: Console, wide: bool = False,
                 max_rows: int | None = TABLE_MAX_ROWS) -> None:
    console.print(comparison_table(cmp, wide, max_rows), crop=False)  # --wide may pass the edge


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (no tabulate dependency); '|' in cells is escaped."""
    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return ""
        return str(csv_cell(str(v))).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def render_markdown(cmp: Comparison) -> str:
    rows = [_cells(cmp, r) for r in cmp.rows] + [_geo_cells(cmp, g) for g in cmp.geomean]
    text = markdown_table(_headers(cmp), rows)
    if cmp.env_summary:
        text += f"\n_{cmp.env_summary}_\n"
    return text


def _dict_rows(cmp: Comparison) -> list[dict[str, Any]]:
    out = [r.to_dict(cmp.metric) for r in cmp.rows]
    for g in cmp.geomean:
        d = {k: None for k in out[0]} if out else {}
        d.update({"model": "geometric mean", "config": f"{g.cells} cells",
                  "variant": g.label if cmp.axis == "modes" else "",
                  "run": g.label if cmp.axis == "runs" else "", "metric": cmp.metric.name,
                  "unit": cmp.metric.unit, "verdict": g.verdict, "baseline": False,
                  "regression": False, **g.ratio.to_dict()})
        out.append(d)
    return out


def render_csv(cmp: Comparison) -> str:
    """csv.DictWriter's text of _dict_rows, written a column at a time (render/csvtext.py:
    each text made safe and quoted once, numbers formatted in one call)."""
    if not cmp.rows:
        return ""
    cols = _row_columns(cmp)
    for d in _dict_rows(Comparison(cmp.metric, cmp.axis, cmp.baseline, geomean=cmp.geomean)):
        for k, values in cols.items():
            values.append(d.get(k, ""))
    lines = [",".join(map(quote, cols))]
    lines += map(",".join, zip(*(fields(_safe(v)) for v in cols.values())))
    lines.append("")
    return "\n".join(lines)


def _safe(values: list[Any]) -> list[Any]:
    """csv_cells of a column that holds text; numbers, bools and None are their own cells."""
    return csv_cells(values) if str in set(map(type, values)) else values


def _row_columns(cmp: Comparison) -> dict[str, list[Any]]:
    """Row.to_dict of every row, as columns (the same keys, in the same order)."""
    rows, m = cmp.rows, cmp.metric
    ratios = [r.ratio for r in rows]
    cols: dict[str, list[Any]] = {k: [getattr(r, k) for r in rows]
                                  for k in ("model", "config", "variant", "run", "status")}
    cols["metric"], cols["unit"] = [m.name] * len(rows), [m.unit] * len(rows)
    cols["value"] = [None if r.value is None else r.value / m.scale for r in rows]
    for k in ("baseline", "verdict", "regression", "noise"):
        cols[k] = [getattr(r, k) for r in rows]
    cols["gain"] = [x.gain if x else None for x in ratios]
    cols["ci_low"] = [x.low if x else None for x in ratios]
    cols["ci_high"] = [x.high if x else None for x in ratios]
    cols["significant"] = [x.significant if x else None for x in ratios]
    return cols


def render_json(cmp: Comparison) -> str:
    doc = {"metric": cmp.metric.name, "unit": cmp.metric.unit,
           "higher_is_better": cmp.metric.higher_is_better, "axis": cmp.axis,
           "baseline": cmp.baseline, "rows": [r.to_dict(cmp.metric) for r in cmp.rows],
           "geomean": [{"label": g.label, "cells": g.cells, "verdict": g.verdict,
                        **g.ratio.to_dict()} for g in cmp.geomean],
           "warnings": cmp.warnings, "notes": cmp.notes, "env": cmp.env_summary,
           "regressions": len(cmp.regressions())}
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


# format name -> renderer returning text (the rich table prints itself)
TEXT_RENDERERS: dict[str, Callable[[Comparison], str]] = {
    "markdown": render_markdown,
    "csv": render_csv,
    "json": render_json,
}
