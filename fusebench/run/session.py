"""Runs a planned list of cells end to end for a command: results document on disk as cells
finish, table at the end, exit code from the statuses. Shared by `run` and `kernel`."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from rich.console import Console

from fusebench.errors import UsageError
from fusebench.run.repro import write_repros
from fusebench.results.document import ResultsWriter, default_path, dumps
from fusebench.run.runner import RunOptions, run_cells
from fusebench.spec import CellSpec, Record

EXIT_OK, EXIT_NOT_OK, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C: the running cell is killed, finished cells are kept."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    # `kill`, a job scheduler's time limit or a container stop sends SIGTERM: the user should
    # get the table so far and a valid document, exactly as with Ctrl-C, not a dead process.
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def exit_code(records: list[Record]) -> int:
    return EXIT_OK if records and all(r.status == "ok" for r in records) else EXIT_NOT_OK


def check_writable(folder: Path) -> None:
    """--out must be (or be creatable in) a writable folder: found out before any cell runs,
    not when the first finished cell cannot be saved. Writes nothing."""
    p = folder.expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        raise UsageError(f"--out {folder}: {p} is not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--out {folder}: {p} is not writable")


def _env() -> dict:
    from fusebench.results.env import collect_env
    return collect_env()


def execute(specs: list[CellSpec], *, stem: str, out: Path, save: bool, json_out: bool,
            warm_cache: bool = False, retry_oom: bool = True, argv=None, table=None,
            details=None) -> int:
    from fusebench.render.run_table import make_console, print_details, run_table, short_model
    table = table or run_table
    details = details or print_details
    # With --json, stdout carries only the document; everything for people goes to stderr.
    console = make_console(stderr=json_out)
    if save:
        check_writable(Path(out))
    path = default_path(out, short_model(stem).replace(":", "-")) if save else None
    writer = ResultsWriter(path, _env(), command=list(argv or []))
    interrupted: KeyboardInterrupt | None = None
    try:
        with sigterm_as_interrupt():
            run_cells(specs, writer, opts=RunOptions(warm_cache=warm_cache, retry_oom=retry_oom),
                      console=Console(stderr=True))
    except KeyboardInterrupt as e:
        interrupted = e
    if not writer.doc["records"]:
        path = None          # nothing finished: no empty document left behind
    if path is not None:     # repro scripts for failing cells, next to the document
        write_repros(writer, path)
    records = writer.records()
    if records:
        console.print(table(records))
        details(console, records)
    if json_out:
        sys.stdout.write(dumps(writer.doc))
        sys.stdout.flush()
    if path is not None:
        console.print(f"results: {path}", highlight=False)
    if interrupted is not None:
        what = "terminated" if isinstance(interrupted, Terminated) else "interrupted"
        console.print(f"{what}: {len(records)} of {len(specs)} cells finished and saved",
                      highlight=False)
        return EXIT_TERMINATED if isinstance(interrupted, Terminated) else EXIT_INTERRUPTED
    return exit_code(records)
