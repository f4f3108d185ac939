"""Runs a planned list of cells end to end for a command: results document on disk as cells
finish, table at the end, exit code from the statuses. Shared by `run` and `kernel`."""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from fusebench.run.output import SaveError, claim_results_path, out_folder, save_error
from fusebench.run.repro import write_repros
from fusebench.results.document import ResultsWriter, dumps
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


def _env() -> dict:
    from fusebench.results.env import collect_env
    return collect_env()


class _Writer(ResultsWriter):
    """The session's writer: a failed save is a SaveError naming the path and the errno."""

    def append(self, record: Record) -> None:
        try:
            super().append(record)
        except OSError as e:
            raise save_error(self.path, e) from e


def _open_writer(save: bool, out: Path, stem: str, argv) -> _Writer:
    from fusebench.render.run_table import short_model
    if save:
        out_folder(out)        # a bad --out is a usage error before anything else runs
    writer = _Writer(None, _env(), command=list(argv or []))
    if save:   # claimed holding the empty document: a valid file from the start
        writer.path = claim_results_path(out, short_model(stem).replace(":", "-"),
                                         dumps(writer.doc))
    return writer


# prepare(specs) -> (specs, notes): run once every input check has passed (it may start
# workers: the CPU batch probe); notes[i] is added to the extra of cell i's record
Prepare = Callable[[list[CellSpec]], "tuple[list[CellSpec], list[dict]]"]


def _run(specs, writer, opts: RunOptions, prepare: Prepare | None = None
         ) -> BaseException | None:
    """Run the cells; what stopped them early (Ctrl-C, SIGTERM, a failed save), if anything."""
    try:
        with sigterm_as_interrupt():
            notes = None
            if prepare is not None:
                specs, notes = prepare(specs)
            run_cells(specs, writer, opts=opts, console=Console(stderr=True), notes=notes)
    except (KeyboardInterrupt, SaveError) as e:
        return e
    return None


def execute(specs: list[CellSpec], *, stem: str, out: Path, save: bool, json_out: bool,
            warm_cache: bool = False, retry_oom: bool = True, argv=None, table=None,
            details=None, prepare: Prepare | None = None, repeat: int = 1,
            wait_idle: bool = False, interleave: bool = True) -> int:
    from fusebench.render.run_table import make_console, print_details, run_table
    table = table or run_table
    details = details or print_details
    # With --json, stdout carries only the document; everything for people goes to stderr.
    console = make_console(stderr=json_out)
    writer = _open_writer(save, out, stem, argv)
    stopped = _run(specs, writer, RunOptions(warm_cache=warm_cache, retry_oom=retry_oom,
                                             repeat=repeat, wait_idle=wait_idle,
                                             interleave=interleave), prepare)
    path = writer.path
    if path is not None and not writer.doc["records"]:
        path.unlink(missing_ok=True)   # nothing finished: no empty document left behind
        path = None
    if path is not None and not isinstance(stopped, SaveError):
        write_repros(writer, path)     # repro scripts for failing cells, next to the document
    records = writer.records()
    if records:
        console.print(table(records), crop=False)   # --wide: may be wider than the terminal
        details(console, records)
    if json_out:
        sys.stdout.write(dumps(writer.doc))
        sys.stdout.flush()
    if path is not None:
        console.print(f"results: {path}", highlight=False)
    return _final(console, stopped, records, len(specs))


def _final(console, stopped: BaseException | None, records: list[Record], total: int) -> int:
    if isinstance(stopped, SaveError):
        kept = max(len(records) - 1, 0)   # the last record is in memory only
        print(f"fusebench: error: {stopped.strerror}; run stopped, {kept} of {total} cells "
              f"saved", file=sys.stderr)
        return EXIT_NOT_OK
    if stopped is not None:
        what = "terminated" if isinstance(stopped, Terminated) else "interrupted"
        console.print(f"{what}: {len(records)} of {total} cells finished and saved",
                      highlight=False)
        return EXIT_TERMINATED if isinstance(stopped, Terminated) else EXIT_INTERRUPTED
    return exit_code(records)
