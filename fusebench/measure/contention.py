"""Is somebody else using the machine while we time? CPU time of other processes, steal and
load average over a window, so a busy machine shows in the numbers instead of hiding in them.

On these 2-core machines another process on the second core made a 2-thread OpenMP step 5-60x
slower: a table from such a run looks plausible and is wrong. The worker opens a window around
its timed steps; the record keeps what the window saw, and a `contention` event marks the cell
when others took more than CONTENDED of the cores the worker used.

    with CpuWindow(hold_for=torch.get_num_threads()) as w:
        ... timed steps ...
    fields = w.result(threads=torch.get_num_threads())
"""
from __future__ import annotations

import math
import os
import resource
import time
from dataclasses import dataclass
from typing import Any

import psutil

CONTENDED = 0.10     # others' CPU / (wall x worker cores) above this marks the cell
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# A window shorter than /proc/stat can resolve is held open (idle, after the timed steps) until
# its resolution is at most half of CONTENDED, but never longer than this.
MAX_HOLD_S = 1.0


@dataclass(frozen=True)
class CpuSnapshot:
    t: float            # monotonic seconds
    idle: float         # CPU-seconds all CPUs spent idle (idle + iowait) since boot
    steal: float        # CPU-seconds the hypervisor gave to other guests
    own: float          # CPU-seconds of this process's threads and its waited-for children
    cpus: int           # CPUs online (those /proc/stat's aggregate line sums)

    @classmethod
    def take(cls) -> "CpuSnapshot":
        t = psutil.cpu_times()
        # own time from the scheduler's nanosecond clock (CLOCK_PROCESS_CPUTIME_ID), not
        # /proc/self/stat's ticks; children (none while steps are timed) through getrusage
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(time.monotonic(), t.idle + getattr(t, "iowait", 0.0),
                   getattr(t, "steal", 0.0), time.process_time() + kids.ru_utime + kids.ru_stime,
                   psutil.cpu_count() or 1)


def resolution_s(cpus: int) -> float:
    """How far others' CPU-seconds over a window may be off: /proc/stat counts each CPU's idle
    time in whole ticks (1/SC_CLK_TCK s), so each CPU's delta is truncated by up to one tick at
    either end. Summed over independent CPUs (each off by a triangular error of variance 1/6
    tick^2) three standard deviations, never more than a tick per CPU. The rest is precise:
    idle time is kept in nanoseconds on tickless kernels, our own from the scheduler's clock.

    The busy counters (user, system) were what this used before: they are sampled at each tick,
    and a 5 ms window of a sub-millisecond model read "other processes 232% of 2 cores" on an
    idle machine."""
    return min(cpus, 3.0 * math.sqrt(cpus / 6.0)) / _TICK


