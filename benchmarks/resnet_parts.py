"""A ResNet block's end on CPU, `bn3 -> += identity -> ReLU`: the bn_add_act site (the bn_act
kernel reading the residual) against what ran before it (the kernel for the BN alone, then
aten's add and ReLU) and against eager's aten sequence; and a ResNet train step eager vs fused
mode with and without the site, side by side in one process.

    python benchmarks/resnet_parts.py --threads 2           # ~4 min on the 2-vCPU VM
    python benchmarks/resnet_parts.py --threads 1 --depth 18 --skip-kernels

Kernels: forward + backward of the three at ResNet-50's block ends for b8 at 160 px (256 ch
at 40x40 ... 2048 at 5x5), NCHW and channels-last, interleaved, medians of --reps; ratio =
aten's time / the variant's. Each runs through the functions the fused sites call
(fusions/bn_silu.train_bn_act), so the figures include their Python glue.
Step: tests/assets/tv_resnet.py (torchvision's layout) at --depth, b8, --img px, fused by
fusebench.fuse with every pattern ("fused") and with every pattern but bn_add_act ("fused
without bn_add_act"); NCHW input runs channels-last inside as fused mode does
(fuse/layout.py: a BN + act site fired). The steps (forward, cross-entropy, backward) rotate
for --rounds rounds after a warm-up; per-round eager/variant ratios, their median and a 95%
bootstrap interval (scipy.stats.bootstrap), and the bytes each step saves for backward.
Measure on a quiet machine: the script prints the 1-minute load before and after."""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import tv_resnet  # noqa: E402
from paired_rounds import ratio_ci, saved_bytes, timed  # noqa: E402

from fusebench.fuse import GRAPH_ORDER, ORDER, fuse  # noqa: E402
from fusebench.fuse.binding import resolve_bn_act  # noqa: E402
from fusebench.fuse.fusions.bn_silu import train_bn_act  # noqa: E402
from fusebench.fuse.fusions.bn_train import IDENTITY  # noqa: E402
from fusebench.fuse.fx.acts import pure_act  # noqa: E402
from fusebench.fuse.layout import ChannelsLastInside  # noqa: E402

SHAPES = ((8, 256, 40, 40), (8, 512, 20, 20), (8, 1024, 10, 10), (8, 2048, 5, 5))
LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def _variants(impl):
    relu = pure_act("relu", "none", None)
    return {
        "aten": lambda bn, c, r: F.relu(bn(c) + r),
        "bn kernel + aten add, relu": lambda bn, c, r: F.relu(
            train_bn_act(bn, c, impl, IDENTITY, "identity", "bn_train") + r),
        "bn_add_act": lambda bn, c, r: train_bn_act(bn, c, impl, relu, "relu", "bn_add_act",
                                                    residual=r)}


def kernels(reps: int) -> None:
    impl = resolve_bn_act("cpu", [])
    fns = _variants(impl)
    g = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        for layout, fmt in LAYOUTS.items():
            c, r = (torch.randn(shape, generator=g).contiguous(memory_format=fmt)
                    .requires_grad_() for _ in range(2))
            dy = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
            bn = nn.BatchNorm2d(shape[1])
            times = {n: [] for n in fns}
            for _ in range(3 + reps):
                for n, f in fns.items():                  # interleaved: drift hits all alike
                    times[n].append(timed(lambda: f(bn, c, r).backward(dy)))
            med = {n: statistics.median(t[3:]) * 1e3 for n, t in times.items()}
            row = "; ".join(f"{n} {m:.3f} ms ({med['aten'] / m:.2f}x)" for n, m in med.items())
            print(f"BN + add + ReLU fwd+bwd {shape} {layout}: {row}")


def _step(model, x, target):
    F.cross_entropy(model(x), target).backward()
    for p in _module(model).parameters():
        p.grad = None


def _module(m):
    return m.fn if isinstance(m, ChannelsLastInside) else m


def step(depth: str, rounds: int, batch: int, img: int) -> None:
    without = [n for n in (*ORDER, *GRAPH_ORDER) if n != "bn_add_act"]
    for layout, fmt in LAYOUTS.items():
        torch.manual_seed(0)
        eager = tv_resnet.make(depth).to(memory_format=fmt)
        fused, base = copy.deepcopy(eager), copy.deepcopy(eager)
        sites = fuse(fused, "train").sites
        fuse(base, "train", only=without)
        if layout == "nchw":                     # what fused mode's layout choice runs
            fused, base = ChannelsLastInside(fused), ChannelsLastInside(base)
        x = torch.randn(batch, 3, img, img, generator=torch.Generator().manual_seed(1))
        x = x.contiguous(memory_format=fmt)
        target = torch.randint(0, eager.fc.out_features, (batch,),
                               generator=torch.Generator().manual_seed(2))
        runs = {"eager": eager, "fused": fused, "fused without bn_add_act": base}
        for _ in range(3):
            for m in runs.values():
                _step(m, x, target)
        times = {k: [] for k in runs}
        names = list(runs)
        for i in range(rounds):
            for k in names[i % 3:] + names[:i % 3]:   # rotated: drift hits all three alike
                times[k].append(timed(lambda: _step(runs[k], x, target)))
        saved = {k: saved_bytes(m, x, params=_module(m).parameters()) / 2**20
                 for k, m in runs.items()}
        print(f"step resnet{depth} {layout} b{batch} {img}px (sites {dict(sites)}); eager "
              f"{statistics.median(times['eager']) * 1e3:.1f} ms, saved for backward "
              f"{saved['eager']:.1f} MiB")
        for k in names[1:]:
            print(f"  {k}: {statistics.median(times[k]) * 1e3:.1f} ms; eager/it "
                  f"{ratio_ci(times['eager'], times[k])}; saved {saved[k]:.1f} MiB "
                  f"({saved[k] / saved['eager']:.2f}x)")
        print(f"  without / with bn_add_act: "
              f"{ratio_ci(times['fused without bn_add_act'], times['fused'])} over {rounds} "
              f"rounds")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--img", type=int, default=160)
    ap.add_argument("--depth", default="50", choices=[str(d) for d in tv_resnet.DEPTHS])
    ap.add_argument("--skip-kernels", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    if not args.skip_kernels:
        kernels(args.reps)
    step(args.depth, args.rounds, args.batch, args.img)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
