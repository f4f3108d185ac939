"""A LLaMA decoder in HF transformers' current layout (tests/assets/hf_llama.py), train step
eager vs fused mode, side by side in one process.

    python benchmarks/hf_llama.py --threads 2              # ~3 min on the 2-vCPU VM
    python benchmarks/hf_llama.py --size tiny --rounds 2   # a smoke run

4 layers of width 256 (8 query heads of 32, 4 k/v heads), SwiGLU 688, vocabulary 4096, 256
tokens, batch 8: the size benchmarks/llama_parts.py runs tests/assets/llama.py at. Its
attention is written out (`eager_attention_forward`) and shapes heads with `(*input_shape, -1,
head_dim)`, which fx could not trace before fx/stars.py: fused mode then took the RMSNorms and
MLPs only, about the third column (fused without the attention site). eager, fused and that
take their steps (forward, next-token cross entropy, backward) alternately for --rounds rounds
after a warm-up: the median per-round eager/other ratio with a 95% bootstrap interval, and the
bytes each saves for backward. Measure on a quiet machine: the load is printed before and after."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from assets import hf_llama  # noqa: E402
from paired_rounds import against_site, asset_args, train_step  # noqa: E402

BATCH = {"bench": 8, "tiny": 2}


def main(argv=None) -> int:
    args = asset_args(__doc__, BATCH, argv)
    model, batch = hf_llama.make(args.size), args.batch
    (ids,) = model.example_inputs(batch, "cpu", torch.float32)

    step = train_step(lambda logits: F.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                      ids[:, 1:].flatten()))
    against_site(f"HF-layout LLaMA, b{batch}, {ids.shape[1]} tokens", model, (ids,), step,
                 args.rounds, "attention")
    print(f"load after {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
