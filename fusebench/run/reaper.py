"""Everything a cell's worker starts ends with the cell.

Killing the worker's process group misses what a model starts in another session (`setsid`,
`start_new_session=True`) and what outlives its parent: on exit those are re-parented to init
and keep running after the run. The coordinator therefore makes itself a child subreaper
(Linux `prctl(PR_SET_CHILD_SUBREAPER)`): orphans of its descendants are re-parented to it, so
after a cell every process that is new among its children (other than the worker itself and the
fork server) is the cell's leftover and is killed with its whole tree."""
from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
import time
from collections.abc import Iterable

import psutil

PR_SET_CHILD_SUBREAPER = 36   # <linux/prctl.h>


@functools.cache
def become_subreaper() -> bool:
    """Once per process; False where the kernel has no such thing (then only process groups
    and the descendants seen alive are cleaned up)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    try:
        return {p.pid for p in psutil.Process().children()}
    except psutil.Error:
        return set()


def descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


class CellProcesses:
    """Tracks the processes of one cell: create before the worker starts, `note(worker)` while
    it may still be alive (before killing it), `end(worker, keep)` once it is gone."""

    def __init__(self):
        become_subreaper()
        self._before = _children()
        self._seen: set[int] = set()

    def note(self, root: int) -> None:
        self._seen |= descendants(root)

    def end(self, root: int, keep: Iterable[int] = ()) -> list[int]:
        """Kill the cell's leftovers (and their trees); returns the pids that were killed."""
        self.note(root)
        spare = {root, os.getpid(), *keep}
        leftovers = (_children() - self._before) | self._seen
        doomed = set()
        for pid in leftovers - spare:
            doomed |= {pid, *descendants(pid)}
        doomed -= spare
        for pid in doomed:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _reap(doomed)
        return sorted(doomed)


def _reap(pids: set[int], timeout: float = 2.0) -> None:
    """Collect the killed processes that are (or become, once their parent dies) our children,
    so none stays a zombie; pids that are not our children are simply skipped."""
    pending, deadline = set(pids), time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                if not psutil.pid_exists(pid) or _is_zombie_elsewhere(pid):
                    pending.discard(pid)
                continue
            if done:
                pending.discard(pid)
        time.sleep(0.02)


def _is_zombie_elsewhere(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() == psutil.STATUS_ZOMBIE and p.ppid() != os.getpid()
    except psutil.Error:
        return True
