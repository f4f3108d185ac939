"""Fixed cost fusebench adds per cell: worker spawn + imports + model build + record, measured
on a cell whose own work is ~nothing (tiny model, eager, 1 step). Target <= 3 s on 2 CPUs.
    python benchmarks/overhead.py [--reps 5]"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fusebench.runner import run_one
from fusebench.spec import CellSpec

TARGET_S = 3.0
TINY = str(Path(__file__).resolve().parent.parent / "tests" / "assets" / "tiny_models.py")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    import_torch = time.perf_counter() - t0
    rows = {}
    for label, model in (("tiny user model", f"{TINY}:tiny_cnn"),
                         ("zoo convnext_atto 32px", "convnext_atto")):
        spec = CellSpec(model=model, mode="eager", batch_size=2, img_size=32, warmup=0, steps=1,
                        check=False, device="cpu")
        walls = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            rec = run_one(spec)
            walls.append(time.perf_counter() - t0)
            if rec.status != "ok":
                print(f"cell failed: {rec.status} {rec.error}")
                return 1
        rows[label] = (statistics.median(walls), min(walls), rec.step_ms.median / 1e3)
    print(f"python -c 'import torch': {import_torch:.2f} s (floor for any worker)")
    worst = 0.0
    for label, (med, lo, step) in rows.items():
        print(f"{label:26s} per-cell wall median {med:.2f} s (min {lo:.2f} s; "
              f"of which the timed step {step * 1e3:.1f} ms)")
        worst = max(worst, med)
    print(f"target <= {TARGET_S:.1f} s per cell: {'PASS' if worst <= TARGET_S else 'MISS'} "
          f"({worst:.2f} s)")
    return 0 if worst <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
