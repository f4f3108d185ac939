"""LN2d on a channels-last x: the C++ kernel (`cpu`) vs aten's layer_norm over the NHWC view
(`channels_last`, what the fuser runs there), and the kernel as the autograd.Function the
fuser binds (`cpu_fn`, no custom-op dispatch), fwd + bwd, interleaved in one process.

    python benchmarks/ln2d_channels_last.py [--threads 2] [--rounds 15] [--shapes 8x80x56x56,...]

Each round times one fwd+bwd of every impl in turn (A, B, A, B, ...), so load that comes and
goes hits both alike; the table shows median ms per impl and aten/cpu (> 1: the C++ kernel is
faster), and the same from each impl's fastest round (less sensitive to a busy machine).
Default shapes: ConvNeXt's LN2d inputs at batch 8 (C = 40..768) plus C = 80..320 at
56x56 .. 14x14. The 1-minute load average is printed with the table.

`--split`: forward and backward apart, the extension's calls against aten's
native_layer_norm / native_layer_norm_backward on the NHWC view (no autograd, no dispatch
glue): the kernels alone, per direction; ours/aten < 1 means the C++ kernel is faster."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fusebench.kernels.ln2d import cpu
from fusebench.kernels.registry import get_impl
from fusebench.measure.memory import pin_malloc

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


def _split_fns(shape):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    dy = torch.randn(shape, generator=gen).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1], generator=gen), torch.randn(shape[1], generator=gen)
    xv, dyv, c = x.permute(0, 2, 3, 1), dy.permute(0, 2, 3, 1), [shape[1]]
    ext, aten = cpu.extension(), torch.ops.aten
    _, mean, rstd = ext.forward(x, w, b, 1e-6, False)
    _, am, ar = aten.native_layer_norm(xv, c, w, b, 1e-6)
    return {"ours fwd": lambda: ext.forward(x, w, b, 1e-6, False),
            "aten fwd": lambda: aten.native_layer_norm(xv, c, w, b, 1e-6),
            "ours bwd": lambda: ext.backward(dy, x, mean, rstd, w),
            "aten bwd": lambda: aten.native_layer_norm_backward(dyv, xv, c, am, ar, w, b,
                                                                [True, True, True])}


def split_shape(shape: tuple[int, ...], rounds: int, calls: int = 10):
    """({impl: median over rounds of its fastest of `calls`}, {impl: fastest call overall}), ms;
    the impls interleaved round by round. On a loaded machine a 2-thread call is often
    preempted (whole 4 ms timeslices), and only the fastest-overall column says anything."""
    fns = _split_fns(shape)
    best: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds + 1):                      # one warm-up round
        for name, fn in fns.items():
            ts = []
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            if r:
                best[name].append(min(ts))
    return ({k: statistics.median(v) for k, v in best.items()},
            {k: min(v) for k, v in best.items()})


def main_split(args) -> int:
    print(f"LN2d channels-last x, kernels alone, float32, threads {args.threads}, "
          f"{args.rounds} interleaved rounds, load {os.getloadavg()[0]:.2f}")
    print(f"{'shape':14} {'ours fwd':>9} {'aten fwd':>9} {'ratio':>6} | {'ours bwd':>9} "
          f"{'aten bwd':>9} {'ratio':>6} | fastest: fwd ratio, bwd ratio  (ms; ours/aten)")
    for s in args.shapes.split(","):
        m, f = split_shape(tuple(int(v) for v in s.split("x")), args.rounds)
        print(f"{s:14} {m['ours fwd']:9.3f} {m['aten fwd']:9.3f} "
              f"{m['ours fwd'] / m['aten fwd']:5.2f}x | {m['ours bwd']:9.3f} "
              f"{m['aten bwd']:9.3f} {m['ours bwd'] / m['aten bwd']:5.2f}x | "
              f"{f['ours fwd'] / f['aten fwd']:5.2f}x {f['ours bwd'] / f['aten bwd']:5.2f}x",
              flush=True)
    print(f"load at the end {os.getloadavg()[0]:.2f}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--split", action="store_true", help="forward and backward apart, no autograd")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pin_malloc(None)
    if args.split:
        return main_split(args)
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
