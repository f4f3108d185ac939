"""The fused MLP's backward with the GELU output recomputed by the GELU's own backward call
(bias_gelu's bwd_y: dx, dbias and y from one read of h0, one exp per value) against the same
site with a separate recompute (bias_gelu fwd, then bwd: two passes and two exps per value),
and against eager. ConvNeXt's MLP: 1x1 conv C -> 4C -> C on channels-last (N, C, H, W), one
process, the three interleaved, forward+backward per sample; prints median time ratios.
    python benchmarks/mlp_bwd_y.py [--shapes 40x40,80x20,160x10,320x5] [--threads 1,2]"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from fusebench.fuse.binding import bind_act
from fusebench.fuse.fusions.fx_mlp import BiasAct, mlp_site
from fusebench.fuse.fx.acts import pure_act

sys.path.insert(0, str(Path(__file__).parent))
from mlp_residual import interleaved_medians  # noqa: E402


def sites():
    class Ctx:
        def act(self, family):
            return bind_act(family, "cpu", [], None)
    bg = Ctx().act("bias_gelu")
    assert bg.bwd_y is not None, f"bias_gelu '{bg.impl}' has no bwd_y"
    gelu = pure_act("gelu", "none", Ctx())
    one = mlp_site(BiasAct(gelu, bg, "none", 1), "conv2d")
    two = mlp_site(BiasAct(gelu, dataclasses.replace(bg, bwd_y=None), "none", 1), "conv2d")
    return {
        "eager": lambda x, w1, b1, w2, b2: F.conv2d(F.gelu(F.conv2d(x, w1, b1)), w2, b2),
        "fwd+bwd": lambda x, w1, b1, w2, b2: two(x, w1, b1, w2, b2),
        "bwd_y": lambda x, w1, b1, w2, b2: one(x, w1, b1, w2, b2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="40x40,80x20,160x10,320x5", help="CxHW per stage")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--samples", type=int, default=15)
    a = ap.parse_args()
    fns = sites()
    for shape in a.shapes.split(","):
        c, hw = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        h = 4 * c
        cl = torch.channels_last
        args = [torch.randn(a.batch, c, hw, hw).contiguous(memory_format=cl),
                torch.randn(h, c, 1, 1) / c ** 0.5, torch.rand(h),
                torch.randn(c, h, 1, 1) / h ** 0.5, torch.rand(c)]
        args = [t.requires_grad_() for t in args]
        dy = torch.randn(a.batch, c, hw, hw).contiguous(memory_format=cl)
        grads = {}
        for k, fn in fns.items():
            for t in args:
                t.grad = None
            fn(*args).backward(dy)
            grads[k] = [t.grad.clone() for t in args]
        err = max((g - r).abs().max().item() / r.abs().max().clamp_min(1).item()
                  for k in fns for g, r in zip(grads[k], grads["eager"]))
        print(f"{a.batch}x{c}x{hw}x{hw}, {c} -> {h} -> {c}: max grad diff vs eager {err:.1e}")
        for threads in (int(t) for t in a.threads.split(",")):
            torch.set_num_threads(threads)
            med = interleaved_medians(fns, args, dy, a.samples)
            print(f"  threads {threads}: fwd+bwd / bwd_y {med['fwd+bwd'] / med['bwd_y']:.3f}  "
                  f"eager / bwd_y {med['eager'] / med['bwd_y']:.3f}  "
                  f"eager / fwd+bwd {med['eager'] / med['fwd+bwd']:.3f}  "
                  f"(bwd_y {med['bwd_y'] * 1e3:.2f} ms; medians of {a.samples}, interleaved)")


if __name__ == "__main__":
    main()
