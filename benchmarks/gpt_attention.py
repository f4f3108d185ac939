"""Attention written out by hand (nanoGPT's causal self-attention), train step eager vs fused
mode, side by side in one process.

    python benchmarks/gpt_attention.py --threads 2          # ~3 min on the 2-vCPU VM
    python benchmarks/gpt_attention.py --threads 1 --rounds 10
    python benchmarks/gpt_attention.py --size tiny --rounds 2 --contexts 16   # a smoke run

First the attention alone at each --contexts length: nanoGPT's `softmax((q @ k^T) * scale,
masked by a sliced causal buffer) @ v` on (B, H, T, D) views of one qkv projection, against
the `attention` site's function on the same tensors, forward + backward. Then the model:
tests/assets/nano_gpt.py (size "bench": 4 layers, width 256, 4 heads, 256 tokens): eager,
fused (fusebench.fuse, one seed) and fused without the `attention` site (fused mode before
it) take their steps (forward, cross-entropy, backward) alternately for --rounds rounds
after a warm-up: the median per-round eager/other ratio with a 95% bootstrap interval, and
the bytes each saves for backward.
Measure on a quiet machine: the script prints the 1-minute load before and after."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import nano_gpt  # noqa: E402
from paired_rounds import against_site, alternate, ratio_ci  # noqa: E402



def attention(batch: int, context: int, rounds: int, size: str) -> None:
    """The written-out causal attention alone against the site's function, fwd + bwd."""
    from fusebench.fuse.fusions.fx_attention import attention_site
    cfg = nano_gpt.SIZES[size]
    heads, d = cfg["heads"], cfg["dim"] // cfg["heads"]
    torch.manual_seed(0)
    qkv = torch.randn(batch, context, 3 * cfg["dim"], requires_grad=True)
    causal = torch.tril(torch.ones(context, context)).view(1, 1, context, context)
    dy = torch.randn(batch, heads, context, d)

    def heads_of():
        return [z.view(batch, context, heads, d).transpose(1, 2)
                for z in qkv.split(cfg["dim"], dim=2)]

    def eager():
        q, k, v = heads_of()
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
        att = F.softmax(att.masked_fill(causal[:, :, :context, :context] == 0, -math.inf), -1)
        (att @ v).backward(dy)

    # as fuse() builds it for nanoGPT: the sliced tril buffer is read as the causal mask
    site = attention_site((False,), ("fill",), (-math.inf,), -1, False, None, True, (True,))

    def fused():
        q, k, v = heads_of()
        masked = causal[:, :, :context, :context] == 0
        site(q, k.transpose(-2, -1), v, (1.0 / math.sqrt(d),), (masked,), None).backward(dy)
    t = alternate({"eager": eager, "site": fused}, rounds)
    print(f"attention fwd+bwd (B {batch}, H {heads}, T {context}, D {d}): eager "
          f"{statistics.median(t['eager']) * 1e3:.2f} ms, site "
          f"{statistics.median(t['site']) * 1e3:.2f} ms; eager/site "
          f"{ratio_ci(t['eager'], t['site'])} over {rounds} rounds", flush=True)


def _step(model, inputs):
    idx, = inputs
    logits = model(idx)
    F.cross_entropy(logits.flatten(0, 1), idx.flatten()).backward()
    for p in model.parameters():
        p.grad = None


def model_step(batch: int, rounds: int, size: str) -> None:
    """eager, fused, and fused without the attention site (what fused mode did before it)."""
    torch.manual_seed(0)
    eager = nano_gpt.make(size=size)
    against_site(f"nanoGPT-like {size}, batch {batch} x {eager.context} tokens", eager,
                 eager.example_inputs(batch, "cpu", torch.float32), _step, rounds, "attention")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--contexts", default="128,256,512",
                    help="sequence lengths for the attention alone")
    ap.add_argument("--size", default="bench", choices=sorted(nano_gpt.SIZES),
                    help="the asset's size (tiny: a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, batch {args.batch}; load {os.getloadavg()[0]:.2f}")
    for t in (int(c) for c in args.contexts.split(",")):
        attention(args.batch, t, 3 * args.rounds, args.size)
    model_step(args.batch, args.rounds, args.size)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
