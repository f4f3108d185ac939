"""fusebench list models|modes|kernels [PATTERN] [--json]."""
from __future__ import annotations

import fnmatch
import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from fusebench.commands import Command, Group, guarded

list_app = typer.Typer(cls=Group, no_args_is_help=True,
                       help="List models, execution modes or kernels.")

Pattern = Annotated[str, typer.Argument(help="glob pattern, e.g. 'convnext_*'")]
AsJson = Annotated[bool, typer.Option("--json", help="print a JSON list instead of a table")]


def _show(rows: list[dict], cells: list[tuple[str, ...]], as_json: bool, what: str,
          pattern: str) -> None:
    """Table: one line per row (name first, then short columns). JSON: `rows` as a list."""
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no {what} match '{pattern}'", file=sys.stderr)
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column("name", no_wrap=True, style="bold")
    for _ in cells[0][1:]:
        table.add_column()
    for row in cells:
        table.add_row(*(Text(str(c)) for c in row))   # Text: descriptions are not markup
    console_for_rows().print(table)


def console_for_rows() -> Console:
    """A terminal wraps to its width; a pipe gets one row per line (grep-able)."""
    console = Console()
    return console if console.is_terminal else Console(width=250)


def _status(ok: bool, reason: str) -> str:
    return "available" if ok else f"unavailable: {reason}"


@list_app.command("models", cls=Command)
@guarded
def models(pattern: Pattern = "*", as_json: AsJson = False) -> None:
    """Models in the bundled zoo and plugins (also usable: timm:NAME and path/file.py:factory)."""
    from fusebench.models import get_model_info, list_models
    from fusebench.run.probe import load
    load()                      # FUSEBENCH_PLUGINS' models too, loaded in the probe
    infos = [get_model_info(n) for n in list_models(pattern)]
    rows = [{"name": i.name, "family": i.family, "train_size": i.train_size,
             "infer_size": i.infer_size, "description": i.description} for i in infos]
    cells = [(i.name, i.family, f"{i.train_size}/{i.infer_size}px", i.description)
             for i in infos]
    _show(rows, cells, as_json, "models", pattern)


@list_app.command("modes", cls=Command)
@guarded
def modes(pattern: Pattern = "*", as_json: AsJson = False) -> None:
    """Execution modes and whether each is available on this machine."""
    from fusebench.modes import get_mode, list_modes
    from fusebench.run.probe import load
    load()
    names = list_modes(pattern)
    rows = []
    for name in names:
        mode = get_mode(name)
        ok, reason = mode.available(dict(mode.option_defaults), "cpu")
        rows.append({"name": name, "available": bool(ok), "reason": reason or "",
                     "description": mode.description})
    cells = [(r["name"], _status(r["available"], r["reason"]), r["description"]) for r in rows]
    _show(rows, cells, as_json, "modes", pattern)


@list_app.command("kernels", cls=Command)
@guarded
def kernels(pattern: Pattern = "*", as_json: AsJson = False) -> None:
    """Kernel implementations as family/impl; PATTERN matches the family or 'family/impl'."""
    from fusebench.kernels import families, get_impl, list_impls
    from fusebench.run.probe import load
    load()
    rows = []
    for fam in families():
        for impl_name in list_impls(fam):
            full = f"{fam}/{impl_name}"
            if not (fnmatch.fnmatchcase(full, pattern) or fnmatch.fnmatchcase(fam, pattern)):
                continue
            impl = get_impl(fam, impl_name)
            ok, reason = impl.available("cpu")
            rows.append({"name": full, "family": fam, "impl": impl_name, "available": bool(ok),
                         "reason": reason or "", "description": impl.description})
    cells = [(r["name"], _status(r["available"], r["reason"]), r["description"]) for r in rows]
    _show(rows, cells, as_json, "kernels", pattern)


def register(app: typer.Typer) -> None:
    app.add_typer(list_app, name="list")
