"""Runs cells, one worker process each. A worker that crashes, hangs or runs out of memory
costs only its own cell: it becomes a record, and the next cell runs."""
from __future__ import annotations

import dataclasses
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fusebench.cell.worker import ran_at
from fusebench.run import distributed
from fusebench.run import forkserver, killed
from fusebench.run.progress import CellState
from fusebench.run.reaper import CellProcesses
from fusebench.run.repeat import ProcessSeries
from fusebench.spec import CellSpec, ErrorInfo, Record
from fusebench.results.document import record_from_worker

STDERR_TAIL_LINES = 40
KILL_GRACE_S = 3.0   # SIGTERM first, so a worker can flush; then SIGKILL the whole group


def warm_cache_dir() -> Path:
    root = os.environ.get("FUSEBENCH_CACHE") or Path.home() / ".cache" / "fusebench"
    return Path(root) / "compile-cache"


@dataclass(frozen=True)
class RunOptions:
    warm_cache: bool = False
    retry_oom: bool = True
    min_batch: int = 1
    repeat: int = 1            # worker processes per cell (run/repeat.py)
    cache_dir: Path | None = None   # the cell's compile cache, shared by its processes
    wait_idle: bool = False    # wait for a quiet machine before each process
    interleave: bool = True    # --repeat: process k of every cell, then k+1 (run/schedule.py)


def decay_batch(b: int) -> int:
    """64 -> 48 -> 32 -> 24 -> 16 -> 12 -> 8 -> 6 -> 4 -> 3 -> 2 -> 1 (timm's step-down):
    halve to the previous power of two, with a 3/4 stop in between."""
    if b <= 1:
        return 0
    p = 1 << (b - 1).bit_length() - 1           # largest power of two < b
    return p + p // 2 if b > p + p // 2 and p >= 2 else p


