"""Rich tables for run results: one row per cell, then the top events per cell."""
from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from fusebench.render.escape import markup as escape
from rich.table import Table

from fusebench.spec import Record

STATUS_STYLE = {"ok": "green", "mismatch": "bold red", "error": "red", "unavailable": "yellow",
                "crashed": "bold red", "timeout": "red", "oom": "magenta"}
TOP_EVENTS = 5


def short_model(name: str) -> str:
    """'path/to/file.py:factory' -> 'file.py:factory' for display; zoo names unchanged."""
    path, sep, fn = name.rpartition(":")
    return f"{path.rsplit('/', 1)[-1]}:{fn}" if sep and path.endswith(".py") else name


def make_console(stderr: bool = False) -> Console:
    """Wide enough for the run table even when stdout is a pipe (rich defaults to 80)."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=max(c.width, 180))


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _correct(r: Record) -> str:
    c = r.correctness
    if c is None:
        return "ref" if r.spec.mode == "eager" and r.status == "ok" else "-"
    errs = f"out {c.max_rel_err_out:.1e}" if c.max_rel_err_out is not None else "out n/a"
    if c.max_rel_err_grad is not None:
        errs += f", grad {c.max_rel_err_grad:.1e}"
    return ("[green]pass[/] " if c.passed else "[bold red]FAIL[/] ") + errs


def run_table(records: list[Record], title: str = "fusebench run") -> Table:
    t = Table(title=title, title_justify="left")
    for col, kw in [("model", {}), ("mode", {}), ("bench", {}), ("b", {"justify": "right"}),
                    ("img", {"justify": "right"}), ("status", {}),
                    ("samples/s", {"justify": "right"}), ("step ms (median ± IQR)",
                                                          {"justify": "right"}),
                    ("vs eager", {"justify": "right"}), ("compile s", {"justify": "right"}),
                    ("peak mem", {"justify": "right"}), ("act mem", {"justify": "right"}),
                    ("events", {"justify": "right"}), ("correctness", {})]:
        t.add_column(col, **kw)
    from fusebench.results.compare import speedups   # scipy: only when a table is drawn
    sp = speedups(records, "eager")     # the cell's eager record is the denominator
    for i, r in enumerate(records):
        st, m = r.step_ms, r.spec.model
        t.add_row(
            escape(short_model(r.spec.subject)), escape(r.spec.mode),
            escape(m.bench) if m else "-",
            str(m.batch_size) if m else "-", str(m.img_size or "-") if m else "-",
            f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            f"{r.throughput:,.1f}" if r.throughput else "-",
            f"{st.median:.2f} ± {st.iqr:.2f}" if st else "-",
            f"{sp[i]:.2f}x" if i in sp else "-",
            f"{r.compile_s:.2f}" if r.compile_s is not None else "-",
            fmt_bytes(r.peak_mem_bytes), fmt_bytes(r.activation_bytes),
            str(sum(e.count for e in r.events)), _correct(r))
    return t


def print_details(console: Console, records: Iterable[Record]) -> None:
    """Below the table: errors and the top events of each cell (what fell back, and why)."""
    for r in records:
        lines = []
        if r.error:
            lines.append(f"  [red]{escape(r.error.type)}[/]: {escape(r.error.message)}")
        if r.correctness and not r.correctness.passed and r.correctness.detail:
            lines.append(f"  [red]mismatch[/]: {escape(r.correctness.detail)}")
        evs = sorted(r.events, key=lambda e: -e.count)
        for e in evs[:TOP_EVENTS]:
            lines.append(escape(f"  {e.kind} ({e.source}) x{e.count}: {e.message}"))
        if len(evs) > TOP_EVENTS:
            lines.append(f"  ... {len(evs) - TOP_EVENTS} more event kinds in the results file")
        if r.extra.get("repro"):
            lines.append(escape(f"  repro: {r.extra['repro']}"))
        if lines:
            heading = r.spec.title(short_model(r.spec.subject))
            console.print(f"[bold]{escape(heading)}[/]", highlight=False)
            for line in lines:
                console.print(line, highlight=False, markup=True, soft_wrap=True)

