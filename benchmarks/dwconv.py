"""Depthwise conv, aten (oneDNN) vs fusebench's C++ kernel (kernels/dwconv/cpu.cpp), at every
depthwise conv shape of efficientnet_b0 and efficientnet_b3, forward and backward, in one
process, interleaved (aten, ours, aten, ours, ...), medians, ratios only.

    python benchmarks/dwconv.py [--models efficientnet_b0,efficientnet_b3] [--batch 8]
                                [--size 192] [--reps 9] [--threads N] [--layouts cl,nchw]
                                [--json out.json]

Prints one row per (shape, layout): aten time / our time for the forward, grad input, grad
weight and the whole backward, ours or `mix` (aten's grad input + our grad weight) against
aten's one backward call (> 1: ours is faster). NCHW rows time what a fused NCHW model
pays: ours converts dy / x to channels-last and dx (or y) back to NCHW, inside the timing.
The fusion's table (fuse/fusions/dwconv.py TAKE) is read off these rows; rerun on a quiet
machine before changing it."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.dwconv import cpu
from fusebench.measure.memory import pin_malloc
from fusebench.models import create_model

LAYOUTS = {"cl": torch.channels_last, "nchw": torch.contiguous_format}


def dw_shapes(model_name: str, batch: int, size: int) -> list[tuple]:
    """(N, C, H, W, K, stride) of each depthwise conv the model runs, in order, deduplicated."""
    model, seen = create_model(model_name), []

    def hook(m, args, _out):
        x = args[0]
        key = (*x.shape, m.kernel_size[0], m.stride[0])
        if key not in seen:
            seen.append(key)
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and m.groups == m.in_channels == m.out_channels > 1:
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.randn(1, 3, size, size))
    return [(batch, *s[1:]) for s in seen]


def _aten_bwd(mask):
    def run(dy, x, w, k, s):
        return torch.ops.aten.convolution_backward(dy, x, w, None, [s, s], [k // 2, k // 2],
                                                   [1, 1], False, [0, 0], w.shape[0], mask)
    return run


def _ours(fmt):
    """Our calls, converting back to the caller's layout where it is NCHW (what a model pays)."""
    ext = cpu.extension()
    back = (lambda t: t) if fmt is torch.channels_last else (lambda t: t.contiguous())
    return {
        "fwd": lambda dy, x, w, k, s: back(ext.forward(x, w, None, s)),
        "dx": lambda dy, x, w, k, s: back(ext.backward_input(dy, x, w, s)),
        "dw": lambda dy, x, w, k, s: ext.backward_weight(dy, x, w, s, False),
        "bwd": lambda dy, x, w, k, s: (back(ext.backward_input(dy, x, w, s)),
                                       ext.backward_weight(dy, x, w, s, False)),
        "mix": lambda dy, x, w, k, s: (ATEN["dx"](dy, x, w, k, s),
                                       ext.backward_weight(dy, x, w, s, False)),
    }


ATEN = {
    "fwd": lambda dy, x, w, k, s: F.conv2d(x, w, None, s, k // 2, 1, w.shape[0]),
    "dx": _aten_bwd([True, False, False]),
    "dw": _aten_bwd([False, True, False]),
    "bwd": _aten_bwd([True, True, False]),
    "mix": _aten_bwd([True, True, False]),
}


def interleaved(a, b, args, reps: int) -> float:
    """median(a) / median(b) over reps alternating calls, after one warm-up each."""
    ta, tb = [], []
    a(*args), b(*args)
    for _ in range(reps):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            fn(*args)
            out.append(time.perf_counter() - t0)
    return statistics.median(ta) / statistics.median(tb)


def measure(shape, fmt, reps: int) -> dict[str, float]:
    n, c, h, w, k, s = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w, generator=g).contiguous(memory_format=fmt)
    wt = 0.2 * torch.randn(c, 1, k, k, generator=g)
    y = F.conv2d(x, wt, None, s, k // 2, 1, c)
    dy = torch.randn(y.shape, generator=g).contiguous(memory_format=fmt)
    ours = _ours(fmt)
    return {op: interleaved(ATEN[op], ours[op], (dy, x, wt, k, s), reps) for op in ATEN}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="efficientnet_b0,efficientnet_b3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=192)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--layouts", default="cl,nchw")
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pin_malloc(None)
    cpu.extension()                                   # build before timing anything
    shapes = []
    for name in args.models.split(","):
        shapes += [s for s in dw_shapes(name, args.batch, args.size) if s not in shapes]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}; aten time / ours (> 1: ours faster)")
    print(f"{'N  C   H   W  K S':22s} {'layout':6s} " + " ".join(f"{op:>6s}" for op in ATEN))
    rows = []
    for shape in shapes:
        for lay in args.layouts.split(","):
            r = measure(shape, LAYOUTS[lay], args.reps)
            rows.append({"shape": shape, "layout": lay, **r})
            print(f"{' '.join(map(str, shape)):22s} {lay:6s} "
                  + " ".join(f"{r[op]:6.2f}" for op in ATEN), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": os.getloadavg(), "threads": torch.get_num_threads(),
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
