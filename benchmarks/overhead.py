"""Fixed cost fusebench adds per cell: process start + imports + model build + record, measured
on cells whose own work is ~nothing (tiny model, eager, 1 step, no check). Target <= 3 s on
2 CPUs. Both launch paths are measured in one run:
  - fork server (default): cells fork from a warm parent; its one-time start is paid by the
    first cell of a run and reported separately;
  - plain (FUSEBENCH_FORKSERVER=0): `python -m fusebench.cell.worker` per cell.
    python benchmarks/overhead.py [--reps 5]"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fusebench.run import forkserver
from fusebench.run.runner import run_one
from fusebench.spec import CellSpec

TARGET_S = 3.0
TINY = str(Path(__file__).resolve().parent.parent / "tests" / "assets" / "tiny_models.py")
CELLS = {"tiny user model": f"{TINY}:tiny_cnn", "zoo convnext_atto 32px": "convnext_atto"}


def _time_cell(model: str) -> float:
    spec = CellSpec(model=model, mode="eager", batch_size=2, img_size=32, warmup=0, steps=1,
                    check=False, device="cpu")
    t0 = time.perf_counter()
    rec = run_one(spec)
    wall = time.perf_counter() - t0
    if rec.status != "ok":
        raise SystemExit(f"cell failed: {rec.status} {rec.error}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    print(f"python -c 'import torch': {time.perf_counter() - t0:.2f} s (what a plain worker "
          f"pays before anything else)")

    forkserver.shutdown()
    t0 = time.perf_counter()
    forkserver.get_server()
    print(f"fork server start (once per run, paid by its first cell): "
          f"{time.perf_counter() - t0:.2f} s")
    worst = 0.0
    for mode, env in (("fork server", "1"), ("plain", "0")):
        os.environ["FUSEBENCH_FORKSERVER"] = env
        for label, model in CELLS.items():
            walls = [_time_cell(model) for _ in range(args.reps)]
            med = statistics.median(walls)
            if mode == "fork server":
                worst = max(worst, med)
            print(f"{mode:11s} {label:24s} per-cell wall median {med:.2f} s "
                  f"(min {min(walls):.2f}, max {max(walls):.2f})")
    print(f"target <= {TARGET_S:.1f} s per cell (default launch path): "
          f"{'PASS' if worst <= TARGET_S else 'MISS'} ({worst:.2f} s)")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