def contention_fields(a: CpuSnapshot, b: CpuSnapshot, threads: int) -> dict[str, Any]:
    """What a window saw, relative to the cores the worker could use. `others_frac` is the
    estimate, `others_frac_min` what it is at least, given the counters' resolution: the
    verdict (is_contended) reads the latter."""
    wall = max(b.t - a.t, 1e-9)
    ncpu = b.cpus
    cores = max(1, min(threads, ncpu))
    steal = max(0.0, b.steal - a.steal)
    # every CPU-second of the window is idle, stolen or busy; busy less ours is the others'
    others = max(0.0, wall * ncpu - (b.idle - a.idle) - steal - (b.own - a.own))
    res = resolution_s(ncpu)
    return {"window_s": wall, "worker_cores": cores, "cpu_count": ncpu,
            "others_cpu_s": others, "others_frac": others / (wall * cores),
            "others_frac_min": max(0.0, others - res) / (wall * cores),
            "resolution_s": res,
            "steal_frac": steal / (wall * ncpu),
            "steal_frac_min": max(0.0, steal - res) / (wall * ncpu),
            "load1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def window_needed_s(threads: int, cpus: int | None = None) -> float:
    """The shortest window whose resolution is at most half of CONTENDED for `threads` cores
    (capped at MAX_HOLD_S): 0.17 s for 2 threads on 2 CPUs."""
    cpus = cpus or psutil.cpu_count() or 1
    cores = max(1, min(threads, cpus))
    return min(MAX_HOLD_S, resolution_s(cpus) / (0.5 * CONTENDED * cores))


class CpuWindow:
    """Context manager around the timed steps; `result(threads)` after it closed. With
    `hold_for` (the worker's thread count) a window too short to resolve CONTENDED stays open,
    idle, after the steps until it can (window_needed_s): it then tells whether the machine was
    busy around the steps, which is what a window of a few milliseconds cannot."""

    def __init__(self, hold_for: int | None = None):
        self.hold_for = hold_for

    def __enter__(self) -> "CpuWindow":
        self._a = CpuSnapshot.take()
        self._b: CpuSnapshot | None = None
        return self

    def __exit__(self, *exc) -> None:
        if self.hold_for is not None and exc[0] is None:
            left = window_needed_s(self.hold_for, self._a.cpus) - (time.monotonic() - self._a.t)
            if left > 0:
                time.sleep(left)
        self._b = CpuSnapshot.take()

    def result(self, threads: int) -> dict[str, Any] | None:
        return contention_fields(self._a, self._b, threads) if self._b else None


def _at_least(fields: dict[str, Any], key: str) -> float:
    """The fraction a window saw at least (records before resolution_s carry the estimate only)."""
    return fields.get(f"{key}_min", fields[key])


def is_contended(fields: dict[str, Any] | None) -> bool:
    return bool(fields) and (_at_least(fields, "others_frac") > CONTENDED
                             or _at_least(fields, "steal_frac") > CONTENDED
                             or gpu_shared(fields.get("gpu_processes")))


def share(fields: dict[str, Any], key: str = "others_frac") -> str:
    """A window's fraction as a reader should take it: "40%", or "40% (at least 25%)" where the
    counters' resolution leaves that much doubt."""
    frac, least = fields[key], _at_least(fields, key)
    return f"{frac:.0%}" + (f" (at least {least:.0%})" if f"{least:.0%}" != f"{frac:.0%}" else "")


def describe(fields: dict[str, Any]) -> str:
    load = fields.get("load1")
    text = (f"other processes used {share(fields)} of the worker's "
            f"{fields['worker_cores']} core(s) while it was timed (steal "
            f"{share(fields, 'steal_frac')}, load {'?' if load is None else f'{load:.2f}'})")
    g = fields.get("gpu_processes")
    if gpu_shared(g):
        pids = ", ".join(str(p["pid"]) for p in g["others"][:4])
        text += f"; other processes on the GPU (pids {pids})"
    return text + ": timings are unreliable"


def current_load(window_s: float = 0.5) -> dict[str, Any]:
    """Machine-wide load now (for `fusebench env` and --wait-idle): busy fraction of all cores
    over a short window, steal, load averages."""
    a = CpuSnapshot.take()
    time.sleep(window_s)
    f = contention_fields(a, CpuSnapshot.take(), threads=a.cpus)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    # counters read at slightly different instants than our clock: on a saturated machine the
    # fraction can come out a little above 1, which means "all of it"
    return {"busy_frac": min(1.0, f["others_frac"]), "steal_frac": f["steal_frac"],
            "load1": load[0], "load5": load[1], "load15": load[2], "cpu_count": f["cpu_count"]}


def wait_until_idle(max_busy: float = CONTENDED, timeout_s: float = 600.0,
                    on_wait=lambda load: None) -> dict[str, Any]:
    """Block until the machine's other load is under `max_busy` of its cores (or timeout);
    returns the last load seen (`waited_s` added)."""
    start = time.monotonic()
    while True:
        load = current_load(1.0)
        load["waited_s"] = time.monotonic() - start
        if load["busy_frac"] <= max_busy or load["waited_s"] >= timeout_s:
            return load
        on_wait(load)


def gpu_other_processes(device_index: int) -> dict[str, Any] | None:
    """Processes on this GPU besides us (NVML), or None without NVML: a second job on the card
    shares its SMs and memory bandwidth just as a second process shares a CPU core.

    {"others": [{"pid", "used_memory"}], "self_listed": bool}. In a container NVML reports the
    host's pids, so our own entry may not match os.getpid(): then one of `others` is us."""
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        procs = (list(pynvml.nvmlDeviceGetComputeRunningProcesses(h))
                 + list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)))
    except Exception:     # no driver / no library / not supported: nothing to say
        return None
    me = os.getpid()
    pids = list(dict.fromkeys(p.pid for p in procs))     # compute + graphics: once each
    used = {p.pid: getattr(p, "usedGpuMemory", None) for p in procs}
    return {"others": [{"pid": pid, "used_memory": used[pid]} for pid in pids if pid != me],
            "self_listed": me in pids}


def gpu_shared(g: Any) -> bool:
    """Another process holds a context on the worker's GPU (see gpu_other_processes)."""
    if not isinstance(g, dict) or not isinstance(g.get("others"), list):
        return False
    return len(g["others"]) > (0 if g.get("self_listed") else 1)
