"""ConvNeXt whole train step, eager vs fused, with the ln2d binding before and after the
channels-last kernel fix, interleaved in one process (A, B, C, A, B, C, ...).

    python benchmarks/ln2d_convnext_ab.py [--model convnext_atto|convnext_official]
        [--layout cl|nchw] [--threads 2] [--batch 8] [--size 160] [--rounds 6]

Variants: `eager`; `fused` (today's binding: the C++ kernel on either layout of x);
`fused_aten_cl` (the old "cpu|channels_last" binding: the kernel on NCHW x, aten's layer_norm
over the NHWC view on channels-last x). convnext_official is tests/assets/convnext_official.py
at convnext_atto's depths and widths, as benchmarks/fused_mode.py loads it. Prints the median
step ms of each variant, eager/variant (> 1: faster than eager), the same per round (paired)
and the old binding's step / the new one's, and the load average."""
from __future__ import annotations

import argparse
import copy
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

from fusebench.fuse import binding, fuse
from fusebench.kernels.ln2d import cpu as ln2d_cpu
from fusebench.kernels.registry import get_impl
from fusebench.measure.memory import pin_malloc
from fusebench.models import create_model

ASSETS = Path(__file__).resolve().parent.parent / "tests" / "assets"
OFFICIAL_KW = {"depths": [2, 2, 6, 2], "dims": [40, 80, 160, 320], "num_classes": 1000}
RESOLVERS = ("fusebench.fuse.fusions.ln2d.resolve_ln2d",
             "fusebench.fuse.fusions.fx_ln2d.resolve_ln2d")


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "convnext_official":
        sys.path.insert(0, str(ASSETS))
        import convnext_official
        return convnext_official.make(**OFFICIAL_KW)
    return create_model(name)


def _old_binding(device, notes):
    """The pre-fix binding: kernel on NCHW x, aten on (dense) channels-last x."""
    name, fn = binding.resolve_ln2d(device, notes)
    if name != "cpu":
        return name, fn
    nchw = functools.partial(ln2d_cpu.ln2d_cpu_function, channels_last_out=True)
    aten = get_impl("ln2d", "channels_last").fn

    def ln2d(x, weight, bias, eps):
        dense_cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return (aten if dense_cl else nchw)(x, weight, bias, eps)
    return "cpu|channels_last", ln2d


def variants(base, fmt) -> dict[str, torch.nn.Module]:
    out = {}
    for key in ("eager", "fused", "fused_aten_cl"):
        m = copy.deepcopy(base).to(memory_format=fmt).train()
        if key == "fused":
            fuse(m, "train", "cpu")
        elif key == "fused_aten_cl":
            with mock.patch(RESOLVERS[0], _old_binding), mock.patch(RESOLVERS[1], _old_binding):
                fuse(m, "train", "cpu")
        out[key] = m
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="convnext_atto")
    ap.add_argument("--layout", choices=("cl", "nchw"), default="cl")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pin_malloc(None)
    fmt = torch.channels_last if args.layout == "cl" else torch.contiguous_format
    x = torch.randn(args.batch, 3, args.size, args.size).to(memory_format=fmt)
    t = torch.randint(0, 1000, (args.batch,))
    models = variants(build(args.model), fmt)

    def step(m):
        m.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(m(x), t).backward()
    for m in models.values():                      # two warm-up steps each
        step(m)
        step(m)
    ts: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(args.rounds):
        for k, m in models.items():
            t0 = time.perf_counter()
            step(m)
            ts[k].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in ts.items()}
    # paired: each round's eager / variant and old binding / new, median over rounds (load
    # that comes and goes between rounds cancels within a round)
    paired = {k: statistics.median(e / v for e, v in zip(ts["eager"], ts[k])) for k in ts}
    new_vs_old = statistics.median(o / n for o, n in zip(ts["fused_aten_cl"], ts["fused"]))
    print(f"{args.model} {args.layout} b{args.batch} {args.size}px threads {args.threads}, "
          f"{args.rounds} rounds, load {os.getloadavg()[0]:.2f}: " + ", ".join(
              f"{k} {v:.1f} ms ({med['eager'] / v:.2f}x, paired {paired[k]:.2f}x)"
              for k, v in med.items()) + f"; fused_aten_cl/fused paired {new_vs_old:.2f}x",
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
