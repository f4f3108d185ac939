"""fusebench compare FILE [FILE...]: modes side by side, or runs against a baseline, with CIs."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from fusebench.commands import add_command, choices, guarded
from fusebench.render.compare_table import TABLE_MAX_ROWS, TEXT_RENDERERS
from fusebench.results.compare import METRICS


MetricChoice = choices("MetricChoice", METRICS)
CompareFormat = choices("CompareFormat", ("table", *TEXT_RENDERERS))   # table: rich, to the tty


@guarded
def compare(
    files: Annotated[list[Path], typer.Argument(
        help="Results files (fusebench JSON, any schema version).")],
    baseline: Annotated[Optional[str], typer.Option(
        help="One file: the baseline mode (default eager). Several files: the baseline file "
             "(default the first).")] = None,
    metric: Annotated[MetricChoice, typer.Option(help="What to compare.")] =
        MetricChoice("throughput"),
    fmt: Annotated[CompareFormat, typer.Option("--format", help="Output format.")] =
        CompareFormat("table"),
    fail_on_regression: Annotated[Optional[float], typer.Option(
        "--fail-on-regression", metavar="PCT",
        help="Exit 1 when a cell is worse by more than PCT percent and its 95% CI excludes "
             "no change (or, across runs, a cell that was ok now fails).")] = None,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Every column, even wider than the terminal (default: the columns "
                       "that fit, numbers never cut).")] = False,
    max_rows: Annotated[int, typer.Option(
        "--max-rows", metavar="N", min=0,
        help="The table shows at most N rows (whole cells), then says how many more there "
             "are; 0: every row. csv, markdown and json always have every row.")] =
        TABLE_MAX_ROWS,
) -> None:
    """Compare modes within one run, or the same cells across runs, with bootstrap CIs."""
    from fusebench.results.compare import compare_files
    from fusebench.render.compare_table import render_table
    from fusebench.results.bulk import settled

    cmp = compare_files(files, metric.value, baseline, fail_on_regression)
    settled(len(cmp.rows))     # rendering need not re-scan what was loaded (results/bulk.py)
    err = Console(stderr=True)
    if cmp.nothing_matched:
        err.print(f"fusebench: {escape(cmp.nothing_matched)}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    for w in cmp.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(w)}", highlight=False, soft_wrap=True)
    for n in cmp.notes:
        err.print(f"[dim]note: {escape(n)}[/dim]", highlight=False, soft_wrap=True)
    if fmt.value == "table":
        render_table(cmp, Console(), wide, max_rows)
    else:
        sys.stdout.write(TEXT_RENDERERS[fmt.value](cmp))
    if not cmp.rows:
        err.print("[yellow]warning:[/yellow] no cells to compare", highlight=False)
    regressions = cmp.regressions()
    if regressions:
        for r in regressions:
            where = f" in {r.run}" if r.run else ""
            err.print("[bold red]regression[/bold red]" + escape(
                f"{where}: {r.model} {r.config} {r.variant}: {r.verdict}"),
                highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    add_command(app, "compare", compare)
