"""Is somebody else using the machine while we time? CPU time of other processes, steal and
load average over a window, so a busy machine shows in the numbers instead of hiding in them.

On these 2-core machines another process on the second core made a 2-thread OpenMP step 5-60x
slower: a table from such a run looks plausible and is wrong. The worker opens a window around
its timed steps; the record keeps what the window saw, and a `contention` event marks the cell
when others took more than CONTENDED of the cores the worker used.

    with CpuWindow() as w:
        ... timed steps ...
    fields = w.result(threads=torch.get_num_threads())
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psutil

CONTENDED = 0.10     # others' CPU / (wall x worker cores) above this marks the cell
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSnapshot:
    t: float            # monotonic seconds
    busy: float         # CPU-seconds of every process on the machine (not idle/iowait/steal)
    steal: float        # CPU-seconds the hypervisor gave to other guests
    own: float          # CPU-seconds of this process and its waited-for children

    @classmethod
    def take(cls) -> "CpuSnapshot":
        busy, steal = _proc_stat()
        ct = psutil.Process().cpu_times()
        own = ct.user + ct.system + ct.children_user + ct.children_system
        return cls(time.monotonic(), busy, steal, own)


def _proc_stat() -> tuple[float, float]:
    """(busy, steal) CPU-seconds since boot from /proc/stat's aggregate line."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        t = psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0), getattr(t, "steal", 0.0)
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    # guest time is already inside user/nice
    return (user + nice + system + irq + softirq) / _TICK, steal / _TICK


def contention_fields(a: CpuSnapshot, b: CpuSnapshot, threads: int) -> dict[str, Any]:
    """What a window saw, relative to the cores the worker could use."""
    wall = max(b.t - a.t, 1e-9)
    ncpu = os.cpu_count() or 1
    cores = max(1, min(threads, ncpu))
    others = max(0.0, (b.busy - a.busy) - (b.own - a.own))
    return {"window_s": wall, "worker_cores": cores, "cpu_count": ncpu,
            "others_cpu_s": others, "others_frac": others / (wall * cores),
            "steal_frac": max(0.0, b.steal - a.steal) / (wall * ncpu),
            "load1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


class CpuWindow:
    """Context manager around the timed steps; `result(threads)` after it closed."""

    def __enter__(self) -> "CpuWindow":
        self._a = CpuSnapshot.take()
        self._b: CpuSnapshot | None = None
        return self

    def __exit__(self, *exc) -> None:
        self._b = CpuSnapshot.take()

    def result(self, threads: int) -> dict[str, Any] | None:
        return contention_fields(self._a, self._b, threads) if self._b else None


def is_contended(fields: dict[str, Any] | None) -> bool:
    return bool(fields) and (fields["others_frac"] > CONTENDED
                             or fields["steal_frac"] > CONTENDED
                             or gpu_shared(fields.get("gpu_processes")))


def describe(fields: dict[str, Any]) -> str:
    load = fields.get("load1")
    text = (f"other processes used {fields['others_frac']:.0%} of the worker's "
            f"{fields['worker_cores']} core(s) while it was timed (steal "
            f"{fields['steal_frac']:.0%}, load {'?' if load is None else f'{load:.2f}'})")
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
    b = CpuSnapshot.take()
    ncpu = os.cpu_count() or 1
    wall = max(b.t - a.t, 1e-9)
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    # /proc/stat counts in jiffies read at slightly different instants than our clock: the
    # fraction can come out a little above 1 on a saturated machine, which means "all of it"
    busy = max(0.0, (b.busy - a.busy) - (b.own - a.own)) / (wall * ncpu)
    return {"busy_frac": min(1.0, busy),
            "steal_frac": max(0.0, b.steal - a.steal) / (wall * ncpu),
            "load1": load[0], "load5": load[1], "load15": load[2], "cpu_count": ncpu}


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