class _Worker:
    """One running worker process and the threads that drain its pipes."""

    def __init__(self, spec: CellSpec, opts: RunOptions, on_phase: Callable[[str], None]):
        self.spec = spec
        self.tmp = tempfile.TemporaryDirectory(prefix="fusebench-cell-")
        tmp = Path(self.tmp.name)
        self.spec_path, self.out_path = tmp / "spec.json", tmp / "record.json"
        self.spec_path.write_text(json.dumps(spec.to_dict()))
        cache = (warm_cache_dir() if opts.warm_cache else opts.cache_dir
                 or tmp / "compile-cache")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               # a fresh cache dir per cell gives cold compile numbers; --warm-cache shares one
               "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
               "TRITON_CACHE_DIR": str(cache / "triton")}
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self.state = CellState()        # the last phase/steps/samples the worker reported
        cmd = [sys.executable, "-m", "fusebench.cell.worker", str(self.spec_path), str(self.out_path)]
        self.dist = spec.dist
        if self.dist:   # torchrun starts the ranks; each writes record.rankR.json
            cmd = distributed.launch_command(self.dist, self.spec_path, self.out_path)
            env = distributed.launch_env(self.dist, env)
        # CUDA does not survive fork() once a parent has touched the driver, so GPU cells
        # (and torchrun's ranks) always start a fresh interpreter
        forkable = forkserver.enabled() and not self.dist and not spec.device.startswith("cuda")
        self.procs = CellProcesses()   # what the cell starts (setsid'd or orphaned too) ends with it
        self.oom_kills = killed.oom_kills()   # moved by the cell's end: the OOM killer sent it
        server = forkserver.get_server() if forkable else None
        if server is not None:   # a fresh fork of a warm parent: no per-cell torch import
            self.proc = server.spawn(self.spec_path, self.out_path, tmp / "stdout.txt",
                                     tmp / "stderr.txt", env)
        else:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True)   # own process group: killable as a whole
        self._threads = [threading.Thread(target=self._read_stdout, args=(on_phase,), daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self, on_phase):
        for raw in self.proc.stdout:
            if self.state.feed(raw.decode(errors="replace").rstrip("\n")):
                on_phase(self.state.text())

    def _read_stderr(self):
        for raw in self.proc.stderr:
            self.stderr_tail.append(raw.decode(errors="replace").rstrip("\n"))

    def kill(self) -> None:
        self.procs.note(self.proc.pid)   # its descendants, while they still hang off it
        try:
            for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    return
                try:
                    self.proc.wait(wait)
                    return
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if self.dist:   # torchrun gives each rank its own session: kill those groups too
                distributed.kill_ranks(self.out_path)

    def wait(self) -> Record:
        try:
            rc = self.proc.wait(timeout=self.spec.timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self._join()    # the last state lines are read before the record is made
            return self._failure("timeout", None, ErrorInfo(
                "Timeout", f"cell exceeded --timeout {self.spec.timeout:g} s "
                           f"{self.state.where()}; worker killed"))
        self._join()
        rec = (distributed.collect(self.spec, self.out_path) if self.dist
               else record_from_worker(self.out_path, self.spec)
               if self.out_path.is_file() else None)
        if rec is not None:
            if rec.status != "ok":
                where = {"stopped": self.state.stopped()} if rec.status in ("error", "oom") else {}
                rec = rec.replace(extra={**rec.extra, "exit_code": rc,
                                         "stderr_tail": self._tail(), **where})
            return rec
        return self._crash(rc)

    def _crash(self, rc: int) -> Record:
        lost = getattr(self.proc, "server_lost", None)
        msg = killed.crash_message(rc, self.oom_kills, lost)
        return self._failure("crashed", None if lost else rc,
                             ErrorInfo("Crashed", f"{msg} {self.state.where()}"))

    def _join(self) -> None:
        for t in self._threads:
            t.join(timeout=2.0)

    def _failure(self, status: str, rc, err: ErrorInfo) -> Record:
        """A record for a worker that left none: the spec, how it ended, and from its last
        state the image size it ran at, its first call's time and how far it got (phase,
        steps, samples)."""
        first = self.state.facts.get("first_call_s")
        spec = ran_at(self.spec, self.state.facts)
        return Record(spec, status, error=err, compile_s=(
            first if isinstance(first, (int, float)) and first >= 0 else None), extra={
            "exit_code": rc, "signal": (signal.Signals(-rc).name if isinstance(rc, int) and rc < 0
                                        and -rc in signal.Signals._value2member_map_ else None),
            "stderr_tail": self._tail(), "stopped": self.state.stopped()})

    def _tail(self) -> str:
        return "\n".join(self.stderr_tail)

    def close(self):
        if self.proc.poll() is None:
            self.kill()
        self.procs.end(self.proc.pid, keep=forkserver.server_pids())
        self.tmp.cleanup()


def run_one(spec: CellSpec, opts: RunOptions = RunOptions(),
            on_phase: Callable[[str], None] = lambda p: None) -> Record:
    """Run a cell; on OOM retry with a decayed batch size down to opts.min_batch."""
    known = distributed.precheck(spec)     # a mode that cannot run under the wrapper
    if known is not None:
        return known
    failed: list[int] = []
    while True:
        w = _Worker(spec, opts, on_phase)
        try:
            rec = w.wait()
        finally:
            w.close()
        if spec.model is None:     # a kernel shape is what was asked for: no smaller retry
            break
        batch = spec.model.batch_size
        nxt = decay_batch(batch)
        if rec.status != "oom" or not opts.retry_oom or nxt < max(1, opts.min_batch):
            break
        failed.append(batch)
        on_phase(f"oom at batch {batch}, retrying with {nxt}")
        spec = spec.with_model(batch_size=nxt)
    if failed:
        rec = rec.replace(extra={**rec.extra, "oom_failed_batch_sizes": failed,
                                 "requested_batch_size": failed[0]})
    return rec


class _Cell:
    """One cell's worker processes and, with --repeat, the compile cache they share: the first
    process compiles cold (the cell's compile_s), the others measure the same compiled code
    without paying inductor's cold compile again (minutes per process on a 2-core CPU)."""

    def __init__(self, spec: CellSpec, opts: RunOptions, on_phase: Callable[[str], None]):
        self.cache = None
        if opts.repeat > 1 and not opts.warm_cache:
            self.cache = tempfile.TemporaryDirectory(prefix="fusebench-cache-")
            opts = dataclasses.replace(opts, cache_dir=Path(self.cache.name))
        # run_one looked up per call: tests replace it
        self.series = ProcessSeries(spec, opts.repeat, lambda s: run_one(s, opts, on_phase),
                                    opts.wait_idle, cold_first=self.cache is not None)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.cleanup()
            self.cache = None


def measure_cell(spec: CellSpec, opts: RunOptions, on_phase: Callable[[str], None]) -> Record:
    """One cell by opts.repeat processes in a row."""
    cell = _Cell(spec, opts, on_phase)
    try:
        return cell.series.run(on_phase)
    finally:
        cell.close()


def run_cells(specs: list[CellSpec], writer=None, *, opts: RunOptions = RunOptions(),
              show_progress: bool = True, console=None,
              on_record: Callable[[Record], None] | None = None,
              notes: list[dict] | None = None) -> list[Record]:
    """Run every cell, its processes in the order of run/schedule.py. Each complete record is
    appended to `writer` at once (so an interrupted run keeps what finished; a cell
    interrupted between two of its processes is kept with the processes it had, marked
    extra.processes_done); KeyboardInterrupt propagates after the running worker's process
    group is killed. notes[i]: facts the coordinator adds to cell i's extra (why its batch
    was chosen)."""
    from fusebench.run.progress import CellProgress, outcome
    from fusebench.run.schedule import rounds
    records: list[Record] = []
    done: set[int] = set()
    with CellProgress(len(specs), enabled=show_progress, console=console) as progress:
        cells = [_Cell(s, opts, progress.phase) for s in specs]

        def finish(i: int, why: str = "") -> None:
            done.add(i)
            cells[i].close()
            rec = cells[i].series.record()
            if notes and notes[i]:
                rec = rec.replace(extra={**rec.extra, **notes[i]})
            records.append(rec)
            progress.start(i, specs[i].label())     # interleaved: not the cell started last
            progress.done(outcome(rec) + why)
            if writer is not None:
                writer.append(rec)
            if on_record:
                on_record(rec)
        try:
            for batch in rounds(len(specs), opts.repeat, opts.interleave):
                for i in batch:
                    if not cells[i].series.finished:
                        progress.start(i, specs[i].label())
                        cells[i].series.step(progress.phase)
                for i in sorted(set(batch)):
                    if i not in done and cells[i].series.finished:
                        finish(i)
        except KeyboardInterrupt:
            for i, c in enumerate(cells):     # processes that finished are not thrown away
                if i not in done and c.series.records:
                    n = len(c.series.records)
                    finish(i, "" if c.series.finished else
                           f" (interrupted: {n} of {opts.repeat} processes)")
            raise
        finally:
            for c in cells:
                c.close()
    return records
