"""One fused MLP, forward + backward, layer by layer vs in row blocks (fuse/mlp_blocks.py), side by
side in one process, with the caches flushed before every call as a train step's reads come
from memory.

    python benchmarks/mlp_blocks.py                          # every shape, 1 and 2 threads
    python benchmarks/mlp_blocks.py --shapes convnext_atto --threads 2 --rounds 40

Each shape's MLP is fused as fused mode fuses it (the zoo's ConvMlp: the module rule on
channels-last x; a transformer's Linear MLP with its residual: the graph `mlp` site) and runs
under `mlp_blocks.using("layers")` and `using("blocks")` in alternating rounds, a 128 MiB write
before each call. Per shape: both sides' medians, layers / blocks with a 95% bootstrap
interval over the rounds' paired ratios (paired_rounds.ratio_ci), and the schedule `auto` takes
there. The rule's thresholds (MIN_HIDDEN_BYTES, MAX_CHANNELS) are read off these rows."""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

from fusebench.fuse import fuse, mlp_blocks
from fusebench.measure.memory import pin_malloc
from fusebench.models.layers import ConvMlp

sys.path.insert(0, str(Path(__file__).parent))
from paired_rounds import ratio_ci, shape_args  # noqa: E402

FLUSH_BYTES = 128 << 20
# model -> (name, kind, leading dims of x, channels C): ConvNeXt-atto's four stages at b8,
# 160 px (1x1 convs on channels-last x); transformer-style Linear MLPs at rows x C
SHAPES = {
    "convnext_atto": [("stage 1", "conv", (8, 40, 40), 40), ("stage 2", "conv", (8, 20, 20), 80),
                      ("stage 3", "conv", (8, 10, 10), 160), ("stage 4", "conv", (8, 5, 5), 320)],
    "transformer": [("25600 x 96", "linear", (100, 256), 96),
                    ("8192 x 128", "linear", (32, 256), 128),
                    ("6400 x 192", "linear", (25, 256), 192),
                    ("3072 x 256", "linear", (12, 256), 256),
                    ("2048 x 384", "linear", (8, 256), 384),
                    ("1024 x 768", "linear", (4, 256), 768)],
}


class Residual(nn.Module):
    """x + fc2(gelu(fc1(x))): a transformer block's MLP and its residual add."""

    def __init__(self, c: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


def _case(kind: str, lead: tuple, c: int):
    """(fused module, x, dy) for one shape."""
    torch.manual_seed(0)
    if kind == "conv":
        model = nn.Sequential(ConvMlp(c, 4 * c))
        n, h, w = lead
        x = torch.randn(n, c, h, w).contiguous(memory_format=torch.channels_last)
    else:
        model, x = Residual(c), torch.randn(*lead, c)
    fuse(model, "train")
    return model, x.requires_grad_(), torch.randn_like(x)


def _rounds(model, x, dy, rounds: int) -> dict[str, list[float]]:
    flush, times = torch.empty(FLUSH_BYTES // 4), {"layers": [], "blocks": []}
    for r in range(rounds + 2):                 # two warm-up rounds
        for side in times:
            with mlp_blocks.using(side):
                flush.add_(1)
                t0 = time.perf_counter()
                model(x).backward(dy)
                t = time.perf_counter() - t0
            if r >= 2:
                times[side].append(t)
    return times


def main(argv=None) -> int:
    models, thread_counts, rounds = shape_args(__doc__, SHAPES, 20, argv)
    pin_malloc(None)            # glibc's thresholds as a model cell fixes them (measure/heap.py)
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for name in models:
            for label, kind, lead, c in SHAPES[name]:
                model, x, dy = _case(kind, lead, c)
                t = _rounds(model, x, dy, rounds)
                fc1 = model[0].fc1 if kind == "conv" else model.fc1
                fc2 = model[0].fc2 if kind == "conv" else model.fc2
                auto = mlp_blocks.takes("cpu", x, kind == "conv", fc1.weight, fc1.bias,
                                        fc2.weight)
                print(f"T{threads} {name:14s} {label:11s} layers "
                      f"{1e3 * statistics.median(t['layers']):7.2f} ms, blocks "
                      f"{1e3 * statistics.median(t['blocks']):7.2f} ms, layers/blocks "
                      f"{ratio_ci(t['layers'], t['blocks'])}; auto runs: "
                      f"{'blocks' if auto else 'layers'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
