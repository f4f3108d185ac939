"""A diffusion UNet's fused piece on CPU: the gn_act kernel (GroupNorm + SiLU) against aten's
GroupNorm then SiLU, and a UNet train step eager vs fused mode, side by side in one process.

    python benchmarks/unet_parts.py --threads 2          # ~3 min on the 2-vCPU VM
    python benchmarks/unet_parts.py --threads 1 --rounds 20

Kernels: forward + backward of each impl (aten's sequence, the torch Function, the C++ kernel)
at the bench UNet's GroupNorm shapes (b8: 64 channels at 32x32, 128 at 16x16 and 32x32, 256 at
8x8) and two of Stable Diffusion's (b2: 320 at 64x64, 640 at 32x32), 32 groups, NCHW and
channels-last, interleaved, medians of --reps; ratio = aten's time / the impl's.
Step: tests/assets/diffusion_unet.py at size "bench" (diffusers' ResnetBlock2D, LDM's
ResBlock with GroupNorm32, the VAE's swish, an attention block; 32 groups, 32 px, b8), fused by
fusebench.fuse, in each layout; the two models' steps (forward, a squared-error loss against a
fixed noise target, backward) alternate for --rounds rounds after a warm-up (for NCHW input
also the fused model run channels-last inside, as `--fused-layout channels_last`); per-round
eager/fused ratios, their median and a 95% bootstrap interval (scipy.stats.bootstrap), and the
bytes each step saves for backward.
Measure on a quiet machine: the script prints the 1-minute load before and after."""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import diffusion_unet  # noqa: E402
from paired_rounds import alternate, ratio_ci, saved_bytes, timed  # noqa: E402

from fusebench.fuse import fuse  # noqa: E402
from fusebench.fuse.layout import ChannelsLastInside  # noqa: E402
from fusebench.kernels import get_impl  # noqa: E402

SHAPES = ((8, 64, 32, 32), (8, 128, 32, 32), (8, 128, 16, 16), (8, 256, 8, 8),
          (2, 320, 64, 64), (2, 640, 32, 32))
GROUPS, EPS = 32, 1e-6
LAYOUTS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def kernels(reps: int) -> None:
    impls = ("aten", "function", "cpu")
    fns = {n: get_impl("gn_act", n).fn for n in impls}
    g = torch.Generator().manual_seed(0)
    for shape in SHAPES:
        for layout, fmt in LAYOUTS.items():
            x = torch.randn(shape, generator=g).contiguous(memory_format=fmt).requires_grad_()
            w, b = (torch.randn(shape[1], generator=g).requires_grad_() for _ in range(2))
            dy = torch.randn(shape, generator=g).contiguous(memory_format=fmt)
            times = {n: [] for n in impls}
            for _ in range(3 + reps):
                for n, f in fns.items():                  # interleaved: drift hits all alike
                    times[n].append(timed(lambda: f(x, w, b, GROUPS, EPS).backward(dy)))
            med = {n: statistics.median(t[3:]) * 1e3 for n, t in times.items()}
            row = ", ".join(f"{n} {m:.3f} ms ({med['aten'] / m:.2f}x)" for n, m in med.items())
            print(f"gn_act fwd+bwd {shape} {layout}: {row}")


def _step(model, x, t, target):
    (model(x, t) - target).square().mean().backward()
    for p in _module(model).parameters():
        p.grad = None


def _module(m):
    return m.fn if isinstance(m, ChannelsLastInside) else m


def step(rounds: int, batch: int) -> None:
    for layout, fmt in LAYOUTS.items():
        torch.manual_seed(0)
        eager = diffusion_unet.make(size="bench").to(memory_format=fmt)
        fused = copy.deepcopy(eager)
        sites = fuse(fused, "train").sites
        x, t = eager.example_inputs(batch, "cpu", torch.float32)
        x = x.contiguous(memory_format=fmt)
        target = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
        # NCHW input: also the fused model run channels-last inside (fused_layout's choice)
        runs = {"eager": eager, "fused": fused}
        if layout == "nchw":
            runs["fused, channels-last inside"] = ChannelsLastInside(fused)
        times = alternate({k: (lambda m=m: _step(m, x, t, target)) for k, m in runs.items()},
                          rounds)
        be, bf = saved_bytes(eager, x, t), saved_bytes(fused, x, t)
        print(f"step {layout} b{batch} (sites {dict(sites)}); saved for backward "
              f"{be / 2**20:.1f} vs {bf / 2**20:.1f} MiB ({bf / be:.2f}x); eager "
              f"{statistics.median(times['eager']) * 1e3:.1f} ms")
        for k in list(runs)[1:]:
            print(f"  {k} {statistics.median(times[k]) * 1e3:.1f} ms; eager/fused "
                  f"{ratio_ci(times['eager'], times[k])} over {rounds} rounds")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--skip-kernels", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    if not args.skip_kernels:
        kernels(args.reps)
    step(args.rounds, args.batch)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
