"""fusebench plot FILE [FILE...] --figure NAME -o out.png|.svg: the picture people share."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from fusebench.commands import add_command, choices, guarded
from fusebench.render.plot import PLOTS


Figure = choices("Figure", PLOTS)


@guarded
def plot(
    files: Annotated[list[Path], typer.Argument(
        help="Results files (fusebench JSON, any schema version).")],
    figure: Annotated[Figure, typer.Option(
        "--figure", "--kind", help="Which figure (--kind: its earlier name).")] =
        Figure("speedup"),
    output: Annotated[Path, typer.Option("--output", "-o",
                                         help="Image to write: .png, .svg or .pdf.")] =
        Path("fusebench.png"),
) -> None:
    """Plot speedup (with CIs), throughput, memory or a sweep; headless, env in a footnote."""
    from fusebench.render.plot import plot_files

    _check_output(output, files)
    out = plot_files(files, figure.value, output)
    print(f"wrote {out}", file=sys.stderr)


def _check_output(output: Path, files: list[Path]) -> None:
    """-o: a supported image type, not a folder, writable, not one of the inputs."""
    from fusebench.render.plot import check_output
    from fusebench.results.document import check_output_file

    check_output(output)
    check_output_file(output, files)


def register(app: typer.Typer) -> None:
    add_command(app, "plot", plot)
