"""Does fusebench's timer agree with torch.utils.benchmark? Same ops, same process, one run.

Prints the ratio fusebench median / torch.utils.benchmark median per op; target 0.9-1.1.
Exit code 1 when any ratio is outside the band.
    python benchmarks/fidelity.py [--device cpu|cuda] [--reps 3]"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.utils import benchmark

from fusebench.measure.timer import time_steps
from fusebench.spec import StepStats

LOW, HIGH = 0.9, 1.1


def ops(device: str):
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(512, 512, generator=g).to(device)
    x = torch.randn(8, 64, 56, 56, generator=g).to(device)
    w = torch.randn(64, 64, 3, 3, generator=g).to(device)
    ln_w, ln_b = torch.ones(64, device=device), torch.zeros(64, device=device)
    return {
        "matmul 512x512": lambda: a @ a,
        "conv3x3 8x64x56x56": lambda: F.conv2d(x, w, padding=1),
        "layer_norm NHWC 8x56x56x64": lambda: F.layer_norm(x.permute(0, 2, 3, 1), (64,),
                                                           ln_w, ln_b),
    }


def measure(fn, device: str, n: int) -> tuple[float, float]:
    """(fusebench median ms, torch.utils.benchmark median ms), interleaved to share the noise."""
    for _ in range(3):
        fn()
    ours = StepStats.from_samples(time_steps(fn, n, device)).median
    t = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    theirs = t.blocked_autorange(min_run_time=0.5).median * 1e3
    return ours, theirs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions per op")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    print(f"device={args.device} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"{'op':32s} {'fusebench ms':>13s} {'torch.bench ms':>15s} {'ratio':>7s}")
    bad = 0
    for name, fn in ops(args.device).items():
        pairs = [measure(fn, args.device, args.steps) for _ in range(args.reps)]
        ours = statistics.median(p[0] for p in pairs)
        theirs = statistics.median(p[1] for p in pairs)
        ratio = ours / theirs
        ok = LOW <= ratio <= HIGH
        bad += not ok
        print(f"{name:32s} {ours:13.4f} {theirs:15.4f} {ratio:7.3f} {'ok' if ok else 'OUT'}")
    print(f"target {LOW}-{HIGH}: {'PASS' if not bad else f'{bad} op(s) outside'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
