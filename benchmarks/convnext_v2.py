"""A ConvNeXt V2 in the reference layout (tests/assets/convnext_v2.py), train step eager vs
fused mode, side by side in one process, NCHW and channels-last input.

    python benchmarks/convnext_v2.py --threads 2              # ~3 min on the 2-vCPU VM
    python benchmarks/convnext_v2.py --size tiny --rounds 3   # a smoke run

ConvNeXt V2-Atto's depths and widths (2, 2, 6, 2; 40, 80, 160, 320), 1000 classes, batch 8 at
160 px. Fused mode takes the blocks' fc1 -> GELU -> GRN -> fc2 + residual (grn_mlp), the
LayerNorms (ln2d), the depthwise convs (dwconv) and the stem's / downsamples' patch convs
(patchify); the third column is fused without the grn_mlp site (fused mode before it had
one), the fourth the site with GRN in torch ops after the bias + GELU kernel (`impls={"grn":
"function"}`: the site before the grn kernels, kernels/grn), timed against fused too (its
ratio > 1: the kernel is faster). Train steps on the mean of squares of the logits, paired per round as
paired_rounds.against_site takes them (eager/other ratios with 95% bootstrap intervals, the
bytes each saves for backward); measure on a quiet machine."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import convnext_v2  # noqa: E402
from paired_rounds import against_site, asset_args, train_step  # noqa: E402

BATCH = {"bench": 8, "tiny": 2}
SIZE = {"bench": dict(depths=(2, 2, 6, 2), dims=(40, 80, 160, 320), num_classes=1000),
        "tiny": {}}
PIXELS = {"bench": 160, "tiny": 32}


def main(argv=None) -> int:
    args = asset_args(__doc__, BATCH, argv)
    model = convnext_v2.make_trained(**SIZE[args.size]).train()
    x = torch.randn(args.batch, 3, PIXELS[args.size], PIXELS[args.size])

    step = train_step(lambda y: y.square().mean())
    for layout, fmt in (("NCHW", torch.contiguous_format), ("channels-last", torch.channels_last)):
        # as `fusebench run --channels-last` does: the model's conv weights too
        against_site(f"ConvNeXt V2 ({layout}), b{args.batch}, {PIXELS[args.size]} px",
                     copy.deepcopy(model).to(memory_format=fmt), (x.to(memory_format=fmt),),
                     step, args.rounds, "grn_mlp",
                     {"GRN in torch ops": {"impls": {"grn": "function"}}})
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
