"""Why a worker ended without a record: the words of a `crashed` record (run/runner.py).

A SIGKILL has three usual senders, told apart here: the fork server dying under its child (the
child's watch thread then ends it: cell/worker.py), the kernel's OOM killer (counted in
/proc/vmstat `oom_kill`, memory cgroups included), or another process. Only the second is called
the OOM killer, and only as a question unless the counter moved while the cell ran."""
from __future__ import annotations

import signal

VMSTAT = "/proc/vmstat"


def oom_kills(path: str = VMSTAT) -> int | None:
    """The kernel's count of OOM-killer kills since boot; None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def crash_message(rc: int, oom_before: int | None, server_lost: str | None = None,
                  oom_now: int | None = None) -> str:
    """One line for a worker that ended with exit status `rc` (negative: a signal) and no
    record. server_lost: why its fork server is gone, when it died under the cell."""
    if server_lost:
        return (f"fork server died ({server_lost}) while this cell ran, and its worker ended "
                f"with it; the next cell starts a new fork server")
    if rc >= 0:
        return f"worker exited with code {rc} without a record"
    msg = f"worker killed by signal {signal_name(-rc)}"
    if -rc != signal.SIGKILL:
        return msg
    now = oom_kills() if oom_now is None else oom_now
    if oom_before is None or now is None:
        return msg + " (OOM killer?)"
    if now > oom_before:
        return msg + (f" (OOM killer: the kernel's oom_kill count rose by {now - oom_before} "
                      f"while the cell ran)")
    return msg + " (not the OOM killer: the kernel's oom_kill count did not move; another " \
                 "process sent it)"


def exit_description(rc: int | None) -> str:
    """'killed by signal SIGKILL' / 'exit code 3' / 'exit status unknown'."""
    if rc is None:
        return "exit status unknown"
    return f"killed by signal {signal_name(-rc)}" if rc < 0 else f"exit code {rc}"
