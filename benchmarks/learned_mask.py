"""Why the attention site runs the written ops on CPU when its mask takes a gradient: SDPA's CPU
kernels give no mask gradient, so a learned additive bias (Swin's relative position bias, T5's)
sends SDPA to its math path. Forward + backward, alternating in one process.

    python benchmarks/learned_mask.py --threads 2      # ~10 s
    python benchmarks/learned_mask.py --rounds 2 --batch 8    # a smoke run

Swin-T's first stage by default: 8 images x 64 windows, 3 heads, 49 tokens, head dim 32.
"written": `softmax(q * scale @ k^T + bias) @ v` as aten ops; "sdpa": one SDPA call with the
bias as attn_mask (grad through it); "sdpa, bias frozen": the same mask with no grad (the flash
kernel). Prints each side's median and the per-round ratios with 95% bootstrap intervals."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_rounds import alternate, ratio_ci  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--batch", type=int, default=512, help="windows x images")
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=49)
    ap.add_argument("--dim", type=int, default=32)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    b, h, n, d = args.batch, args.heads, args.tokens, args.dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).requires_grad_() for _ in range(3))
    bias = torch.randn(1, h, n, n, generator=g).requires_grad_()
    dy = torch.randn(b, h, n, d, generator=g)
    scale = d ** -0.5

    def written():
        s = (q * scale) @ k.transpose(-2, -1) + bias
        (F.softmax(s, -1) @ v).backward(dy)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale).backward(dy)

    def frozen():
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach(),
                                       scale=scale).backward(dy)
    print(f"threads {args.threads}, (B {b}, H {h}, N {n}, D {d}); load {os.getloadavg()[0]:.2f}")
    t = alternate({"written": written, "sdpa": sdpa, "sdpa, bias frozen": frozen}, args.rounds)
    print(", ".join(f"{k} {statistics.median(x) * 1e3:.2f} ms" for k, x in t.items()))
    print(f"sdpa/written {ratio_ci(t['sdpa'], t['written'])}; sdpa frozen/written "
          f"{ratio_ci(t['sdpa, bias frozen'], t['written'])} over {args.rounds} rounds")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
