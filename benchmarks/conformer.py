"""A Conformer speech encoder in torchaudio's layout (tests/assets/conformer.py), train step
eager vs fused mode, side by side in one process.

    python benchmarks/conformer.py --threads 2              # ~2 min on the 2-vCPU VM
    python benchmarks/conformer.py --size tiny --rounds 3   # a smoke run

4 layers of width 144 (Conformer-S's), 4 heads, SiLU feed-forwards of 576, depthwise kernel 31,
200 frames of 80 features, batch 8; every other utterance a quarter shorter (a key-padding
mask). Fused mode takes the eight SiLU MLPs (mlp), the four attentions (mha) and the
convolution modules' BatchNorm1d -> SiLU (bn_act); the third column is fused without the mlp
site.
Train steps on the mean of squares of the output, paired per round as
paired_rounds.against_site takes them (eager/other ratios with 95% bootstrap intervals, the
bytes each saves for backward); measure on a quiet machine."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import conformer  # noqa: E402
from paired_rounds import against_site, asset_args, train_step  # noqa: E402

BATCH = {"bench": 8, "tiny": 2}


def main(argv=None) -> int:
    args = asset_args(__doc__, BATCH, argv)
    model, batch = conformer.make(args.size).train(), args.batch
    inputs = model.example_inputs(batch, "cpu", torch.float32)

    step = train_step(lambda y: y[0].square().mean())
    against_site(f"Conformer (torchaudio's layout), b{batch}, {model.frames} frames", model,
                 inputs, step, args.rounds, "mlp")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
