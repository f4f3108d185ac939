"""--repeat N and --wait-idle: one cell measured by N independent worker processes, each with its
own build and warm-up, merged into one record (pyperf's model of a measurement).

Why processes and not more steps: on a shared machine whole processes drift (thread placement,
the other tenants, the allocator's layout), while the steps inside one process agree. One
process per cell lets compare see only the within-process spread, so two identical runs were
called "significantly" different in 6 of 7 A/A pairs (issue 13.4). With several processes the
record keeps each process's samples and median (StepStats.process_sizes/process_medians) and
compare resamples processes, then steps (results/stats.speedup_ci_processes).

The merged record: step_ms pools every sample (the table shows the pooled median), throughput
and tflops follow the pooled median, compile_s is the processes' median, peak memory the
largest process's; extra["processes"] keeps what each process measured. A process that fails
makes the cell fail: its record is returned, saying which process it was.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

from fusebench.errors import UsageError
from fusebench.spec import CellSpec, Event, Record, StepStats

MAX_REPEAT = 100
DEFAULT_REPEAT = 3          # compare-grade: three processes resolve ~15-25% on a busy 2-core box
QUICK_REPEAT = 1            # --quick is a smoke run
WAIT_IDLE_CAP_S = 300.0     # --wait-idle gives up (and says so) after this long per process
# extra fields that are work / median step time (model_cell, kernel_cell)
RATES = ("tflops", "gbps", "pct_of_copy")


def resolve_repeat(given: int | None, quick: bool) -> int:
    """--repeat as given, or the default: 1 for --quick smoke runs, else DEFAULT_REPEAT."""
    n = given if given is not None else (QUICK_REPEAT if quick else DEFAULT_REPEAT)
    if not 1 <= n <= MAX_REPEAT:
        raise UsageError(f"--repeat must be between 1 and {MAX_REPEAT}, got {n}")
    return n


def per_process(spec: CellSpec, n: int, k: int = 0) -> CellSpec:
    """Process k of n times budget / n seconds: --repeat costs n builds and warm-ups, not n
    times the timed steps (a fixed --steps count stays per process). Only the first process
    checks correctness (the merged record's check): the others are timing replicas, and a
    float64 reference per process would cost several eager steps each."""
    if n > 1 and spec.budget is not None:
        spec = dataclasses.replace(spec, budget=spec.budget / n)
    if k > 0 and spec.model is not None and spec.model.check:
        spec = spec.with_model(check=False)
    return spec


class ProcessSeries:
    """The n worker processes of one cell, launched one at a time by step(). The runner may run
    other cells' processes between two steps (interleaved rounds, run/schedule.py); record()
    merges what ran. Stops at the first failing process."""

    def __init__(self, spec: CellSpec, n: int, launch: Callable[[CellSpec], Record],
                 wait_idle: bool = False, wait=None, cold_first: bool = False):
        self.spec, self.n, self.launch = spec, n, launch
        self.wait_idle, self.wait, self.cold_first = wait_idle, wait, cold_first
        self.records: list[Record] = []
        self.started: list[float] = []      # each process's start, unix time
        self.waited: list[dict[str, Any]] = []

    @property
    def finished(self) -> bool:
        last = self.records[-1] if self.records else None
        return len(self.records) >= self.n or (
            last is not None and (last.status != "ok" or last.step_ms is None))

    def step(self, on_phase: Callable[[str], None]) -> None:
        """Run the next process."""
        k = len(self.records)
        if self.wait_idle:
            self.waited.append(_wait(on_phase, self.wait))
        if self.n > 1:
            on_phase(f"process {k + 1} of {self.n}")
        self.started.append(round(time.time(), 3))
        self.records.append(self.launch(per_process(self.spec, self.n, k)))

    def run(self, on_phase: Callable[[str], None]) -> Record:
        """Every remaining process in a row, then the merged record."""
        while not self.finished:
            self.step(on_phase)
        return self.record()

    def record(self) -> Record:
        """The merged record of the processes run so far (all n unless interrupted)."""
        out = merge_processes(self.records, self.n, self.cold_first)
        extra = dict(out.extra)
        if out.spec.budget != self.spec.budget:    # the record says the budget the user asked for
            out = out.replace(spec=dataclasses.replace(out.spec, budget=self.spec.budget))
        if self.waited:
            extra["wait_idle"] = self.waited
        if isinstance(extra.get("processes"), list):     # when each ran: were two cells interleaved
            extra["processes"] = [{**p, "started": t}
                                  for p, t in zip(extra["processes"], self.started)]
        if not self.finished:
            extra["processes_done"] = len(self.records)  # interrupted between two rounds
        return out.replace(extra=extra) if extra != out.extra else out


def run_processes(spec: CellSpec, n: int, launch: Callable[[CellSpec], Record],
                  on_phase: Callable[[str], None], wait_idle: bool = False,
                  wait=None, cold_first: bool = False) -> Record:
    """launch() n times in a row (each a fresh worker process) and merge."""
    return ProcessSeries(spec, n, launch, wait_idle, wait, cold_first).run(on_phase)


def _wait(on_phase, wait=None) -> dict[str, Any]:
    from fusebench.measure import contention
    wait = wait or contention.wait_until_idle

    def tell(load):
        on_phase(f"waiting for an idle machine: others use {load['busy_frac']:.0%} of "
                 f"{load['cpu_count']} cores ({load['waited_s']:.0f}/{WAIT_IDLE_CAP_S:.0f} s)")
    load = wait(timeout_s=WAIT_IDLE_CAP_S, on_wait=tell)
    idle = load["busy_frac"] <= contention.CONTENDED
    if not idle:
        on_phase(f"machine still busy after {load['waited_s']:.0f} s "
                 f"({load['busy_frac']:.0%} of its cores): measuring anyway")
    return {"waited_s": load["waited_s"], "busy_frac": load["busy_frac"], "idle": idle}


def _process_summary(r: Record) -> dict[str, Any]:
    c = r.extra.get("contention")
    return {"median_ms": r.step_ms.median if r.step_ms else None, "n": r.step_ms.n
            if r.step_ms else 0, "compile_s": r.compile_s, "peak_mem_bytes": r.peak_mem_bytes,
            "others_frac": c.get("others_frac") if isinstance(c, dict) else None}


# events about one process's timing: judged again on the merged record
_PER_PROCESS = ("noise", "contention")


def _events(records: list[Record], stats: StepStats, worst: Any) -> tuple[Event, ...]:
    """Every process's events once (the same warning recurs in each: the largest count); the
    noise and contention verdicts of the pooled samples and the worst process instead of each
    process's own."""
    from fusebench.measure import contention
    from fusebench.measure.noise import NOISY, noisy_fraction
    seen: dict[tuple, Event] = {}
    frac = noisy_fraction(stats)
    if frac is not None:
        seen[("noise",)] = Event("noise", "fusebench", f"noisy timing: IQR/median = {frac:.0%} "
                                 f"(> {NOISY:.0%}) over {len(records)} processes")
    if worst is not None and contention.is_contended(worst):
        seen[("contention",)] = Event("contention", "fusebench", contention.describe(worst))
    for r in records:
        for e in (e for e in r.events if e.category not in _PER_PROCESS):
            k = (e.category, e.source, e.message)
            if k not in seen or e.count > seen[k].count:
                seen[k] = e
    return tuple(seen.values())


def _worst_contention(records: list[Record]) -> Any:
    cs = [r.extra.get("contention") for r in records]
    cs = [c for c in cs if isinstance(c, dict) and isinstance(c.get("others_frac"), (int, float))]
    # the worst by what its window saw at least (contention.is_contended's reading)
    return max(cs, key=lambda c: c.get("others_frac_min", c["others_frac"])) if cs else None


def merge_processes(records: list[Record], asked: int | None = None,
                    cold_first: bool = False) -> Record:
    """One record from the records of the same cell measured by several processes. cold_first:
    the later processes reused the first one's compile cache, so only the first one's first
    call is the cold compile cost (each process's own stays in extra["processes"])."""
    asked = asked or len(records)
    last = records[-1]
    if len(records) == 1 and asked == 1:
        return last
    if last.status != "ok" or last.step_ms is None:
        note = {"repeat": asked, "failed_process": len(records)}
        return last.replace(extra={**last.extra, **note})
    first = records[0]
    stats = StepStats.from_processes([r.step_ms.samples for r in records])
    extra = {**first.extra, "repeat": asked,
             "processes": [_process_summary(r) for r in records]}
    if cold_first:
        extra["compile_cache"] = "shared: process 1 compiled cold, the others reused its cache"
    worst = _worst_contention(records)
    if worst is not None:
        extra["contention"] = worst
    for k in RATES:      # rates of the first process's median -> of the pooled median
        if isinstance(first.extra.get(k), (int, float)) and stats.median > 0:
            extra[k] = first.extra[k] * first.step_ms.median / stats.median
    compile_s = [r.compile_s for r in (records[:1] if cold_first else records)
                 if r.compile_s is not None]
    peaks = [r.peak_mem_bytes for r in records if r.peak_mem_bytes is not None]
    throughput = (first.spec.samples_per_step * 1000.0 / stats.median
                  if first.throughput is not None and stats.median > 0 else first.throughput)
    return first.replace(step_ms=stats, throughput=throughput,
                         events=_events(records, stats, worst),
                         compile_s=statistics.median(compile_s) if compile_s else None,
                         peak_mem_bytes=max(peaks) if peaks else None, extra=extra)
