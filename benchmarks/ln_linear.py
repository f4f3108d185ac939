"""LayerNorm -> Linear: eager (aten LN, then linear; LN(x) saved for the weight gradient) vs
fusebench's ln_linear Function (saves x and the stats; recomputes LN(x) in backward). One
process, A/B interleaved, forward+backward per sample; prints the median time ratio and the
saved-activation bytes of each. Rerun on a quiet machine:
    python benchmarks/ln_linear.py [--rows 4096] [--dim 384] [--out 1152] [--threads 1,2]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fusebench.fuse.fx.ln_linear_kernel import ln_linear
from fusebench.measure.memory import pin_malloc


def eager(x, lw, lb, w, b):
    return F.linear(F.layer_norm(x, (x.shape[-1],), lw, lb, 1e-5), w, b)


def fused(x, lw, lb, w, b):
    return ln_linear(x, 1e-5, lw, lb, w, b)


def saved_bytes(fn, args) -> int:
    seen: dict = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    params = {a.untyped_storage().data_ptr() for a in args[1:]}
    return sum(v for k, v in seen.items() if k not in params)


def step(fn, args, dy):
    t = time.perf_counter()
    fn(*args).backward(dy)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--out", type=int, default=1152)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--samples", type=int, default=15)
    a = ap.parse_args()
    pin_malloc(None)
    torch.manual_seed(0)
    x = torch.randn(a.rows, a.dim, requires_grad=True)
    lw, lb = torch.rand(a.dim, requires_grad=True), torch.rand(a.dim, requires_grad=True)
    w = (torch.randn(a.out, a.dim) / a.dim ** 0.5).requires_grad_()
    b = torch.rand(a.out, requires_grad=True)
    args, dy = (x, lw, lb, w, b), torch.randn(a.rows, a.out)
    print(f"rows {a.rows} dim {a.dim} -> {a.out}; saved bytes eager "
          f"{saved_bytes(eager, args)} fused {saved_bytes(fused, args)} (x counted once)")
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        times: dict = {"eager": [], "fused": []}
        for _ in range(3):
            step(eager, args, dy), step(fused, args, dy)
        for _ in range(a.samples):
            times["eager"].append(step(eager, args, dy))
            times["fused"].append(step(fused, args, dy))
        e, f = statistics.median(times["eager"]), statistics.median(times["fused"])
        print(f"threads {threads}: fused/eager time {f / e:.3f} (median of {a.samples}, "
              f"interleaved)")


if __name__ == "__main__":
    main()
