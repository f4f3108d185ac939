"""Runs exactly one cell: `python -m fusebench.cell.worker SPEC.json OUT.json`.

Speaks JSON only: spec in from a file, record out to a file (stdout carries phase and state
lines for the progress display; anything a model prints there is ignored). Every failure it
can see becomes a record; failures it cannot see (signal, hang) are recorded by the runner."""
from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback

from fusebench.cell.report import Reporter

# spec.kind (declared by the spec's part) -> module with run_cell(spec, phase) -> Record;
# phase is a cell/report.py Reporter (called with a phase name, as a plain callback is)
CELL_RUNNERS = {"model": "fusebench.cell.model_cell", "kernel": "fusebench.cell.kernel_cell"}


def _is_oom(exc: BaseException) -> bool:
    from fusebench.cell.oom import is_oom   # the table of CPU and CUDA OOM messages
    return is_oom(exc)


def run(spec_dict: dict) -> dict:
    from fusebench.errors import UsageError, first_line
    from fusebench.plugins import load_plugins
    from fusebench.measure.fpstate import change_event, flushes_subnormals
    from fusebench.spec import CellSpec, ErrorInfo, Event, Record

    spec = CellSpec.from_dict(spec_dict)
    threads = set_threads(spec.threads)
    reporter = Reporter()
    flushed = flushes_subnormals()
    try:
        load_plugins()
        module = importlib.import_module(CELL_RUNNERS[spec.kind])
        rec = module.run_cell(spec, reporter).to_dict()
    except BaseException as e:  # every failure in the cell becomes its record
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        status = "oom" if _is_oom(e) else "error"
        first = first_line(e, 500)
        etype = "UsageError" if isinstance(e, UsageError) else type(e).__name__
        rec = Record(ran_at(spec, reporter.facts), status,
                     error=ErrorInfo(etype, first)).to_dict()
    rec.setdefault("extra", {})["threads"] = threads
    fp_state = change_event(flushed, flushes_subnormals())
    if fp_state is not None:
        rec.setdefault("events", []).append(Event("fp_state", "process", fp_state).to_dict())
    return rec


def ran_at(spec, facts: dict):
    """spec with the image size the cell noted it ran at (None: the model made its own inputs,
    so a --quick preset size was not run), for a record the cell did not finish itself."""
    if spec.model is None or "img_size" not in facts:
        return spec
    img = facts["img_size"]
    ok = img is None or (isinstance(img, int) and not isinstance(img, bool))
    return spec.with_model(img_size=img) if ok else spec


# environment variables that set the thread pools when --threads does not
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def set_threads(requested: int | None) -> dict:
    """torch.set_num_threads(requested) when given; returns what this worker really runs with
    (intra-op and inter-op threads, and the env that set them without --threads)."""
    import torch
    if requested:
        torch.set_num_threads(requested)
    return {"requested": requested, "intra_op": torch.get_num_threads(),
            "inter_op": torch.get_num_interop_threads(),
            "env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ}}


def _exit_with_parent() -> None:
    """A worker runs in its own session, so nothing stops it when the coordinator is killed
    (SIGKILL, OOM killer): it watches its parent and takes its process group down with it."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        if os.getpgid(0) == os.getpid():     # our own group (started by the runner)
            os.killpg(0, signal.SIGKILL)
        os._exit(1)
    threading.Thread(target=watch, name="fusebench-parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    spec_path, out_path = argv[1], argv[2]
    _exit_with_parent()
    with open(spec_path) as f:
        spec_dict = json.load(f)
    record = run(spec_dict)
    from fusebench.results.document import write_atomic
    write_atomic(out_path, json.dumps(record, allow_nan=False))
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: compiler threads and CUDA contexts can hang or crash at exit
    # after the record is already safe on disk.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
