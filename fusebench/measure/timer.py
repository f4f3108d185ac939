"""Per-step timing. CUDA events on GPU (device time, no host sync inside the loop); on CPU a
perf_counter around work that is synchronous by construction.

How many timed steps: a fixed count (--steps), or calibrated from a time budget per cell the
way pyperf and torch.utils.benchmark's adaptive_autorange size their loops: time a few steps
(the warm-up), then run clamp(budget / step time, MIN_STEPS, MAX_STEPS) steps."""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

MIN_STEPS = 5        # fewer samples make the median and IQR meaningless
MAX_STEPS = 200      # enough samples for any statistic we report; bounds a tiny step's cell
TIME_CAP = 3.0       # a timed part running past this many budgets (steps got slower: a busy
                     # machine) stops once MIN_STEPS samples are in

# on_step(done, ms): after each step; ms is None where the time is not known yet (CUDA events)
OnStep = Callable[[int, "float | None"], None]
Clock = Callable[[], float]


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device: str | torch.device) -> None:
    if _is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def time_steps(step: Callable[[], object], n: int, device: str | torch.device, *,
               on_step: OnStep | None = None, stop: Callable[[int], bool] | None = None,
               clock: Clock = time.perf_counter) -> list[float]:
    """Run `step` n times; return each step's time in milliseconds. `stop(done)` ends the loop
    early (CPU only: a CUDA loop does not sync per step, so its host time means little)."""
    if n < 1:
        raise ValueError("n must be >= 1")
    if _is_cuda(device):
        return _time_cuda(step, n, torch.device(device), on_step)
    out = []
    for i in range(n):
        t0 = clock()
        step()
        out.append((clock() - t0) * 1e3)
        if on_step is not None:
            on_step(i + 1, out[-1])
        if stop is not None and stop(i + 1):
            break
    return out


def _time_cuda(step, n: int, device: torch.device, on_step: OnStep | None = None) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize(device)
    with torch.cuda.device(device):
        for i, (s, e) in enumerate(zip(starts, ends)):
            s.record()
            step()
            e.record()
            if on_step is not None:
                on_step(i + 1, None)
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_call(fn: Callable[[], object], device: str | torch.device) -> tuple[float, object]:
    """Wall seconds of one synchronised call (first-call / compile cost) and its result."""
    synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    synchronize(device)
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------- how many timed steps

@dataclass(frozen=True)
class StepCount:
    """The number of timed steps a cell ran, and where it came from (kept in the record)."""
    steps: int                          # timed steps planned
    source: str                         # "steps": --steps given | "budget": calibrated
    budget_s: float | None = None
    calibrated_on: str | None = None    # "warmup" | "first timed steps"
    step_ms: float | None = None        # the step time the count was derived from
    calibration_n: int = 0              # how many steps that estimate came from
    done: int | None = None             # steps actually timed (< steps: stopped at TIME_CAP)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.source != "budget":
            return f"{self.steps} timed steps (--steps)"
        return (f"{self.steps} timed steps: budget {self.budget_s:g} s / {self.step_ms:.0f} ms "
                f"per step (median of {self.calibration_n} {self.calibrated_on} steps)")


def estimate_step_ms(samples_ms: list[float]) -> float:
    """The step time to plan with: the median, leaving out the first step when there are 3 or
    more (right after compile it pays one-off costs: allocator growth, lazy inits)."""
    xs = list(samples_ms[1:] if len(samples_ms) >= 3 else samples_ms)
    return statistics.median(xs)


def calibrate_steps(samples_ms: list[float], budget_s: float, min_steps: int = MIN_STEPS,
                    max_steps: int = MAX_STEPS) -> int:
    """clamp(budget / step time, min_steps, max_steps)."""
    if not samples_ms:
        raise ValueError("calibration needs at least one step time")
    ms = max(estimate_step_ms(samples_ms), 1e-6)
    return max(min_steps, min(max_steps, math.floor(budget_s * 1e3 / ms + 1e-6)))


def time_budgeted(step: Callable[[], object], device, *, budget_s: float | None,
                  steps: int, warm_ms: list[float], on_step: OnStep | None = None,
                  on_total: Callable[[int], None] | None = None,
                  clock: Clock = time.perf_counter) -> tuple[list[float], StepCount]:
    """The timed part of a cell: `steps` steps when budget_s is None, else a count calibrated
    from the warm-up step times (or, with no warm-up, from the first MIN_STEPS timed steps,
    which are kept as samples), at most `steps`. on_total(n) is told the planned count once it
    is known."""
    tell = on_total or (lambda n: None)
    if budget_s is None:
        tell(steps)
        out = time_steps(step, steps, device, on_step=on_step, clock=clock)
        return out, StepCount(steps, "steps", done=len(out))
    least = min(MIN_STEPS, steps)
    first: list[float] = []
    if warm_ms:
        basis, where = warm_ms, "warmup"
    else:                                     # nothing to calibrate from yet: time a few first
        tell(least)
        first = time_steps(step, least, device, on_step=on_step, clock=clock)
        basis, where = first, "first timed"
    n = calibrate_steps(basis, budget_s, least, steps)
    count = StepCount(n, "budget", budget_s, where, estimate_step_ms(basis), len(basis))
    tell(n)
    t0, cap = clock(), TIME_CAP * budget_s

    def shifted(i, ms):
        if on_step is not None:
            on_step(len(first) + i, ms)
    rest = n - len(first)
    more = (time_steps(step, rest, device, on_step=shifted, clock=clock,
                       stop=lambda i: len(first) + i >= least and clock() - t0 > cap)
            if rest > 0 else [])
    out = first + more
    return out, StepCount(**{**count.to_dict(), "done": len(out)})
