"""Why fusebench's medians came out 10-20% above torch.utils.benchmark.Timer's on the same step
(issue 13.6): the same step timed by both, side by side, with what each step cost the process
besides wall time (page faults, context switches, CPU time: counts a busy machine does not
change, measure/rusage.py; and, in the reference process, gc collections).

Rows, interleaved round by round:
  fb/fork      the cell through the real launcher, forked from the fork server: the worker's
               own step times and its extra.rusage (per timed step)
  fb/plain     the same with FUSEBENCH_FORKSERVER=0 (a fresh `python -m fusebench.cell.worker`)
  then one fresh process that builds the cell's step with the worker's own code (model_cell's
  build: same model, inputs, loss, SGD) and times it, alternating A,B,C,A,B,C...:
  same/timer   Timer.blocked_autorange (gc off while timing, as timeit does)
  same/loop    fusebench's loop (measure/timer.time_steps, gc on), as the worker runs it
  same/nogc    the same loop with gc off
  same/timer1  (--threads other than 1) Timer at its default num_threads=1
  each first under glibc's default malloc thresholds (`/default`), then after fusebench's
  pin_malloc (`/pinned`, what a model cell does after its build).

What separates what: same/timer vs same/loop = the timing loop and gc (same process, same
allocator); /default vs /pinned = the allocator; fb/* vs same/loop/pinned = the process
around the step (launcher, fork server state, the coordinator beside it). The `vs timer`
column is the median over rounds of each round's ratio to same/timer/pinned (paired, so a
drift between rounds cancels). On a busy machine the times mean little and the counts still
do: the script prints the load; rerun it on a quiet machine for the times.

    python benchmarks/timer_gap.py [--rounds 5] [--threads 1] [--model convnext_atto] [-q]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REFERENCE = r'''
import gc, json, statistics, sys
import torch
from torch.utils.benchmark import Timer
from fusebench.cell import model_cell
from fusebench.cell.model_step import Step
from fusebench.cell.report import Reporter
from fusebench.cell.worker import set_threads
from fusebench.measure.memory import pin_malloc
from fusebench.measure.rusage import UsageWindow
from fusebench.measure.timer import time_steps
from fusebench.spec import CellSpec
a = json.loads(sys.argv[1])
spec = CellSpec.from_dict(a["spec"])
set_threads(spec.threads)
b = model_cell._build(spec, Reporter.of(lambda p: None))
step = Step(b.model, b.model, b.inputs.args, b.loss, True, b.autocast, b.opt)

def collections():
    return sum(g["collections"] for g in gc.get_stats())

def timer(threads=None):
    calls = [0]
    def counted():
        calls[0] += 1
        step()
    t = Timer("f()", globals={"f": counted},
              num_threads=threads or spec.threads or torch.get_num_threads())
    g0 = collections()
    with UsageWindow() as u:
        m = t.blocked_autorange(min_run_time=a["min_run_time"])
    return m.median * 1e3, {**u.result(calls[0]), "gc": (collections() - g0) / calls[0]}

def loop(gc_on):
    was = gc.isenabled()
    gc.enable() if gc_on else gc.disable()
    g0 = collections()
    with UsageWindow() as u:
        ms = time_steps(step, a["steps"], "cpu")
    gc.enable() if was else gc.disable()
    return statistics.median(ms), {**u.result(len(ms)), "gc": (collections() - g0) / len(ms)}

VARIANTS = {"timer": timer, "loop": lambda: loop(True), "nogc": lambda: loop(False)}
if spec.threads != 1:      # what a Timer left at its defaults measures: num_threads=1
    VARIANTS["timer1"] = lambda: timer(threads=1)
out = {}
for alloc in ("default", "pinned"):
    if alloc == "pinned":
        pin_malloc()
    for _ in range(a["warmup"]):
        step()
    for _ in range(a["inner"]):
        for name, fn in VARIANTS.items():
            out.setdefault(f"same/{name}/{alloc}", []).append(fn())
print(json.dumps(out))
'''

COUNTS = ("cpu_ms", "minflt", "majflt", "thread_nvcsw", "thread_nivcsw", "nvcsw", "nivcsw",
          "gc")
BASE = "same/timer/pinned"


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="convnext_atto")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--img", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1,
                    help="0: fusebench's default (torch's: all cores); adds same/timer1, a "
                         "Timer at its own default num_threads=1")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--inner", type=int, default=2, help="A,B,C repeats inside the reference")
    ap.add_argument("-q", "--quiet", action="store_true", help="the summary only")
    return ap.parse_args()


def _spec(a):
    from fusebench.spec import CellSpec
    return CellSpec.for_model(a.model, "eager", batch_size=a.batch, img_size=a.img,
                              check=False, warmup=a.warmup, steps=a.steps,
                              threads=a.threads or None, seed=0)


def _harness_cpu_s() -> float:
    """CPU seconds of this coordinator and the fork server (what runs beside the worker)."""
    import psutil
    from fusebench.run import forkserver
    total = 0.0
    for pid in {os.getpid(), *forkserver.server_pids()}:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _fusebench(a, fork: bool) -> tuple[float, dict]:
    from fusebench.run.runner import run_one
    os.environ["FUSEBENCH_FORKSERVER"] = "1" if fork else "0"
    if fork:
        from fusebench.run import forkserver
        forkserver.get_server()                # started outside the measured cell
    c0, t0 = _harness_cpu_s(), time.monotonic()
    rec = run_one(_spec(a))
    if rec.status != "ok":
        raise SystemExit(f"fusebench cell failed: {rec.status}: {rec.error}")
    usage = dict(rec.extra.get("rusage") or {})
    # the coordinator's share while the cell ran, per timed step (start-up included: an upper
    # bound on what it took from the steps' cores)
    usage["harness_cpu_ms"] = (_harness_cpu_s() - c0) * 1e3 / max(1, rec.step_ms.n)
    usage["cell_wall_s"] = time.monotonic() - t0
    return rec.step_ms.median, usage


def _reference(a) -> dict[str, list]:
    arg = json.dumps({"spec": _spec(a).to_dict(), "warmup": a.warmup, "steps": a.steps,
                      "inner": a.inner, "min_run_time": 1.0})
    p = subprocess.run([sys.executable, "-c", REFERENCE, arg], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"reference process failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _round(a) -> dict[str, list[tuple[float, dict]]]:
    got = {"fb/fork": [_fusebench(a, True)], "fb/plain": [_fusebench(a, False)]}
    got.update(_reference(a))
    return got


def _summary(rows: dict[str, list[list]], ratios: dict[str, list[float]]) -> None:
    head = f"  {'':18s} {'median ms':>9s} {'vs timer':>8s}" + "".join(
        f" {c.replace('thread_', 't.'):>9s}" for c in COUNTS) + "  (per step; t. = stepping thread)"
    print(head)
    for k, runs in rows.items():
        ms = statistics.median(r[0] for r in runs)
        cols = []
        for c in COUNTS:
            vals = [r[1][c] for r in runs if r[1] and c in r[1]]
            cols.append(f" {statistics.median(vals):9.2f}" if vals else f" {'-':>9s}")
        ratio = statistics.median(ratios[k]) if ratios.get(k) else float("nan")
        print(f"  {k:18s} {ms:9.2f} {ratio:7.3f}x" + "".join(cols))
    fb = [r[1].get("harness_cpu_ms") for k in ("fb/fork", "fb/plain") for r in rows.get(k, [])]
    if fb:
        print(f"  coordinator + fork server CPU while a cell ran: median "
              f"{statistics.median(fb):.2f} ms per timed step (start-up included)")


def main() -> int:
    a = _args()
    load = lambda: "load " + ", ".join(f"{x:.2f}" for x in os.getloadavg())   # noqa: E731
    threads = (f"{a.threads} thread(s)" if a.threads
               else f"torch's default threads ({os.cpu_count()})")
    print(f"{a.model} eager train b{a.batch} {a.img}px, {threads}, {a.rounds} rounds; {load()}")
    rows: dict[str, list[list]] = {}
    ratios: dict[str, list[float]] = {}
    for r in range(a.rounds):
        got = _round(a)
        base = statistics.median(x[0] for x in got[BASE])
        for k, runs in got.items():
            rows.setdefault(k, []).extend(runs)
            ratios.setdefault(k, []).append(statistics.median(x[0] for x in runs) / base)
        if not a.quiet:
            print(f"round {r + 1}: " + " | ".join(
                f"{k} {statistics.median(x[0] for x in v):.1f}" for k, v in got.items())
                + f" ms; {load()}", flush=True)
    print(f"\nmedians over {a.rounds} rounds; {load()}")
    _summary(rows, ratios)
    from fusebench.run import forkserver
    forkserver.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
