"""Squeeze-excitation, eager (pool -> reduce -> SiLU -> expand -> sigmoid -> x * gate, aten's
autograd) vs the fused SE module (fuse/fusions/se_gate.py with the cpu se_gate kernel), at
EfficientNet's SE shapes, forward + backward, one process, interleaved, medians, ratios only.

    python benchmarks/se_gate.py [--batch 8] [--reps 9] [--layouts cl,nchw] [--threads N]

Prints eager time / fused time per shape and layout (> 1: fused is faster), forward alone and
forward + backward."""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fusebench.fuse import fuse
from fusebench.measure.memory import pin_malloc
from fusebench.models.layers import SqueezeExcite

# (C, H, W) of the SE inputs of efficientnet_b0 / b3 at 192 px (the depthwise convs' outputs)
SHAPES = ((96, 48, 48), (144, 48, 48), (144, 24, 24), (240, 24, 24), (240, 12, 12),
          (480, 12, 12), (672, 12, 12), (672, 6, 6), (1152, 6, 6), (32, 96, 96), (1392, 6, 6))
LAYOUTS = {"cl": torch.channels_last, "nchw": torch.contiguous_format}


def _step(model, x, backward: bool):
    def run():
        y = model(x)
        if backward:
            y.backward(torch.ones_like(y))
    return run


def interleaved(a, b, reps: int) -> float:
    ta, tb = [], []
    a(), b()
    for _ in range(reps):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta) / statistics.median(tb)


def measure(batch: int, c: int, h: int, w: int, fmt, reps: int) -> tuple[float, float]:
    torch.manual_seed(0)
    eager = SqueezeExcite(c, max(1, c // 24))
    fused = SqueezeExcite(c, max(1, c // 24))
    fused.load_state_dict(eager.state_dict())
    holder = torch.nn.Sequential(fused)
    assert fuse(holder, "train").sites.get("se_gate") == 1, "the SE block was not fused"
    x = torch.randn(batch, c, h, w).contiguous(memory_format=fmt).requires_grad_()
    return (interleaved(_step(eager, x, False), _step(holder, x, False), reps),
            interleaved(_step(eager, x, True), _step(holder, x, True), reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--layouts", default="cl,nchw")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pin_malloc(None)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}; eager time / fused (> 1: fused faster)")
    print(f"{'N C H W':18s} {'layout':6s} {'fwd':>6s} {'fwd+bwd':>8s}")
    for c, h, w in SHAPES:
        for lay in args.layouts.split(","):
            f, fb = measure(args.batch, c, h, w, LAYOUTS[lay], args.reps)
            print(f"{args.batch} {c} {h} {w}".ljust(18) + f" {lay:6s} {f:6.2f} {fb:8.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
