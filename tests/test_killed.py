"""A worker that ends without a record: a killed fork server is said to be one, and the OOM
killer is named only when it is plausible (issue 14.7)."""
from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from fusebench.run import forkserver, killed
from fusebench.run.runner import run_cells
from tests.helpers import tiny_spec

SIGKILL = -signal.SIGKILL


@pytest.mark.parametrize("rc, before, now, says", [
    (SIGKILL, None, None, "worker killed by signal SIGKILL (OOM killer?)"),
    (SIGKILL, 3, 4, "(OOM killer: the kernel's oom_kill count rose by 1 while the cell ran)"),
    (SIGKILL, 3, 3, "(not the OOM killer: the kernel's oom_kill count did not move"),
    (-signal.SIGSEGV, 3, 4, "worker killed by signal SIGSEGV"),
    (3, None, None, "worker exited with code 3 without a record"),
])
def test_crash_message(rc, before, now, says):
    msg = killed.crash_message(rc, before, oom_now=now)
    assert says in msg
    if rc != SIGKILL:
        assert "OOM" not in msg


def test_crash_message_of_a_dead_fork_server_never_blames_the_oom_killer():
    msg = killed.crash_message(SIGKILL, 3, "killed by signal SIGKILL", oom_now=9)
    assert msg.startswith("fork server died (killed by signal SIGKILL) while this cell ran")
    assert "OOM" not in msg and "new fork server" in msg


def test_oom_kills_reads_vmstat(tmp_path):
    f = tmp_path / "vmstat"
    f.write_text("nr_free_pages 1\noom_kill 7\n")
    assert killed.oom_kills(str(f)) == 7
    assert killed.oom_kills(str(tmp_path / "absent")) is None


def _server_child(timeout: float = 120.0) -> int:
    """The fork server's pid, once one of its forks (the running cell) exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = forkserver.server_pids()
        for pid in pids:
            try:
                if psutil.Process(pid).children():
                    return pid
            except psutil.Error:
                pass
        time.sleep(0.1)
    raise AssertionError("no cell of the fork server started")


def test_killed_fork_server_is_reported_and_the_run_goes_on(all_fault_modes, monkeypatch):
    monkeypatch.setenv("FUSEBENCH_FORKSERVER", "1")
    forkserver.shutdown()
    killed_pid: list[int] = []

    def kill_server():
        pid = _server_child()
        time.sleep(0.5)                 # the cell is inside its hanging call
        os.kill(pid, signal.SIGKILL)
        killed_pid.append(pid)
    t = threading.Thread(target=kill_server, daemon=True)
    t.start()
    try:
        hang, after = run_cells([tiny_spec(mode="test_hang_call", timeout=120.0),
                                 tiny_spec(mode="eager")], show_progress=False)
    finally:
        t.join(5)
    assert killed_pid, "the fork server was never killed"
    assert hang.status == "crashed"
    assert hang.error.message.startswith(
        "fork server died (killed by signal SIGKILL) while this cell ran"), hang.error.message
    assert "OOM" not in hang.error.message and hang.extra["exit_code"] is None
    # the run goes on through a new fork server
    assert after.status == "ok", after.error
    assert forkserver.server_pids() and killed_pid[0] not in forkserver.server_pids()
