"""The SE folded into its projection conv (fusions/se_project.py) against the SE gate Function
followed by the conv (what fused mode ran before), and against eager, at efficientnet_b0's SE +
projection shapes (batch 8, 160 px; each shape weighted by how often b0 has it), forward +
backward, the three interleaved in one process. Prints per shape whether `folds` picks the
fold there, the time ratios, and the sums: what `folds` picks against either side alone.
    python benchmarks/se_project.py [--threads 1,2] [--layouts cl,nchw] [--samples 10]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.binding import bind_act
from fusebench.fuse.conv1x1 import run_conv
from fusebench.fuse.engine import run_ops
from fusebench.fuse.fusions.se_gate import se_kernel
from fusebench.fuse.fusions.se_project import folds, se_project

sys.path.insert(0, str(Path(__file__).parent))
from mlp_residual import interleaved_medians  # noqa: E402

# efficientnet_b0 at 160 px: (SE channels, H = W, SE reduce channels, projection out, count)
B0 = ((32, 80, 8, 16, 1), (96, 40, 4, 24, 1), (144, 40, 6, 24, 1), (144, 20, 6, 40, 1),
      (240, 20, 10, 40, 1), (240, 10, 10, 80, 1), (480, 10, 20, 80, 2), (480, 10, 20, 112, 1),
      (672, 10, 28, 112, 2), (672, 5, 28, 192, 1), (1152, 5, 48, 192, 3), (1152, 5, 48, 320, 1))


def sides():
    silu = bind_act("silu", "cpu", [], None)
    kernel = se_kernel(bind_act("se_gate", "cpu", [], None), silu)

    def eager(x, r, e, p):
        s = F.silu(r(x.mean((2, 3), keepdim=True)))
        return p(x * torch.sigmoid(e(s)))

    def gate_conv(x, r, e, p):
        return run_conv(p, run_ops(kernel, x, ((r.weight, r.bias), (e.weight, e.bias))))
    return {"eager": eager, "gate+conv": gate_conv,
            "folded": lambda x, r, e, p: se_project(x, r, e, p, silu)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--layouts", default="cl,nchw")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=10)
    a = ap.parse_args()
    fns = sides()
    for threads in (int(t) for t in a.threads.split(",")):
        torch.set_num_threads(threads)
        for layout in a.layouts.split(","):
            fmt = torch.channels_last if layout == "cl" else torch.contiguous_format
            total = {k: 0.0 for k in (*fns, "picked")}
            for c, hw, rd, out, count in B0:
                torch.manual_seed(0)
                x = torch.randn(a.batch, c, hw, hw).contiguous(memory_format=fmt)
                mods = (nn.Conv2d(c, rd, 1), nn.Conv2d(rd, c, 1), nn.Conv2d(c, out, 1, bias=False))
                dy = torch.randn(a.batch, out, hw, hw).contiguous(memory_format=fmt)
                med = interleaved_medians(fns, (x.requires_grad_(), *mods), dy, a.samples)
                fold = folds(x, mods[2].weight)
                for k in fns:
                    total[k] += count * med[k]
                total["picked"] += count * med["folded" if fold else "gate+conv"]
                print(f"T{threads} {layout} {a.batch}x{c}x{hw}x{hw} -> {out}: folds {fold!s:5} "
                      f"gate+conv/folded {med['gate+conv'] / med['folded']:.2f}  "
                      f"eager/folded {med['eager'] / med['folded']:.2f}  "
                      f"(folded {med['folded'] * 1e3:.2f} ms)", flush=True)
            print(f"== T{threads} {layout}, b0 summed: gate+conv {total['gate+conv'] * 1e3:.1f} ms, "
                  f"folded {total['folded'] * 1e3:.1f}, as `folds` picks {total['picked'] * 1e3:.1f}, "
                  f"eager {total['eager'] * 1e3:.1f}: gate+conv/picked "
                  f"{total['gate+conv'] / total['picked']:.3f}x, eager/picked "
                  f"{total['eager'] / total['picked']:.3f}x (medians of {a.samples})", flush=True)


if __name__ == "__main__":
    main()
