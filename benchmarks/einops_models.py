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
import copy
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import einops_models as E  # noqa: E402
from paired_rounds import alternate, ratio_ci, saved_bytes  # noqa: E402

from fusebench.fuse import ORDER, fuse, graph_order  # noqa: E402

LATENTS = {"bench": (16, 32), "tiny": (4,)}
BATCH = {"bench": 8, "tiny": 2}


def _step(model, inputs, loss):
    loss(model(*inputs)).backward()
    for p in model.parameters():
        p.grad = None


def compare(name: str, eager, inputs, loss, rounds: int) -> None:
    """eager, fused, and fused without the attention site, alternating."""
    fused, before = copy.deepcopy(eager), copy.deepcopy(eager)
    sites = fuse(fused, "train").sites
    fuse(before, "train", only=[n for n in (*ORDER, *graph_order()) if n != "attention"])
    models = {"eager": eager, "fused": fused, "no attention site": before}
    t = alternate({k: (lambda m=m: _step(m, inputs, loss)) for k, m in models.items()}, rounds)
    mib = {k: saved_bytes(m, *inputs) / 2**20 for k, m in models.items()}
    print(f"{name} (sites {dict(sites)}):",
          ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in t.items()))
    for k in ("fused", "no attention site"):
        print(f"  eager/{k} {ratio_ci(t['eager'], t[k])} over {rounds} rounds; saved for "
              f"backward {mib[k]:.1f} vs eager's {mib['eager']:.1f} MiB "
              f"({mib[k] / mib['eager']:.2f}x)", flush=True)


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
        compare(f"SpatialTransformer, b2, {side}x{side} latent ({side * side} tokens)", model,
                model.example_inputs(2, "cpu", torch.float32),
                lambda y: y.square().mean(), args.rounds)
    torch.manual_seed(0)
    model, batch = E.make_vit(args.size), BATCH[args.size]
    labels = torch.randint(0, model.mlp_head.out_features, (batch,),
                           generator=torch.Generator().manual_seed(0))
    compare(f"ViT, b{batch}", model, model.example_inputs(batch, "cpu", torch.float32),
            lambda y: F.cross_entropy(y, labels), args.rounds)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
