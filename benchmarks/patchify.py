"""Patchify convs (kernel == stride): aten's conv vs fuse/patchify.py's GEMM on channels-last
patches, forward + backward per call, side by side in one process.

    python benchmarks/patchify.py                       # every shape, 1 and 2 threads
    python benchmarks/patchify.py --shapes convnext_atto --threads 2 --rounds 40

Each shape's two sides run in rounds on the same tensors (paired_rounds.alternate); per side
the median of the rounds' times, and conv / GEMM with a 95% bootstrap interval over the
rounds' paired ratios (paired_rounds.ratio_ci). The `auto` race the fused
mode runs is printed next to it: what it would pick here, now."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

from fusebench.fuse import patchify

sys.path.insert(0, str(Path(__file__).parent))
from paired_rounds import alternate, ratio_ci, shape_args  # noqa: E402

# model -> (name, batch, C in, C out, H = W, kernel, input needs a gradient)
SHAPES = {
    "convnext_atto": [("stem 160px", 8, 3, 40, 160, 4, False),
                      ("downsample 1", 8, 40, 80, 40, 2, True),
                      ("downsample 2", 8, 80, 160, 20, 2, True),
                      ("downsample 3", 8, 160, 320, 10, 2, True)],
    "convnext_tiny": [("stem 224px", 8, 3, 96, 224, 4, False),
                      ("downsample 1", 8, 96, 192, 56, 2, True),
                      ("downsample 2", 8, 192, 384, 28, 2, True),
                      ("downsample 3", 8, 384, 768, 14, 2, True)],
    "vit_b16": [("patch embed 224px", 8, 3, 768, 224, 16, False)],
}


def step(fn, x, w, b, dy):
    def run():
        x.grad = w.grad = b.grad = None
        fn(x, w, b).backward(dy)
    return run


def main(argv=None) -> int:
    models, thread_counts, rounds = shape_args(__doc__, SHAPES, 30, argv)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for model in models:
            for name, n, cin, cout, hw, k, x_grad in SHAPES[model]:
                torch.manual_seed(0)
                x = torch.randn(n, cin, hw, hw).contiguous(memory_format=torch.channels_last)
                x.requires_grad_(x_grad)
                w = torch.randn(cout, cin, k, k, requires_grad=True)
                b = torch.randn(cout, requires_grad=True)
                dy = torch.randn(n, cout, hw // k, hw // k).contiguous(
                    memory_format=torch.channels_last)
                t = alternate({"conv": step(patchify.aten_conv, x, w, b, dy),
                               "gemm": step(patchify.gemm_conv, x, w, b, dy)}, rounds)
                print(f"T{threads} {model:14s} {name:18s} conv "
                      f"{1e3 * statistics.median(t['conv']):6.2f} ms, GEMM "
                      f"{1e3 * statistics.median(t['gemm']):6.2f} ms, conv/GEMM "
                      f"{ratio_ci(t['conv'], t['gemm'])}; the race picks: "
                      f"{patchify._race(x, w, b, (x_grad, True, True))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
