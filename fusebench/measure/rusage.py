"""What a window of steps cost this process besides wall time, in counts a busy machine does not
change: page faults, context switches and CPU time (getrusage), per step.

Wall time on a shared 2-core machine drifts 20-75% between runs; these counts do not (a minor
fault is the kernel mapping a page the allocator handed out, whoever else runs). They are how
docs/measurement.md explains the gap to torch.utils.benchmark.Timer (issue 13.6): the same
step, the same counts, in the worker and next to Timer (`benchmarks/timer_gap.py`).

    with UsageWindow() as u:
        ... n timed steps ...
    fields = u.result(n)      # per step: minflt, majflt, nvcsw, nivcsw, cpu_ms (process),
                              # thread_nvcsw, thread_nivcsw (the thread that ran the steps)
"""
from __future__ import annotations

import resource
from dataclasses import dataclass, fields

# RUSAGE_THREAD (Linux): the stepping thread alone, without the worker's helper threads (the
# parent watch wakes once a second) or OpenMP's (their switches are the process's).
_THREAD = getattr(resource, "RUSAGE_THREAD", None)


@dataclass(frozen=True)
class Usage:
    minflt: int         # page faults served without I/O (first touch of a fresh page)
    majflt: int         # page faults that read from disk
    nvcsw: int          # voluntary context switches (waited: I/O, a lock, a futex, sleep)
    nivcsw: int         # involuntary ones (preempted: another runnable thread took the core)
    cpu_s: float        # user + system CPU seconds

    @classmethod
    def take(cls, who: int = resource.RUSAGE_SELF) -> "Usage":
        r = resource.getrusage(who)
        return cls(r.ru_minflt, r.ru_majflt, r.ru_nvcsw, r.ru_nivcsw, r.ru_utime + r.ru_stime)

    def __sub__(self, other: "Usage") -> "Usage":
        return Usage(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


def per_step(d: Usage, n: int, thread: Usage | None = None) -> dict[str, float]:
    """A window's counts divided by its steps (cpu in ms)."""
    n = max(1, n)
    out = {"minflt": d.minflt / n, "majflt": d.majflt / n, "nvcsw": d.nvcsw / n,
           "nivcsw": d.nivcsw / n, "cpu_ms": d.cpu_s * 1e3 / n}
    if thread is not None:
        out |= {"thread_nvcsw": thread.nvcsw / n, "thread_nivcsw": thread.nivcsw / n}
    return out


class UsageWindow:
    """Context manager around n steps; `result(n)` after it closed (None before)."""

    def __enter__(self) -> "UsageWindow":
        self._d: tuple[Usage, Usage | None] | None = None
        self._a = Usage.take(), (Usage.take(_THREAD) if _THREAD is not None else None)
        return self

    def __exit__(self, *exc) -> None:
        proc, thread = Usage.take(), (Usage.take(_THREAD) if _THREAD is not None else None)
        self._d = (proc - self._a[0], thread - self._a[1] if thread is not None else None)

    def result(self, n: int) -> dict[str, float] | None:
        return per_step(self._d[0], n, self._d[1]) if self._d else None
