"""LN2d on a channels-last x: the C++ kernel (`cpu`) vs aten's layer_norm over the NHWC view
(`channels_last`, what the fuser runs there), and the kernel as the autograd.Function the
fuser binds (`cpu_fn`, no custom-op dispatch), fwd + bwd, interleaved in one process.

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

from fusebench.kernels.ln2d import cpu
from fusebench.kernels.registry import get_impl

SHAPES = ("8x40x56x56,8x80x56x56,8x80x28x28,8x96x56x56,8x160x28x28,8x160x14x14,"
          "8x192x28x28,8x320x14x14,8x320x7x7,8x384x14x14,8x768x7x7")
IMPLS = ("cpu", "cpu_fn", "channels_last")


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
    fns = {name: get_impl("ln2d", name).fn for name in IMPLS if name != "cpu_fn"}
    fns["cpu_fn"] = cpu.ln2d_cpu_function        # the autograd.Function the fuser binds
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
    print(f"{'shape':14} {'cpu ms':>8} {'cpu_fn ms':>9} {'aten ms':>8} {'aten/cpu':>9} "
          f"{'aten/cpu_fn':>11} | fastest: {'cpu':>6} {'cpu_fn':>7} {'aten':>6} "
          f"{'aten/cpu_fn':>11}")
    for s in args.shapes.split(","):
        shape = tuple(int(v) for v in s.split("x"))
        t = bench_shape(shape, args.rounds)
        med = {k: statistics.median(v) for k, v in t.items()}
        low = {k: min(v) for k, v in t.items()}
        a, al = med["channels_last"], low["channels_last"]
        print(f"{s:14} {med['cpu']:8.2f} {med['cpu_fn']:9.2f} {a:8.2f} {a / med['cpu']:8.2f}x "
              f"{a / med['cpu_fn']:10.2f}x | fastest: {low['cpu']:6.2f} {low['cpu_fn']:7.2f} "
              f"{al:6.2f} {al / low['cpu_fn']:10.2f}x", flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
