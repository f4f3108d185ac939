"""BatchNorm2d (training) + SiLU, forward + backward: aten's sequence (what eager runs), the
fuser's previous aten-based Function (bn_silu before the kernel: aten BN + act, then addcmul
recompute + act backward + aten BN backward), and the C++ `bn_act` kernel, interleaved in one
process (A, B, C, A, B, C, ... medians) at EfficientNet b0/b3 shapes, NCHW and channels-last.

    python benchmarks/bn_act.py [--steps 15] [--threads N] [--shapes 8x32x112x112,...]

Prints per shape and layout each variant's median ms (fwd+bwd, and fwd alone) and the ratios
aten / kernel (> 1: the kernel is faster). On a busy machine read the ratios, not the times."""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fusebench.fuse.binding import Pure
from fusebench.fuse.engine import run_ops
from fusebench.fuse.fusions.bn_silu import aten_bn_act_kernel
from fusebench.kernels.bn_act import cpu
from fusebench.measure.memory import pin_malloc

SHAPES = ("8x32x112x112", "8x96x56x56", "8x144x56x56", "8x240x28x28", "8x480x14x14",
          "8x1152x7x7")
EPS, MOMENTUM = 1e-5, 0.1
SILU = Pure("aten", F.silu, lambda dy, z: torch.ops.aten.silu_backward(dy, z))


def make(shape, channels_last: bool):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    C = shape[1]
    w = (1 + 0.5 * torch.randn(C, generator=g)).requires_grad_()
    b = (0.5 * torch.randn(C, generator=g)).requires_grad_()
    return x.requires_grad_(), w, b, torch.zeros(C), torch.ones(C), torch.randn_like(x)


def variants(x, w, b, rm, rv, dy):
    def aten(bwd=True):
        y = F.silu(F.batch_norm(x, rm, rv, w, b, True, MOMENTUM, EPS))
        if bwd:
            y.backward(dy)

    def before(bwd=True):
        y = run_ops(aten_bn_act_kernel(SILU, rm, rv, MOMENTUM, EPS), x, ((w, b),))
        if bwd:
            y.backward(dy)

    def kernel(bwd=True):
        y, mean, invstd = cpu.forward(x, w, b, rm, rv, MOMENTUM, EPS, "silu")
        if bwd:
            cpu.backward(dy, x, w, b, mean, invstd, "silu")
    return {"aten": aten, "fused_before": before, "bn_act_cpu": kernel}


def timed(fn, bwd: bool) -> float:
    t = time.perf_counter()
    fn(bwd)
    return (time.perf_counter() - t) * 1e3


def measure(shape, channels_last: bool, steps: int) -> dict[str, tuple[float, float]]:
    fns = variants(*make(shape, channels_last))
    for fn in fns.values():                      # warm up (and build the extension)
        fn(True)
        fn(True)
    times = {k: ([], []) for k in fns}
    for _ in range(steps):
        for k, fn in fns.items():               # interleaved: load drifts hit all alike
            times[k][0].append(timed(fn, True))
            times[k][1].append(timed(fn, False))
    return {k: (statistics.median(a), statistics.median(f)) for k, (a, f) in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pin_malloc(None)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms fwd+bwd (fwd)")
    print(f"{'shape':14s} {'layout':6s} {'aten':>14s} {'fused_before':>14s} {'bn_act_cpu':>14s}"
          f"  aten/kernel fwd+bwd (fwd)")
    for s in args.shapes.split(","):
        shape = tuple(int(v) for v in s.split("x"))
        for cl in (False, True):
            r = measure(shape, cl, args.steps)
            cells = " ".join(f"{a:7.2f} ({f:5.2f})" for a, f in r.values())
            ratio = r["aten"][0] / r["bn_act_cpu"][0], r["aten"][1] / r["bn_act_cpu"][1]
            layout = "cl" if cl else "nchw"
            print(f"{s:14s} {layout:6s} {cells}  {ratio[0]:5.2f}x ({ratio[1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main()
