"""Models written with einops and einsum (tests/assets/einops_models.py), train step eager vs
fused mode, side by side in one process.

    python benchmarks/einops_models.py --threads 2        # ~4 min on the 2-vCPU VM
    python benchmarks/einops_models.py --size tiny --rounds 2    # a smoke run

Stable Diffusion v1's SpatialTransformer (one block: self-attention, cross-attention on a
77-token context, GEGLU) at SD's first level, 320 channels, 8 heads of 40, over a 16x16 and a
32x32 latent (256 and 1024 tokens); lucidrains' ViT at ViT-Tiny's width (192, 3 heads of 64,
MLP 768, 224 px in 16 px patches: 197 tokens), 4 layers. eager, fused (fusebench.fuse) and
fused without the `attention` site take their steps (forward, a loss, backward) alternately
for --rounds rounds after a warm-up: the median per-round eager/other ratio with a 95%
bootstrap interval, and the bytes each saves for backward. Before fx/leaves.py, fused mode
could not trace these attentions (einops stopped fx): the third column is about what it ran.
Measure on a quiet machine: the script prints the 1-minute load before and after."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import einops_models as E  # noqa: E402
from paired_rounds import against_site  # noqa: E402

LATENTS = {"bench": (16, 32), "tiny": (4,)}
BATCH = {"bench": 8, "tiny": 2}


def _stepper(loss):
    def step(model, inputs):
        loss(model(*inputs)).backward()
        for p in model.parameters():
            p.grad = None
    return step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--size", default="bench", choices=sorted(LATENTS))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; load {os.getloadavg()[0]:.2f}")
    for side in LATENTS[args.size]:
        torch.manual_seed(0)
        model = E.make_sd(args.size, latent=side)
        against_site(f"SpatialTransformer, b2, {side}x{side} latent ({side * side} tokens)",
                     model, model.example_inputs(2, "cpu", torch.float32),
                     _stepper(lambda y: y.square().mean()), args.rounds, "attention")
    torch.manual_seed(0)
    model, batch = E.make_vit(args.size), BATCH[args.size]
    labels = torch.randint(0, model.mlp_head.out_features, (batch,),
                           generator=torch.Generator().manual_seed(0))
    against_site(f"ViT, b{batch}", model, model.example_inputs(batch, "cpu", torch.float32),
                 _stepper(lambda y: F.cross_entropy(y, labels)), args.rounds, "attention")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
