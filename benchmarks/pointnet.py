"""A PointNet classifier (tests/assets/pointnet.py), train step eager vs fused mode, side by
side in one process.

    python benchmarks/pointnet.py --threads 2              # ~2 min on the 2-vCPU VM
    python benchmarks/pointnet.py --size tiny --rounds 3   # a smoke run

The paper's widths (64, 64, 128, 1024; head 512, 256; T-Nets for the input and the features),
1024 points, 40 classes, batch 16. Fused mode takes the per-point MLPs' BatchNorm1d -> ReLU over
(N, C, points) (bn_act, the kernel on the (N, C, L, 1) view) and the last one's BatchNorm1d
alone (bn_train); the heads' BatchNorm1d on Linear rows stay aten's (a `not_fused` note). The
third column is fused without the bn_act site. Train steps with a cross entropy, paired per
round as paired_rounds.against_site takes them (eager/other ratios with 95% bootstrap
intervals, the bytes each saves for backward); measure on a quiet machine."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import pointnet  # noqa: E402
from paired_rounds import against_site, asset_args, train_step  # noqa: E402

BATCH = {"bench": 16, "tiny": 4}


def main(argv=None) -> int:
    args = asset_args(__doc__, BATCH, argv)
    model, batch = pointnet.make(args.size, dropout=0.0).train(), args.batch
    inputs = model.example_inputs(batch, "cpu", torch.float32)
    target = torch.arange(batch) % model.fc3.out_features

    step = train_step(lambda logits: F.cross_entropy(logits, target))
    against_site(f"PointNet, b{batch}, {model.points} points", model, inputs, step,
                 args.rounds, "bn_act")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
