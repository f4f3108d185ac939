"""The residual add after a fused MLP: `res + fc2(gelu(fc1(x)))` in eager, as the fused mlp site
followed by aten's add, and with the add folded into the site (res + fc2's bias as the GEMM's
accumulator, fusebench.fuse.fx.residual). One process, the three interleaved, forward+backward
per sample; prints median time ratios. Rerun on a quiet machine:
    python benchmarks/mlp_residual.py [--rows 4096] [--dim 384] [--threads 1,2]"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fusebench.fuse.binding import bind_act
from fusebench.fuse.fusions.fx_mlp import BiasAct, mlp_site
from fusebench.fuse.fx.acts import pure_act
from fusebench.measure.memory import pin_malloc


def sites():
    class Ctx:
        def act(self, family):
            return bind_act(family, "cpu", [], None)
    ba = BiasAct(pure_act("gelu", "none", Ctx()), Ctx().act("bias_gelu"), "none", -1)
    plain, folded = mlp_site(ba, "linear"), mlp_site(ba, "linear", residual=True)
    return {
        "eager": lambda x, r, w1, b1, w2, b2: r + F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
        "site+add": lambda x, r, w1, b1, w2, b2: r + plain(x, w1, b1, w2, b2),
        "folded": lambda x, r, w1, b1, w2, b2: folded(x, w1, b1, w2, b2, r),
    }


def interleaved_medians(fns: dict, args, dy, samples: int, warmup: int = 3) -> dict:
    """name -> median seconds of fn(*args).backward(dy), the fns interleaved sample by sample
    (so the VM's drift hits all alike), after `warmup` untimed rounds; glibc's heap fixed
    as a model cell fixes it (docs/benchmarks.md)."""
    pin_malloc(None)
    times: dict = {k: [] for k in fns}
    for i in range(samples + warmup):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn(*args).backward(dy)
            if i >= warmup:
                times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--samples", type=int, default=15)
    a = ap.parse_args()
    torch.manual_seed(0)
    c, h = a.dim, 4 * a.dim
    args = [torch.randn(a.rows, c), torch.randn(a.rows, c), torch.randn(h, c) / c ** 0.5,
            torch.rand(h), torch.randn(c, h) / h ** 0.5, torch.rand(c)]
    args = [t.requires_grad_() for t in args]
    dy, fns = torch.randn(a.rows, c), sites()
    with torch.no_grad():
        ref = fns["eager"](*args)
        err = max((fns[k](*args) - ref).abs().max().item() for k in fns)
    print(f"rows {a.rows} dim {c} -> {h} -> {c}; max |diff| vs eager {err:.2e}")
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        med = interleaved_medians(fns, args, dy, a.samples)
        print(f"threads {threads}: site+add/eager {med['site+add'] / med['eager']:.3f}  "
              f"folded/eager {med['folded'] / med['eager']:.3f}  "
              f"folded/site+add {med['folded'] / med['site+add']:.3f} (medians of "
              f"{a.samples}, interleaved)")


if __name__ == "__main__":
    main()
