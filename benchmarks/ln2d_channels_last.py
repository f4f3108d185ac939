"""LN2d on a channels-last x: the C++ kernel (`cpu`) vs aten's layer_norm over the NHWC view
(`channels_last`, what the fuser ran there before), fwd + bwd, interleaved in one process.

    python benchmarks/ln2d_channels_last.py [--threads 2] [--rounds 15] [--shapes 8x80x56x56,...]

Each round times one fwd+bwd of every impl in turn (A, B, A, B, ...), so load that comes and
goes hits both alike; the table shows median ms per impl and aten/cpu (> 1: the C++ kernel is
faster), and the same from each impl's fastest round (less sensitive to a busy machine).
Default shapes: ConvNeXt's LN2d inputs at batch 8 (C = 40..768) plus C = 80..320 at
56x56 .. 14x14. The 1-minute load average is printed with the table."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fusebench.kernels.registry import get_impl

SHAPES = ("8x40x56x56,8x80x56x56,8x80x28x28,8x96x56x56,8x160x28x28,8x160x14x14,"
          "8x192x28x28,8x320x14x14,8x320x7x7,8x384x14x14,8x768x7x7")
IMPLS = ("cpu", "channels_last")


def _one(fn, x, w, b, dy) -> float:
    t0 = time.perf_counter()
    y = fn(x, w, b, 1e-6)
    y.backward(dy)
    return (time.perf_counter() - t0) * 1e3


def bench_shape(shape: tuple[int, ...], rounds: int) -> dict[str, list[float]]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    w = torch.randn(shape[1], generator=gen).requires_grad_(True)
    b = torch.randn(shape[1], generator=gen).requires_grad_(True)
    dy = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    fns = {name: get_impl("ln2d", name).fn for name in IMPLS}
    times: dict[str, list[float]] = {name: [] for name in IMPLS}
    for r in range(rounds + 2):                      # two warm-up rounds
        for name, fn in fns.items():
            x.grad = w.grad = b.grad = None
            ms = _one(fn, x, w, b, dy)
            if r >= 2:
                times[name].append(ms)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"LN2d channels-last x, fwd+bwd, float32, threads {args.threads}, "
          f"{args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}")
    print(f"{'shape':14} {'cpu ms':>8} {'aten ms':>8} {'aten/cpu':>9} {'min cpu':>8} "
          f"{'min aten':>8} {'aten/cpu':>9}")
    for s in args.shapes.split(","):
        shape = tuple(int(v) for v in s.split("x"))
        t = bench_shape(shape, args.rounds)
        med = {k: statistics.median(v) for k, v in t.items()}
        low = {k: min(v) for k, v in t.items()}
        print(f"{s:14} {med['cpu']:8.2f} {med['channels_last']:8.2f} "
              f"{med['channels_last'] / med['cpu']:8.2f}x {low['cpu']:8.2f} "
              f"{low['channels_last']:8.2f} {low['channels_last'] / low['cpu']:8.2f}x", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
