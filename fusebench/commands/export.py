"""fusebench export FILE --format csv|markdown: a results file as a table for other tools."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from fusebench.commands import add_command, choices, guarded
from fusebench.render.export import FILE_EXPORTERS


ExportFormat = choices("ExportFormat", FILE_EXPORTERS)


@guarded
def export(
    files: Annotated[list[Path], typer.Argument(
        help="Results files (fusebench JSON, any schema version).")],
    fmt: Annotated[ExportFormat, typer.Option("--format", help="Output format.")] =
        ExportFormat("csv"),
    output: Annotated[Optional[Path], typer.Option(
        "--output", "-o", help="Write here (atomically) instead of stdout.")] = None,
) -> None:
    """Export records (one row each, env columns prefixed env.) as CSV or a markdown table."""
    from fusebench.results.document import check_output_file, write_atomic

    if output is not None:      # before loading anything: a bad -o fails fast
        check_output_file(output, files)
    pieces = FILE_EXPORTERS[fmt.value](files)     # everything read: only writing is left
    if output is None:
        sys.stdout.writelines(pieces)
    else:
        write_atomic(output, pieces)
        print(f"wrote {output}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    add_command(app, "export", export)
