"""Fused mode vs eager vs torch.compile, train step, NCHW float32, all ratios from one run.

    python benchmarks/fused_mode.py                      # convnext_atto, convnext_nano, efficientnet_b0
    python benchmarks/fused_mode.py --models convnext_atto --batch 8 --img 224 --steps 10

Each cell runs in its own worker process through fusebench's runner (the same measurement as
`fusebench run`), one after the other, every worker with the same `--threads`. The default size
(batch 8, 224 px, 2 threads) is what a 2-core VM affords: about 10 minutes for the nine cells.
Targets (issue): convnext fused >= 1.2x eager steady state with fewer activation bytes;
efficientnet_b0 fused activation bytes <= 0.8x eager; torch.compile reported beside it (steady
state and compile seconds). OpenMP with all cores in use degrades badly when anything else
runs, so before each cell the script waits (up to QUIET_WAIT_S) for the 1-minute load average,
which the previous cell itself raised to ~threads, to fall below LOAD_WARN; it prints the load
each cell started at and flags a cell that started above it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from fusebench.run.runner import RunOptions, run_one
from fusebench.spec import CellSpec

MODES = ("eager", "fused", "compile")
LOAD_WARN = 1.5          # 1-minute load average above which a cell's timing is suspect
QUIET_WAIT_S = 120.0     # the previous cell's own load decays below LOAD_WARN in ~20-40 s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="convnext_atto,convnext_nano,efficientnet_b0")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="torch.set_num_threads in every worker (default: all cores)")
    ap.add_argument("--json", dest="json_out", help="also write the raw records here")
    args = ap.parse_args(argv)

    print(f"train, NCHW float32, batch {args.batch}, {args.img} px, threads {args.threads}, "
          f"warmup {args.warmup}, steps {args.steps}")
    rows, records = [], []
    for model in args.models.split(","):
        recs = {}
        for mode in args.modes.split(","):
            load = wait_quiet()
            spec = CellSpec(model=model, mode=mode, batch_size=args.batch, img_size=args.img,
                            warmup=args.warmup, steps=args.steps, threads=args.threads,
                            timeout=1800.0)
            rec = run_one(spec, RunOptions(retry_oom=False))
            recs[mode] = rec
            records.append({**rec.to_dict(), "load_before": load})
            st = rec.step_ms
            print(f"{model:16} {mode:8} {rec.status:8} "
                  f"{st.median if st else float('nan'):9.1f} ms (IQR {st.iqr if st else 0:6.1f})"
                  f"  act {(rec.activation_bytes or 0) / 1e6:8.1f} MB  first call "
                  f"{rec.compile_s or float('nan'):6.1f} s  load {load:.2f}"
                  f"{'  LOADED' if load > LOAD_WARN else ''}", flush=True)
        rows.append((model, recs))

    print(f"\n{'model':16} {'eager ms':>9} {'fused ms':>9} {'compile ms':>10} {'fused x':>8} "
          f"{'compile x':>9} {'act fused/eager':>15} {'act compile/eager':>17} {'compile s':>9}")
    for model, recs in rows:
        e, f, c = recs.get("eager"), recs.get("fused"), recs.get("compile")
        print(f"{model:16} {_ms(e):>9} {_ms(f):>9} {_ms(c):>10} {_ratio(e, f, 'speed'):>8} "
              f"{_ratio(e, c, 'speed'):>9} {_ratio(f, e, 'act'):>15} {_ratio(c, e, 'act'):>17} "
              f"{f'{c.compile_s:.1f}' if c and c.compile_s else '-':>9}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


def wait_quiet() -> float:
    """Sleep until the 1-minute load average is below LOAD_WARN (or QUIET_WAIT_S passed)."""
    end = time.monotonic() + QUIET_WAIT_S
    while os.getloadavg()[0] > LOAD_WARN and time.monotonic() < end:
        time.sleep(5.0)
    return os.getloadavg()[0]


def _ok(r) -> bool:
    return bool(r) and r.status == "ok" and r.step_ms is not None


def _ms(r) -> str:
    return f"{r.step_ms.median:.1f}" if _ok(r) else "-"


def _ratio(a, b, what: str) -> str:
    if not _ok(a) or not _ok(b):
        return "-"
    if what == "speed":            # a / b steady-state median: > 1 means b is faster
        return f"{a.step_ms.median / b.step_ms.median:.2f}x"
    if not a.activation_bytes or not b.activation_bytes:
        return "-"
    return f"{a.activation_bytes / b.activation_bytes:.2f}x"


if __name__ == "__main__":
    sys.exit(main())
