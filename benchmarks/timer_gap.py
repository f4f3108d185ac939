"""Why fusebench's medians came out 10-20% above torch.utils.benchmark.Timer's on the same step
(issue 13.6), measured side by side, alternating:

  fusebench   the cell through the real launcher (fork server or, --plain, a fresh worker)
  reference   a fresh process that builds the same step (same model, SGD momentum 0.9,
              cross-entropy, seed, threads) and times it four ways:
                timer/default  Timer.blocked_autorange (gc disabled while timing, as timeit
                               does) under glibc's default, self-adjusting malloc thresholds
                loop/default   a perf_counter loop like fusebench's, gc enabled, same allocator
                timer/pinned   Timer again after fusebench's pin_malloc (measure/memory.py)
                loop/pinned    the loop again, pinned
              with the minor page faults and garbage collections per step of each.

Each row of `loop/*` vs `timer/*` isolates GC (same process, same allocator); default vs
pinned isolates the allocator; fusebench vs loop/* isolates the launcher (fork server state,
the process around the step). On a busy machine the absolute figures mean little: the script
prints the load; rerun it on a quiet one.

    python benchmarks/timer_gap.py [--rounds 5] [--model convnext_atto] [--plain]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

REFERENCE = r'''
import gc, json, resource, sys, time
import torch
from torch.utils.benchmark import Timer
from fusebench.models import create_model
from fusebench.measure.memory import pin_malloc
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"])
torch.manual_seed(a["seed"])
model = create_model(a["model"])
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(a["batch"], 3, a["img"], a["img"])
y = torch.randint(0, 1000, (a["batch"],))
def step():
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def timer():
    f0 = faults()
    m = Timer("step()", globals={"step": step}, num_threads=a["threads"]).blocked_autorange(
        min_run_time=a["min_run_time"])
    return m.median * 1e3, (faults() - f0) / max(1, m.number_per_run * len(m.times)), 0
def loop():
    n, gcs = a["steps"], []
    cb = lambda phase, info: gcs.append(1) if phase == "start" else None
    gc.callbacks.append(cb)
    f0, times = faults(), []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    gc.callbacks.remove(cb)
    return statistics.median(times), (faults() - f0) / n, len(gcs) / n
import statistics
out = {}
for _ in range(a["warmup"]):
    step()
out["timer/default"], out["loop/default"] = timer(), loop()
pin_malloc()
for _ in range(a["warmup"]):
    step()
out["timer/pinned"], out["loop/pinned"] = timer(), loop()
print(json.dumps(out))
'''


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default="convnext_atto")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--img", type=int, default=96)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--plain", action="store_true", help="fusebench without the fork server")
    return ap.parse_args()


def _fusebench(a) -> float:
    from fusebench.run.runner import run_one
    from fusebench.spec import CellSpec
    spec = CellSpec.for_model(a.model, "eager", batch_size=a.batch, img_size=a.img,
                              check=False, warmup=a.warmup, steps=a.steps, threads=a.threads,
                              seed=0)
    rec = run_one(spec)
    if rec.status != "ok":
        raise SystemExit(f"fusebench cell failed: {rec.status}: {rec.error}")
    return rec.step_ms.median


def _reference(a) -> dict:
    arg = json.dumps({"model": a.model, "batch": a.batch, "img": a.img, "threads": a.threads,
                      "seed": 0, "warmup": a.warmup, "steps": a.steps, "min_run_time": 1.0})
    p = subprocess.run([sys.executable, "-c", REFERENCE, arg], capture_output=True, text=True,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    a = _args()
    if a.plain:
        os.environ["FUSEBENCH_FORKSERVER"] = "0"
    print(f"{a.model} eager train b{a.batch} {a.img}px, {a.threads} thread(s); fusebench via "
          f"{'a fresh worker' if a.plain else 'the fork server'}; load {os.getloadavg()[0]:.2f}")
    rows: dict[str, list[float]] = {}
    extra: dict[str, list[tuple[float, float]]] = {}
    for r in range(a.rounds):
        fb = _fusebench(a)
        ref = _reference(a)
        rows.setdefault("fusebench", []).append(fb)
        for k, (ms, faults, gcs) in ref.items():
            rows.setdefault(k, []).append(ms)
            extra.setdefault(k, []).append((faults, gcs))
        print(f"round {r + 1}: fusebench {fb:.2f} ms | " + " | ".join(
            f"{k} {v[0]:.2f} ms" for k, v in ref.items()), flush=True)
    base = statistics.median(rows["timer/default"])
    print(f"\nmedian over rounds (ratio to timer/default); load {os.getloadavg()[0]:.2f}")
    for k, v in rows.items():
        m = statistics.median(v)
        more = ""
        if k in extra:
            f = statistics.median(e[0] for e in extra[k])
            g = statistics.median(e[1] for e in extra[k])
            more = f"  minor faults/step {f:7.1f}" + (f"  gc/step {g:.2f}" if "loop" in k else "")
        print(f"  {k:14s} {m:9.2f} ms  {m / base:5.2f}x{more}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
