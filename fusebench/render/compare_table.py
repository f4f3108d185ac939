"""Renderers for a Comparison: rich table, markdown, csv, json. One function per format."""
from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusebench.render.escape import cell as csv_cell, markup, rich_text
from fusebench.results.compare import Comparison, Row


def _one_config(cmp: Comparison) -> str | None:
    """The config shared by every row, if there is just one (then it goes in the title)."""
    configs = {r.config for r in cmp.rows}
    return configs.pop() if len(configs) == 1 else None


def _headers(cmp: Comparison) -> list[str]:
    m = cmp.metric
    cols = ["model", "config", "mode"]
    if cmp.kind == "runs":
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
    if cmp.kind == "runs":
        out.append(r.run)
    out.append(value)
    if m.name == "step_ms":
        out.append("—" if r.iqr is None else f"{r.iqr:.3f}")
    out.append(r.verdict + (" REGRESSION" if r.regression else ""))
    return out


def _geo_cells(cmp: Comparison, g) -> list[str]:
    cells = f"({g.cells} cell{'s' if g.cells != 1 else ''})"
    out = [f"geometric mean\n{cells}", "", "" if cmp.kind == "runs" else g.label]
    if cmp.kind == "runs":
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
    if not r.ratio.significant:
        return "dim"
    return "green" if r.ratio.gain > 1 else "red"


def render_table(cmp: Comparison, console: Console) -> None:
    caption = cmp.env_summary or None
    title = (f"{cmp.metric.label}: modes vs {cmp.baseline}" if cmp.kind == "modes"
             else f"{cmp.metric.label}: runs vs {cmp.baseline}")
    one_config = _one_config(cmp)
    if one_config:
        title += f" · {one_config}"
    t = Table(title=markup(title), caption=caption and markup(caption), show_lines=False)
    heads = _headers(cmp)
    value_col = heads.index(f"{cmp.metric.label} ({cmp.metric.unit})")
    drop = heads.index("config") if one_config else None
    for i, h in enumerate(heads):
        if i == drop:
            continue
        if i == value_col:
            h = f"{cmp.metric.label}\n({cmp.metric.unit})"
        # the verdict is the point of the table: never wrap it, let the config column wrap
        t.add_column(h, justify="right" if value_col <= i < len(heads) - 1 else "left",
                     no_wrap=(i == len(heads) - 1 or h in ("model", "mode")),
                     min_width=len(cmp.metric.unit) + 2 if i == value_col else None)
    marks = _best_worst(cmp)
    for i, r in enumerate(cmp.rows):
        cells: list[Any] = [rich_text(c) for c in _cells(cmp, r)]
        mark = marks.get(i)
        if mark:
            cells[value_col] = Text(cells[value_col].plain, style="bold green" if mark == "best"
                                    else "bold red")
        cells[-1].stylize(_verdict_style(r))
        last_of_group = i + 1 < len(cmp.rows) and cmp.rows[i + 1].group != r.group
        t.add_row(*[c for j, c in enumerate(cells) if j != drop], end_section=last_of_group)
    if cmp.geomean:
        t.add_section()
        for g in cmp.geomean:
            style = "dim" if not g.ratio.significant else ("green" if g.ratio.gain > 1 else "red")
            cells = [rich_text(c) for c in _geo_cells(cmp, g)]
            cells[-1].stylize(style)
            t.add_row(*[c for j, c in enumerate(cells) if j != drop], style="italic")
    console.print(t)


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
                  "variant": g.label if cmp.kind == "modes" else "",
                  "run": g.label if cmp.kind == "runs" else "", "metric": cmp.metric.name,
                  "unit": cmp.metric.unit, "verdict": g.verdict, "baseline": False,
                  "regression": False, **g.ratio.to_dict()})
        out.append(d)
    return out


def render_csv(cmp: Comparison) -> str:
    rows = _dict_rows(cmp)
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def render_json(cmp: Comparison) -> str:
    doc = {"metric": cmp.metric.name, "unit": cmp.metric.unit,
           "higher_is_better": cmp.metric.higher_is_better, "kind": cmp.kind,
           "baseline": cmp.baseline, "rows": [r.to_dict(cmp.metric) for r in cmp.rows],
           "geomean": [{"label": g.label, "cells": g.cells, "verdict": g.verdict,
                        **g.ratio.to_dict()} for g in cmp.geomean],
           "warnings": cmp.warnings, "env": cmp.env_summary,
           "regressions": len(cmp.regressions())}
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


# format name -> renderer returning text (the rich table prints itself)
TEXT_RENDERERS: dict[str, Callable[[Comparison], str]] = {
    "markdown": render_markdown,
    "csv": render_csv,
    "json": render_json,
}
