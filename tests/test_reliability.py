"""Reliability: a fault costs one cell, nothing finished is lost, failures come with a repro.

Faults are planted by test-only modes (tests/assets/fault_modes.py, tests/assets/more_faults.py)
loaded into the CLI and every worker through FUSEBENCH_PLUGINS. Real processes, real signals.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from fusebench.results.document import ResultsWriter, load, save
from fusebench.spec import Correctness, ErrorInfo, Record
from tests.helpers import ALL_FAULT_PLUGINS, ASSETS, TINY, tiny_spec

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ALL_FAULT_PLUGINS
FAULTS_INJECTED: set[str] = set()     # fault kinds this file plants (for the note)


# ------------------------------------------------------------------------ atomic results file
def _doc(n: int) -> dict:
    recs = [Record(tiny_spec(batch_size=i + 1), "ok") for i in range(n)]
    return {"schema": "fusebench/2", "created": "x", "command": [], "env": {},
            "records": [r.to_dict() for r in recs]}


@pytest.mark.parametrize("fails", ["os.replace", "os.fsync"])
def test_crash_mid_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch, fails):
    path = tmp_path / "r.json"
    save(_doc(1), path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device (planted)")
    monkeypatch.setattr(fails, boom)
    with pytest.raises(OSError, match="planted"):
        save(_doc(2), path)
    writer = ResultsWriter(path, {})
    with pytest.raises(OSError, match="planted"):
        writer.append(Record(tiny_spec(), "ok"))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert len(load(path)["records"]) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]       # no temp file left
    FAULTS_INJECTED.add(f"crash mid-write ({fails} fails)")


def test_sigkill_during_writes_never_leaves_a_corrupt_file(tmp_path):
    """A real process rewriting a few-hundred-KB document in a loop is SIGKILLed at odd moments: the file
    always loads (old or new version)."""
    path = tmp_path / "r.json"
    save(_doc(1), path)
    code = ("import sys\nfrom fusebench.results.document import save\n"
            "from tests.test_reliability import _doc\n"
            "i = 0\n"
            "while True:\n"
            "    save(_doc(300 + 200 * (i % 3)), sys.argv[1]); i += 1\n")
    for delay in (0.9, 1.3, 1.7):
        p = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(delay)
        p.kill()
        p.wait(10)
        assert load(path)["records"]                    # valid JSON, valid schema
    FAULTS_INJECTED.add("SIGKILL during an atomic write")


# ------------------------------------------------------------------------ CLI runs we interrupt
def _terminal_signals() -> None:
    """In the child before exec: SIGINT as a terminal gives it. A suite started in the
    background by a non-interactive shell (`cmd &`) inherits SIGINT ignored, and Python then
    never turns it into KeyboardInterrupt: the Ctrl-C case would test the launcher, not us."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CliRun:
    """`python -m fusebench run` in a real subprocess whose 2nd cell hangs in its first call."""

    def __init__(self, tmp: Path, name: str):
        self.out = tmp / name
        self.log_out, self.log_err = tmp / f"{name}.stdout", tmp / f"{name}.stderr"
        env = {**os.environ, "FUSEBENCH_PLUGINS": PLUGINS, "PYTHONPATH": str(ROOT),
               "COLUMNS": "200"}
        with open(self.log_out, "w") as o, open(self.log_err, "w") as e:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fusebench", "run", TINY, "-m", "eager,test_hang_call",
                 "-b", "2", "--warmup", "1", "--steps", "2", "--no-check", "--timeout", "600",
                 "--out", str(self.out)], cwd=tmp, env=env, stdout=o, stderr=e,
                preexec_fn=_terminal_signals)
        self.workers: dict[int, psutil.Process] = {}

    def poll(self) -> bool:
        """True once the first cell is saved and the hanging 2nd cell's worker is running."""
        assert self.proc.poll() is None, self.log_err.read_text()[-3000:]
        running_cell = False
        try:
            for c in psutil.Process(self.proc.pid).children(recursive=True):
                cmd = " ".join(c.cmdline())
                # a cell runs as `fusebench.cell.worker`, or as a fork of the fork server (same
                # cmdline as its parent); the server itself must not outlive the run either
                if "fusebench.cell.worker" in cmd or "fusebench.run.forkserver" in cmd:
                    self.workers[c.pid] = c
                    running_cell |= "fusebench.cell.worker" in cmd or \
                        "fusebench.run.forkserver" in " ".join(c.parent().cmdline())
        except psutil.Error:
            pass
        return self.saved() == 1 and running_cell   # 1st saved, 2nd running

    def saved(self) -> int:
        docs = list(self.out.glob("*.json")) if self.out.is_dir() else []
        # the run claims its file (empty, run/output.py) before it writes the first document
        return len(load(docs[0])["records"]) if docs and docs[0].stat().st_size else 0

    def doc(self) -> dict:
        (path,) = self.out.glob("*.json")
        return load(path)

    def alive_workers(self) -> list[int]:
        return [pid for pid, p in self.workers.items()
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]

    def cleanup(self) -> None:
        for p in [self.proc.pid, *self.workers]:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _wait_all(runs: list[CliRun], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    ready = set()
    while len(ready) < len(runs):
        assert time.monotonic() < deadline, [r.log_err.read_text()[-2000:] for r in runs]
        ready |= {i for i, r in enumerate(runs) if i not in ready and r.poll()}
        time.sleep(0.3)


def _assert_stopped_like_ctrl_c(run: CliRun, rc: int, word: str) -> None:
    assert run.proc.wait(60) == rc
    # the finished cell is in a valid document, the table so far is printed
    doc = run.doc()
    assert [(r["spec"]["mode"], r["status"]) for r in doc["records"]] == [("eager", "ok")]
    out = run.log_out.read_text()
    assert "fusebench run" in out and "eager" in out
    assert f"{word}: 1 of 2 cells finished and saved" in out
    assert "Traceback" not in run.log_err.read_text()
    # ... and the running worker was terminated with its process group: no orphan
    assert run.workers
    deadline = time.monotonic() + 20         # the fork server exits with its runner
    while run.alive_workers() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not any("fusebench" in " ".join(p.cmdline())
                   for p in psutil.process_iter() if p.pid in run.workers
                   and p.status() != psutil.STATUS_ZOMBIE)


def test_ctrl_c_sigterm_and_sigkill_keep_finished_cells_and_leave_no_orphans(tmp_path):
    """Three real runs side by side (import torch costs seconds): one gets Ctrl-C (SIGINT), one
    SIGTERM (a scheduler's time limit), one SIGKILL, all while their 2nd cell hangs."""
    runs = intr, term, killed = [CliRun(tmp_path, n) for n in ("intr", "term", "killed")]
    try:
        _wait_all(runs)
        os.kill(intr.proc.pid, signal.SIGINT)
        os.kill(term.proc.pid, signal.SIGTERM)
        os.kill(killed.proc.pid, signal.SIGKILL)
        _assert_stopped_like_ctrl_c(intr, 130, "interrupted")
        _assert_stopped_like_ctrl_c(term, 143, "terminated")
        assert killed.proc.wait(60) == -signal.SIGKILL

        # SIGKILL: nothing can run in the coordinator, yet the finished cell is on disk
        doc = killed.doc()
        assert [(r["spec"]["mode"], r["status"]) for r in doc["records"]] == [("eager", "ok")]
        # the orphaned worker notices its parent is gone and takes its group down
        deadline = time.monotonic() + 20
        while killed.alive_workers() and time.monotonic() < deadline:
            time.sleep(0.3)
        assert killed.alive_workers() == []
    finally:
        for r in runs:
            r.cleanup()
    FAULTS_INJECTED.update({"Ctrl-C (SIGINT) mid-run", "SIGTERM mid-run",
                            "SIGKILL of the coordinator", "hang in a step call"})


# ------------------------------------------------------------------------ crashes in compile
def test_crash_only_in_compile_costs_one_cell_each(tmp_path, all_fault_modes):
    """A real SIGSEGV and a SIGABRT while the model is being compiled (only when the options
    say so), an illegal-memory-access error (never retried): every cell is recorded, saved, and
    the failing ones get repro scripts through the real session path."""
    from fusebench.run.session import execute
    inductor, eager_backend = (("compile_backend", "inductor"),), (("compile_backend", "eager"),)
    specs = [tiny_spec(mode="test_segv_compile", mode_options=inductor),
             tiny_spec(mode="test_segv_compile", mode_options=eager_backend),
             tiny_spec(mode="test_abort_compile"),
             tiny_spec(mode="test_illegal_access", batch_size=6)]
    rc = execute(specs, stem="faults", out=tmp_path, save=True, json_out=False)
    assert rc == 1
    (path,) = tmp_path.glob("faults-*.json")
    recs = [Record.from_dict(r) for r in load(path)["records"]]
    assert len(recs) == 4                                       # nothing lost
    segv, fine, abort, illegal = recs
    assert segv.status == "crashed" and segv.extra["signal"] == "SIGSEGV"
    assert segv.extra["exit_code"] == -signal.SIGSEGV and "stderr_tail" in segv.extra
    assert fine.status == "ok"                                  # same mode, other options
    assert abort.status == "crashed" and abort.extra["signal"] == "SIGABRT"
    # the device is gone after an illegal access: an error, never an OOM retry
    assert illegal.status == "error" and illegal.spec.model.batch_size == 6
    assert "illegal memory access" in illegal.error.message
    assert "oom_failed_batch_sizes" not in illegal.extra
    # repro scripts for the failures, and the records point at them
    for r in (segv, abort, illegal):
        assert Path(r.extra["repro"]).is_file(), r.extra
        assert Path(r.extra["repro"]).parent == tmp_path
    assert "repro" not in fine.extra
    assert len({r.extra["repro"] for r in (segv, abort, illegal)}) == 3
    FAULTS_INJECTED.update({"SIGSEGV in compile", "SIGABRT in compile",
                            "illegal memory access (no retry)"})


# ------------------------------------------------------------------------ repro scripts
def _failing_records():
    mism = tiny_spec(mode="test_wrong_output", warmup=1, steps=2, batch_size=2)
    err = tiny_spec(mode="test_raise_step")
    segv = tiny_spec(mode="test_segv_compile", mode_options=(("compile_backend", "inductor"),))
    return [
        Record(tiny_spec(), "ok"),
        Record(mism, "mismatch",
               correctness=Correctness(False, 0.01, 0.01, ("first",), "planted")),
        Record(mism.with_model(batch_size=3), "mismatch"),
        Record(err, "error", error=ErrorInfo("RuntimeError", "planted")),
        Record(segv, "crashed", error=ErrorInfo("Crashed", "signal SIGSEGV"),
               extra={"signal": "SIGSEGV", "exit_code": -11}),
    ]


def test_repro_scripts_are_written_named_and_pointed_at(tmp_path, monkeypatch):
    from fusebench.run.repro import write_repros
    monkeypatch.setenv("FUSEBENCH_PLUGINS", PLUGINS)
    path = tmp_path / "run.json"
    writer = ResultsWriter(path, {})
    for r in _failing_records():
        writer.append(r)
    written = write_repros(writer, path)
    names = sorted(p.name for p in written)
    assert names == ["repro_tiny_models_tiny_cnn_test_raise_step.py",
                     "repro_tiny_models_tiny_cnn_test_segv_compile.py",
                     "repro_tiny_models_tiny_cnn_test_wrong_output_train_b2.py",
                     "repro_tiny_models_tiny_cnn_test_wrong_output_train_b3.py"]
    doc = load(path)                                # re-saved atomically, still valid
    assert [bool(r["extra"].get("repro")) for r in doc["records"]] == [False, True, True, True,
                                                                        True]
    assert not list(tmp_path.glob(".*.tmp"))
    # a second results document in the same folder does not overwrite these scripts
    other = ResultsWriter(tmp_path / "other.json", {})
    other.append(_failing_records()[3])
    (p2,) = write_repros(other, tmp_path / "other.json")
    assert p2.name == "repro_tiny_models_tiny_cnn_test_raise_step-2.py"
    # the script is plain Python embedding the spec as JSON
    text = (tmp_path / names[0]).read_text()
    compile(text, names[0], "exec")
    assert '"mode": "test_raise_step"' in text and str(ASSETS / "more_faults.py") in text


def test_repro_scripts_reproduce_planted_failures_with_plain_python(tmp_path, monkeypatch):
    """Mismatch, error and segfault: each script, run with plain `python` from another folder
    and without FUSEBENCH_PLUGINS set, fails the same way."""
    from fusebench.run.repro import write_repros
    monkeypatch.setenv("FUSEBENCH_PLUGINS", PLUGINS)
    writer = ResultsWriter(tmp_path / "run.json", {})
    recs = _failing_records()
    for r in (recs[1], recs[3], recs[4]):
        writer.append(r)
    mism, err, segv = write_repros(writer, tmp_path / "run.json")
    env = {k: v for k, v in os.environ.items() if k != "FUSEBENCH_PLUGINS"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    procs = {p: subprocess.Popen([sys.executable, str(p)], cwd=elsewhere, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for p in (mism, err, segv)}
    res = {p: (q.communicate(timeout=240), q.returncode) for p, q in procs.items()}
    (out, errtxt), rc = res[mism]
    assert rc == 1, errtxt[-2000:]
    assert "REPRODUCED: status mismatch" in out and "output rel err" in out
    (out, errtxt), rc = res[err]
    assert rc == 1 and "REPRODUCED: status error" in out
    assert "planted: lowering failed" in out + errtxt and "Traceback" in errtxt
    (out, errtxt), rc = res[segv]
    assert rc == -signal.SIGSEGV, (rc, errtxt[-2000:])
    assert "Segmentation fault" in errtxt and "more_faults.py" in errtxt   # faulthandler
    FAULTS_INJECTED.update({"wrong output (mismatch)", "exception in a step"})


# ------------------------------------------------------------------------ kernel cells
def test_crashed_and_timed_out_kernel_cells_keep_their_identity(tmp_path):
    """A kernel impl that kills its worker or hangs: the runner's record (the worker wrote none)
    still names family, impl, shape and direction, in the saved document and the table (#14.6)."""
    from rich.console import Console

    from fusebench.render.kernel_table import kernel_table
    from fusebench.run.runner import run_one
    from fusebench.spec import CellSpec
    f = tmp_path / "bad_impls.py"
    f.write_text("import os, signal, time\n\ndef dies(x, weight, bias, eps):\n"
                 "    os.kill(os.getpid(), signal.SIGKILL)\n\n"
                 "def hangs(x, weight, bias, eps):\n    time.sleep(600)\n")
    common = dict(device="cpu", warmup=1, steps=2, threads=1)
    specs = [CellSpec.for_kernel("ln2d", f"{f}:dies", (2, 5, 6, 7), direction="fwd",
                                 timeout=120.0, **common),
             CellSpec.for_kernel("ln2d", f"{f}:hangs", (3, 4, 5, 6), direction="bwd",
                                 timeout=10.0, **common)]
    path = tmp_path / "k.json"
    writer = ResultsWriter(path, {})
    for spec in specs:
        writer.append(run_one(spec))
    recs = [Record.from_dict(d) for d in load(path)["records"]]
    assert [r.status for r in recs] == ["crashed", "timeout"], [r.error for r in recs]
    for rec, spec in zip(recs, specs):
        assert rec.spec.kernel == spec.kernel          # family, impl, shape, direction
    console = Console(record=True, width=250)
    console.print(kernel_table(recs, wide=True))
    text = console.export_text()
    for want in ("dies", "hangs", "2x5x6x7", "3x4x5x6", "fwd", "bwd", "crashed", "timeout"):
        assert want in text, text
    assert "?" not in text, text
    FAULTS_INJECTED.update({"kernel impl kills its worker", "kernel impl hangs (timeout)"})


def test_user_code_that_hangs_or_exits_at_import_leaves_nothing_behind(tmp_path):
    """Real CLI processes: a model file that hangs at import (and starts a child first) is
    killed with its whole probe at the limit; one that exits is one line too. Exit 2, stdout
    empty under --json, no process left."""
    hang = tmp_path / "hang.py"
    hang.write_text("import subprocess, sys\n"
                    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                    "while True:\n    pass\n\ndef make():\n    pass\n")
    leave = tmp_path / "leave.py"
    leave.write_text("import os\nos._exit(0)\n\ndef make():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FUSEBENCH_PROBE_TIMEOUT": "8"}
    procs = [subprocess.Popen([sys.executable, "-m", "fusebench", "run", f"{f}:make", "--json",
                               "--out", str(tmp_path / "out")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for f in (hang, leave)]
    for p, says in zip(procs, ("did not finish within 8 s", "ended the probe process")):
        out, err = p.communicate(timeout=180)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert p.returncode == 2 and out == "", (p.returncode, out, err)
        assert len(lines) == 1 and says in lines[0], err
    left = [q for q in psutil.process_iter(["cmdline"])
            if "time.sleep(600)" in " ".join(q.info["cmdline"] or [])]
    assert not left, left
    assert not (tmp_path / "out").exists()
    FAULTS_INJECTED.update({"user code hangs at import (probe killed)",
                            "user code exits at import"})


def test_fault_kinds_injected(capsys):
    with capsys.disabled():
        print(f"\n[reliability] fault kinds injected here: {len(FAULTS_INJECTED)}: "
              f"{sorted(FAULTS_INJECTED)}")


# ------------------------------------------------------------- processes a model starts
def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize("forkserver", ["1", "0"], ids=["forkserver", "plain"])
@pytest.mark.parametrize("hang", [False, True], ids=["finishes", "timeout-kill"])
def test_processes_a_model_starts_end_with_its_cell(tmp_path, monkeypatch, forkserver, hang):
    """Same group, new session (setsid) and a re-parented orphan: none outlives the cell,
    whether the worker finishes or is killed at its timeout."""
    from fusebench.run.runner import run_one
    from tests.helpers import SPAWNING
    pid_file = tmp_path / "pids.txt"
    monkeypatch.setenv("FUSEBENCH_TEST_PIDS", str(pid_file))
    monkeypatch.setenv("FUSEBENCH_FORKSERVER", forkserver)
    if hang:
        monkeypatch.setenv("FUSEBENCH_TEST_HANG", "1")
    spec = tiny_spec(model=SPAWNING, check=False, timeout=20.0 if hang else 120.0)
    pids: list[int] = []
    try:
        rec = run_one(spec)
        assert rec.status == ("timeout" if hang else "ok"), rec.error
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids) == 3
        assert [p for p in pids if _alive(p)] == []
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    FAULTS_INJECTED.add("a model that starts processes (same group, setsid, orphan)")
