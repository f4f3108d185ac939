"""A transformer built from torch.nn's own modules (nn.TransformerEncoderLayer), train step eager
vs fused mode, side by side in one process.

    python benchmarks/torch_transformer.py --threads 2          # ~2 min on the 2-vCPU VM
    python benchmarks/torch_transformer.py --threads 1 --rounds 12

First nn.MultiheadAttention alone (self-attention, key-padding mask) against the `mha`
site's function on its Parameters, forward + backward. Then the model:
tests/assets/torch_transformer.py at size "bench" (4 layers, width 256, MLP 1024, 128 tokens,
a key-padding mask), one variant per --variants entry (VARIANTS: pre- or post-norm, GELU or
ReLU, dropout 0 or 0.1; `default` is torch's own: post-norm, ReLU, dropout 0.1; `vit`:
tests/assets/tv_vit.py, torchvision's ViT layout, 160 px images, 101 tokens, width 256;
`seq2seq`: nn.Transformer, 4 + 4 layers, 128 source and target tokens, a causal target mask,
its decoder's cross-attention on the memory included). Each
variant's eager and fused models (fusebench.fuse, one seed) take their steps (forward,
cross-entropy, backward) alternately for --rounds rounds after a warm-up: the median
per-round eager/fused ratio with a 95% bootstrap interval, and the bytes each saves for
backward.
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

from assets import torch_transformer, tv_vit  # noqa: E402
from paired_rounds import alternate, ratio_ci, saved_bytes  # noqa: E402

from fusebench.fuse import fuse  # noqa: E402

VARIANTS = {"pre-gelu": dict(norm_first=True, activation="gelu"),
            "post-gelu": dict(norm_first=False, activation="gelu"),
            "pre-relu": dict(norm_first=True, activation="relu"),
            "post-relu": dict(norm_first=False, activation="relu"),
            # torch's defaults: post-norm, ReLU, dropout 0.1
            "default": dict(norm_first=False, activation="relu", dropout=0.1),
            "pre-gelu-drop": dict(norm_first=True, activation="gelu", dropout=0.1),
            # torchvision's ViT layout (tests/assets/tv_vit.py), images in
            "vit": dict(vit=True),
            # nn.Transformer encoder-decoder (make_seq2seq): causal self-attention and
            # cross-attention on the memory in each decoder layer; post-norm, ReLU, dropout 0
            "seq2seq": dict(seq2seq=True)}


def attention(batch: int, rounds: int, size: str = "bench") -> None:
    """nn.MultiheadAttention alone (self-attention, key-padding mask, dropout 0), forward +
    backward, against the mha site's function on the same module's Parameters."""
    from fusebench.fuse.fusions.fx_mha import self_attention
    cfg = torch_transformer.SIZES[size]
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(cfg["dim"], cfg["heads"], batch_first=True)
    x = torch.randn(batch, cfg["context"], cfg["dim"], requires_grad=True)
    pad = torch_transformer.padding(torch.zeros(x.shape[:2], dtype=torch.long))
    dy = torch.randn_like(x)

    def eager():
        mha(x, x, x, key_padding_mask=pad, need_weights=False)[0].backward(dy)

    def site():
        self_attention(x, mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight,
                       mha.out_proj.bias, None, pad, False, cfg["heads"], 0.0, True
                       ).backward(dy)
    t = alternate({"eager": eager, "site": site}, rounds)
    print(f"MultiheadAttention fwd+bwd {tuple(x.shape)}: eager "
          f"{statistics.median(t['eager']) * 1e3:.2f} ms, mha site "
          f"{statistics.median(t['site']) * 1e3:.2f} ms; eager/site "
          f"{ratio_ci(t['eager'], t['site'])} over {rounds} rounds", flush=True)


def _step(model, inputs, labels):
    out = model(*inputs)                    # (B, classes), or (B, T, vocab) for seq2seq
    F.cross_entropy(out.flatten(0, -2), labels.flatten()).backward()
    for p in model.parameters():
        p.grad = None


def variant(name: str, batch: int, rounds: int, size: str = "bench") -> None:
    torch.manual_seed(0)
    kw = dict(VARIANTS[name])
    if kw.pop("vit", False):
        eager = tv_vit.make(size=size)
    elif kw.pop("seq2seq", False):
        eager = torch_transformer.make_seq2seq(size=size, **kw)
    else:
        eager = torch_transformer.make(size=size, **kw)
    fused = copy.deepcopy(eager)
    sites = fuse(fused, "train").sites
    x = eager.example_inputs(batch, "cpu", torch.float32)   # token ids, or images (vit)
    labels = x[1] if len(x) == 2 else torch.randint(0, 10, (batch,))   # seq2seq: its targets
    t = alternate({m: (lambda m=m: _step(m, x, labels)) for m in (eager, fused)}, rounds)
    te, tf = t[eager], t[fused]
    be, bf = saved_bytes(eager, *x), saved_bytes(fused, *x)
    print(f"{name} (sites {dict(sites)}): eager {statistics.median(te) * 1e3:.1f} ms, fused "
          f"{statistics.median(tf) * 1e3:.1f} ms; eager/fused {ratio_ci(te, tf)} over {rounds} "
          f"rounds; saved for backward {be / 2**20:.1f} vs {bf / 2**20:.1f} MiB "
          f"({bf / be:.2f}x)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--size", default="bench", choices=sorted(torch_transformer.SIZES),
                    help="the asset's size (tiny: a smoke run)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, batch {args.batch}; load {os.getloadavg()[0]:.2f}")
    attention(args.batch, 3 * args.rounds, args.size)
    for name in args.variants.split(","):
        variant(name, args.batch, args.rounds, args.size)
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
