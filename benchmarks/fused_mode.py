"""Fused mode vs eager vs torch.compile, train step, NCHW float32, all ratios from one run.

    python benchmarks/fused_mode.py                      # convnext_atto, convnext_nano, efficientnet_b0
    python benchmarks/fused_mode.py --models convnext_atto --batch 8 --img 224 --steps 10

Each cell runs in its own worker process through fusebench's runner (the same measurement as
`fusebench run`), so the numbers are the ones a user would see. Targets (issue): convnext
fused >= 1.2x eager steady state with fewer activation bytes; efficientnet_b0 fused activation
bytes <= 0.8x eager; torch.compile reported beside it (steady state and compile seconds).
"""
from __future__ import annotations

import argparse
import json
import sys

from fusebench.runner import RunOptions, run_one
from fusebench.spec import CellSpec

MODES = ("eager", "fused", "compile")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="convnext_atto,convnext_nano,efficientnet_b0")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", dest="json_out", help="also write the raw records here")
    args = ap.parse_args(argv)

    rows, records = [], []
    for model in args.models.split(","):
        recs = {}
        for mode in args.modes.split(","):
            spec = CellSpec(model=model, mode=mode, batch_size=args.batch, img_size=args.img,
                            warmup=args.warmup, steps=args.steps, timeout=1800.0)
            rec = run_one(spec, RunOptions(retry_oom=False))
            recs[mode] = rec
            records.append(rec.to_dict())
            print(f"{model:16} {mode:8} {rec.status:8} "
                  f"{rec.step_ms.median if rec.step_ms else float('nan'):9.1f} ms  "
                  f"act {rec.activation_bytes or 0:>12,d} B  compile_s "
                  f"{rec.compile_s or float('nan'):.1f}", flush=True)
        rows.append((model, recs))

    print("\nmodel             fused speedup  fused act ratio  compile speedup  compile s")
    for model, recs in rows:
        e, f, c = recs.get("eager"), recs.get("fused"), recs.get("compile")
        print(f"{model:16}  {_ratio(e, f, 'speed'):>13}  {_ratio(f, e, 'act'):>15}  "
              f"{_ratio(e, c, 'speed'):>15}  "
              f"{c.compile_s if c and c.compile_s else float('nan'):9.1f}")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(records, fh, indent=1)
    return 0


def _ratio(a, b, what: str) -> str:
    if not a or not b or a.status != "ok" or b.status != "ok":
        return "-"
    if what == "speed":            # a / b steady-state median: > 1 means b is faster
        return f"{a.step_ms.median / b.step_ms.median:.2f}x"
    if not a.activation_bytes or not b.activation_bytes:
        return "-"
    return f"{a.activation_bytes / b.activation_bytes:.2f}x"


if __name__ == "__main__":
    sys.exit(main())
