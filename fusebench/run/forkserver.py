"""A warm parent for worker processes: it imports torch and fusebench once, then forks one fresh
child per cell. Isolation is unchanged (each cell is still its own process, in its own session,
forked from a parent that has only imported modules: no compile, no CUDA init, no op run), but a
cell no longer pays `import torch` and the dynamo import a torch.optim optimizer triggers
(seconds each: docs/figures.md).

Protocol on the server's stdin/stdout, one JSON object per line:
  runner -> server  {"spec": path, "out": path, "stdout": path, "stderr": path, "env": {...}}
  server -> runner  {"pid": N}                 after the fork
  server -> runner  {"pid": N, "rc": code}     when the child has ended (negative: signal)
FUSEBENCH_FORKSERVER=0 turns it off (every cell then starts `python -m fusebench.cell.worker`)."""
from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback

WARM_IMPORTS = ("torch", "torch._dynamo", "torch.utils.flop_counter", "fusebench.cell.worker",
                "fusebench.cell.model_cell", "fusebench.cell.kernel_cell")


def enabled() -> bool:
    return os.environ.get("FUSEBENCH_FORKSERVER", "1") != "0" and hasattr(os, "fork")


# ---------------------------------------------------------------- server (the warm parent)

def _child(req: dict) -> None:
    """In the forked child: become a normal worker process for one cell. Never returns."""
    try:
        os.setsid()                                  # own process group, killable as one
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            new = os.open(path, flags, 0o644)
            os.dup2(new, fd)
            os.close(new)
        os.environ.clear()                           # the runner's environment of now
        os.environ.update(req["env"])
        sys.argv = ["fusebench.cell.worker", req["spec"], req["out"]]
        from fusebench.cell.worker import main
        main(sys.argv)                               # ends with os._exit(0)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(70)


def serve() -> None:
    # The server stays out of the terminal's Ctrl-C: the runner decides what to kill.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import importlib
    for name in WARM_IMPORTS:
        importlib.import_module(name)
    from fusebench.models import list_models
    from fusebench.modes import list_modes
    list_models(), list_modes()
    out = sys.stdout
    reqs: queue.Queue[str | None] = queue.Queue()

    def read_requests():
        for line in sys.stdin:
            reqs.put(line)
        reqs.put(None)                               # EOF: the runner is gone
    threading.Thread(target=read_requests, daemon=True).start()
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    while (line := reqs.get()) is not None:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            try:    # the runner sends nothing while a cell runs, except EOF when it dies
                if reqs.get(timeout=0.05) is None:
                    _kill_group(pid)
                    return
            except queue.Empty:
                continue
        out.write(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


# ---------------------------------------------------------------- client (in the runner)

class _TailLines:
    """Iterate over lines appended to a file until the process is done and the file drained."""

    def __init__(self, path: str, done: threading.Event):
        self.path, self.done = path, done

    def __iter__(self):
        while not os.path.exists(self.path):
            if self.done.is_set():
                return
            time.sleep(0.05)
        with open(self.path, "rb") as f:
            buf = b""
            while True:
                chunk = f.readline()
                if chunk:
                    buf += chunk
                    if buf.endswith(b"\n"):
                        yield buf
                        buf = b""
                    continue
                if self.done.is_set():
                    if buf:
                        yield buf
                    return
                time.sleep(0.1)


class ForkedProcess:
    """The part of subprocess.Popen the runner uses, for a child of the fork server."""

    def __init__(self, pid: int, results: "queue.Queue[int]", stdout: str, stderr: str):
        self.pid = pid
        self.returncode: int | None = None
        self.server_lost: str | None = None          # why the fork server died under it
        self._results = results
        self._done = threading.Event()
        self.stdout = _TailLines(stdout, self._done)
        self.stderr = _TailLines(stderr, self._done)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._results.get(timeout=timeout)
            except queue.Empty:
                raise subprocess.TimeoutExpired("fusebench worker", timeout) from None
            self._done.set()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """Runner-side handle: starts the server lazily, forks cells through it."""

    START_TIMEOUT_S = 120.0

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fusebench.run.forkserver"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="fusebench-forkserver").start()
        msg = self._next(self.START_TIMEOUT_S)
        if not msg or not msg.get("ready"):
            self.close()
            raise RuntimeError("fork server did not start")

    def _read(self) -> None:
        for raw in self.proc.stdout:
            try:
                self._lines.put(json.loads(raw))
            except ValueError:
                continue
        self._lines.put(None)                        # server gone

    def _next(self, timeout: float | None) -> dict | None:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_description(self) -> str:
        """How the server process ended: 'killed by signal SIGKILL', 'exit code 1'."""
        from fusebench.run.killed import exit_description
        try:
            rc = self.proc.wait(2.0)
        except subprocess.TimeoutExpired:
            rc = None       # its stdout closed but it lingers: it is being torn down
        return exit_description(rc)

    def spawn(self, spec_path, out_path, stdout_path, stderr_path, env: dict) -> ForkedProcess:
        req = {"spec": str(spec_path), "out": str(out_path), "stdout": str(stdout_path),
               "stderr": str(stderr_path), "env": env}
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        msg = self._next(30.0)
        if not msg or "pid" not in msg:
            raise RuntimeError("fork server did not fork")
        results: queue.Queue[int] = queue.Queue()
        child = ForkedProcess(msg["pid"], results, str(stdout_path), str(stderr_path))

        def collect():
            end = self._next(None)
            if end and "rc" in end:
                results.put(end["rc"])
                return
            # the server died mid-cell: its child's exit status went with it (the child's watch
            # thread ends it: cell/worker.py); say so, not "killed" as if by the OOM killer
            child.server_lost = self.exit_description()
            results.put(-signal.SIGKILL)
        threading.Thread(target=collect, daemon=True).start()
        return child

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(5.0)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


_server: ForkServer | None = None
_lock = threading.Lock()
atexit.register(lambda: shutdown())


def get_server() -> ForkServer | None:
    """The shared server, started on first use; None if it cannot start (the runner then
    starts plain worker processes)."""
    global _server
    with _lock:
        if _server is not None and not _server.alive():
            _server = None
        if _server is None:
            try:
                _server = ForkServer()
            except (OSError, RuntimeError):
                _server = None
        return _server


def server_pids() -> set[int]:
    """The running server's pid (a child of the runner that must outlive each cell)."""
    s = _server
    return {s.proc.pid} if s is not None and s.alive() else set()


def shutdown() -> None:
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None


if __name__ == "__main__":
    serve()
