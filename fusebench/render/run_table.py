"""Rich tables for run results: one row per cell, then the top events per cell."""
from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from fusebench.render.escape import markup as escape

from fusebench.render.fit import Column, FitTable
from fusebench.render.names import display_name, shared_title
from fusebench.spec import Record

STATUS_STYLE = {"ok": "green", "mismatch": "bold red", "error": "red", "unavailable": "yellow",
                "crashed": "bold red", "timeout": "red", "oom": "magenta"}
TOP_EVENTS = 5


def short_model(name: str) -> str:
    """'path/to/file.py:factory' -> 'file.py:factory' (file names, headings); zoo names
    unchanged."""
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


# header, justify, drop priority (0: always shown, higher: dropped first at narrow widths)
# model/bench/b/img/threads/heap are shown only when they differ between rows: then they tell
# rows apart (shared ones go in the title)
_RUN_COLUMNS = [("model", "left", 0), ("mode", "left", 0), ("bench", "left", 0),
                ("b", "right", 0), ("img", "right", 0), ("threads", "right", 7),
                ("heap", "left", 7), ("status", "left", 0),
                ("samples/s", "right", 2), ("step ms", "right", 0), ("± IQR", "right", 4),
                ("vs eager", "right", 0), ("compile s", "right", 5), ("peak mem", "right", 3),
                ("act mem", "right", 6), ("events", "right", 8), ("correctness", "left", 1)]


BUSY_MARK = "!"


def _step(st, busy: bool) -> str:
    """The median step time; marked when the machine was busy while it was timed."""
    if not st:
        return "-"
    return f"[yellow]{st.median:.2f}{BUSY_MARK}[/]" if busy else f"{st.median:.2f}"


def _threads(r: Record) -> str:
    """The intra-op threads the worker ran with (extra.threads, cell/worker.py), else the
    ones asked for."""
    ran = (r.extra or {}).get("threads")
    n = ran.get("intra_op") if isinstance(ran, dict) else r.spec.threads
    return f"T{n}" if n else "-"


def _heap(r: Record) -> str:
    """A CPU model cell's glibc heap policy as its worker applied it (measure/heap.py)."""
    return escape(str((r.extra or {}).get("heap") or "-"))


def _run_cells(r: Record, ratio: str, busy: bool = False) -> list[str]:
    st, m = r.step_ms, r.spec.model
    return [escape(display_name(r.spec.subject)), escape(r.spec.variant()),
            m.bench if m else "-", str(m.batch_size) if m else "-",
            str(m.img_size or "-") if m else "-", _threads(r), _heap(r),
            f"[{STATUS_STYLE.get(r.status, '')}]{r.status}[/]",
            f"{r.throughput:,.1f}" if r.throughput else "-",
            _step(st, busy), f"± {st.iqr:.2f}" if st else "-", ratio,
            f"{r.compile_s:.2f}" if r.compile_s is not None else "-",
            fmt_bytes(r.peak_mem_bytes), fmt_bytes(r.activation_bytes),
            str(sum(e.count for e in r.events)), _correct(r)]


def _title_fields(records: list[Record]) -> dict[str, list[str]]:
    """Column -> the caption form of each row's value ('b8', '224px')."""
    ms = [r.spec.model for r in records]
    return {"model": [escape(display_name(r.spec.subject)) for r in records],
            "bench": [m.bench if m else "-" for m in ms],
            "b": [f"b{m.batch_size}" if m else "-" for m in ms],
            "img": [f"{m.img_size}px" if m and m.img_size else "-" for m in ms],
            "threads": [_threads(r) for r in records],
            "heap": [f"heap {h}" if (h := _heap(r)) != "-" else h for r in records]}


def ratio_cell(text: str, noisy: str | None) -> str:
    """A ratio; dim with a '?' when a side of it is noisy (the footer says why)."""
    return f"[dim]{text}?[/]" if noisy else text


def noise_footer(reasons: Iterable[str], busy: Iterable[str] = ()) -> str | None:
    lines = dict.fromkeys(f"? {why}" for why in reasons)
    marks = dict.fromkeys(f"{BUSY_MARK} {why}" for why in busy)
    parts = []
    if lines:
        parts.append(escape("\n".join(lines)) + "\n[dim]?: a side of this ratio is noisy; "
                                                 "rerun it[/]")
    if marks:
        parts.append(escape("\n".join(marks)) + f"\n[dim]{BUSY_MARK}: other processes used "
                     "the worker's cores while it was timed; rerun on a quiet machine "
                     "(run --wait-idle)[/]")
    return "\n".join(parts) or None


def run_table(records: list[Record], title: str = "fusebench run", wide: bool = False):
    """The run table (a FitTable: it fits the console it is printed on)."""
    from fusebench.results.compare import busy_of, noisy_speedups, speedups  # scipy: if drawn
    sp = speedups(records, "eager")     # the cell's eager record is the denominator
    noisy = noisy_speedups(records, "eager")
    busy = {i: why for i, r in enumerate(records) if (why := busy_of(r))}
    rows = [_run_cells(r, ratio_cell(f"{sp[i]:.2f}x", noisy.get(i)) if i in sp else "-",
                       i in busy)
            for i, r in enumerate(records)]
    title, same = shared_title(title, _title_fields(records))
    keep = [i for i, (h, _, _) in enumerate(_RUN_COLUMNS) if h not in same]
    cols = [Column(h, j, d, wrap=(h == "correctness"), fold=h in ("model", "mode"))
            for h, j, d in _RUN_COLUMNS]
    t = FitTable([cols[i] for i in keep], title=title, wide=wide,
                 caption=noise_footer([f"{records[i].spec.variant()} vs eager: {why}"
                                       for i, why in noisy.items()
                                       if records[i].spec.variant() != "eager"],
                                      [f"{records[i].spec.variant()}: {why}"
                                       for i, why in busy.items()]))
    for row in rows:
        t.add_row(*[row[i] for i in keep])
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
            lines.append(escape(f"  {e.category} ({e.source}) x{e.count}: {e.message}"))
        if len(evs) > TOP_EVENTS:
            lines.append(f"  ... {len(evs) - TOP_EVENTS} more event kinds in the results file")
        if r.extra.get("repro"):
            lines.append(escape(f"  repro: {r.extra['repro']}"))
        if lines:
            heading = r.spec.title(short_model(r.spec.subject))
            console.print(f"[bold]{escape(heading)}[/]", highlight=False)
            for line in lines:
                console.print(line, highlight=False, markup=True, soft_wrap=True)

