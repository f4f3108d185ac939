"""The MLP's row-block schedule: fc1 -> bias + GELU -> fc2 [* gamma] [+ residual] run block by
block over the rows (kernels/act/mlp_blocks.h, in the act kernels' extension) instead of layer
by layer, where that pays.

Run layer by layer, each of the MLP's hidden tensors (rows x 4C) goes to memory and back
between the GEMMs and the GELU; run per 512-row block, the block's hidden tensors stay in L2.
The two schedules do the same arithmetic (aten's GEMMs, the act family's GELU), in another
order of the rows only: over a train step the blocks were 1.02-1.06x faster (ConvNeXt-atto and
the official ConvNeXt, channels-last, 1 and 2 threads; docs/fused.md, fortieth session); alone
on hot data the two tie.
That gain is the memory traffic a step has and a call timed alone on hot data does not, so the
schedule is a rule on the MLP's shape (MIN_HIDDEN_BYTES, MAX_CHANNELS), not a race.

`auto` (the default) runs the blocks on float32 / float64 CPU rows outside autocast where fc1's
output is at least MIN_HIDDEN_BYTES and its input at most MAX_CHANNELS wide; `layers` keeps the
layer-by-layer path (the A/B side of benchmarks/fusion_ab.py --mlp); `blocks` runs the blocks
wherever the operands allow (tests)."""
from __future__ import annotations

import functools
from collections import Counter

import torch

from fusebench.errors import UsageError
from fusebench.fuse import layer_scale
from fusebench.fuse.conv1x1 import channels_last
from fusebench.fuse.engine import MultiOpKernel
from fusebench.fuse.race import Choice
from fusebench.kernels.act import cpu

ROWS = 512          # rows per block (128-2048 measured: 512 best or tied at every ConvNeXt MLP)
# Blocks pay where fc1's output (rows x 4C) would not stay in L2 between the layers.
# ConvNeXt-atto's MLPs at b8, 160 px, forward + backward alone with the caches flushed before
# each call (benchmarks/mlp_blocks.py, two runs; layers / blocks at 2 threads, then 1), by the
# size of fc1's output: 8 MB 1.09-1.12x, 1.18-1.24x; 4 MB 1.03-1.11x, 1.07-1.08x; 2 MB
# 1.02-1.08x, 0.99-1.00x; 1 MB 0.87-0.97x, 0.93x (one short block a thread, and smaller GEMMs
# than the layers').
MIN_HIDDEN_BYTES = 3 << 19      # 1.5 MiB
# ...and where the GEMMs are narrow enough to be bound by memory rather than by the FMAs. A
# transformer-style Linear MLP with its residual, the same way, by C (2 threads, then 1): 96
# 1.29-1.32x, 1.30-1.38x; 128 1.01-1.05x, 1.07-1.11x; 192 1.05-1.06x, 1.01-1.04x; 256
# 1.00-1.03x, 1.04-1.05x; 320 1.00x, 0.99x; 384 0.99-1.00x, 0.92-0.96x; 768 0.96-0.97x,
# 0.93-0.97x: a block's GEMMs run on one thread each, smaller, and at wide C that loses more
# than the cache saves.
MAX_CHANNELS = 256              # fc1's input width C
CHOICES = ("auto", "blocks", "layers")


def _checked(name: str) -> str:
    if name not in CHOICES:
        raise UsageError(f"MLP schedule '{name}': valid: {', '.join(CHOICES)}")
    return name


_choice = Choice(_checked)
# call shape -> the schedule it last ran (what fused mode reports): per shape, as gemm's race
# line, so that the count says how many of the model's MLPs run in blocks, not how many calls
# prepare's layout trial, the correctness check and the steps made
_ran: dict[tuple, str] = {}


def using(name: str):
    """Inside, the MLP sites take schedule `name` (benchmarks' A/B, tests)."""
    return _choice.using(name)


def takes(x: torch.Tensor, conv: bool, w1: torch.Tensor, b1: torch.Tensor | None,
          *params: torch.Tensor | None) -> bool:
    """Whether this call runs in row blocks (and noted as the call shape's schedule): the
    choice, the operands (CPU float32 / float64 rows that are a view of x: a channels-last x
    for a 1x1 conv, conv1x1's own test; fc1's bias, which the blocks add; one dtype; no
    autocast), the size of fc1's output and its input width, and a built extension."""
    ok = _choice.name != "layers" and b1 is not None and _operands_fit(x, conv, w1, b1, *params)
    _ran[(conv, tuple(x.shape), tuple(w1.shape[:2]), x.dtype)] = "blocks" if ok else "layers"
    return ok


def _operands_fit(x, conv, w1, *params) -> bool:
    ts = [x, w1, *(p for p in params if p is not None)]
    return ((channels_last(x) if conv else x.is_contiguous())
            and x.dtype in (torch.float32, torch.float64)
            and all(t.device.type == "cpu" and t.dtype == x.dtype for t in ts)
            and not torch.is_autocast_enabled("cpu")
            and (_choice.name == "blocks" or (_hidden_bytes(x, conv, w1) >= MIN_HIDDEN_BYTES
                                              and w1.shape[1] <= MAX_CHANNELS))
            and cpu.available("cpu")[0] and cpu.build()[0])


def binds(bias_gelu) -> bool:
    """Whether a site whose bias + GELU is bound to `bias_gelu` (a binding.Pure or None) may
    run in blocks: their GELU is the C++ act kernels' (cpu_math.h), so only where that impl is
    the one bound for channels-last rows (CPU's default "cpu|function"; not under --fused-impl
    bias_gelu=function)."""
    return bias_gelu is not None and bias_gelu.impl.split("|")[0] == "cpu"


def tally() -> Counter:
    """How many MLP call shapes ran each schedule so far."""
    return Counter(_ran.values())


def describe() -> str | None:
    """The event line: which schedule the MLP call shapes ran (None: none ran yet)."""
    if not _ran:
        return None
    return (f"mlp: {tally()['blocks']} of {len(_ran)} MLP call shapes ran in {ROWS}-row blocks "
            f"kept in L2 (fuse/mlp_blocks.py: where fc1's output is {MIN_HIDDEN_BYTES >> 10} KiB "
            f"or more and its input at most {MAX_CHANNELS} wide)")


# Rows of an MLP's activations: (..., C) for a Linear, a channels-last (N, C, H, W) for a 1x1
# conv (its (N, H, W, C) view); `back` gives a rows tensor the activation's shape again.
def _rows(t: torch.Tensor, conv: bool) -> torch.Tensor:
    return (t.permute(0, 2, 3, 1) if conv else t).reshape(-1, t.shape[1 if conv else -1])


def _hidden_bytes(x: torch.Tensor, conv: bool, w1: torch.Tensor) -> int:
    """Bytes of fc1's output for input x: rows x w1's output channels."""
    return x.numel() // x.shape[1 if conv else -1] * w1.shape[0] * x.element_size()


def _back(t2: torch.Tensor, like: torch.Tensor, conv: bool, c: int) -> torch.Tensor:
    """t2 (rows, c) as an activation shaped like `like` with c channels."""
    if conv:
        n, _, h, w = like.shape
        return t2.view(n, h, w, c).permute(0, 3, 1, 2)
    return t2.view(*like.shape[:-1], c)


@functools.cache
def kernel(conv: bool, approximate: str) -> MultiOpKernel:
    """MultiOpKernel over groups ((w1, b1), (w2[, b2]), ([gamma])): x -> fc2(gelu(fc1(x)))
    [* gamma] [+ res], in row blocks. Saves x and fc1's output before its bias, as the
    layer-by-layer path saves fc1's output (and x, by fc1's own GEMM)."""
    tanh = approximate == "tanh"

    def weights(groups):
        (w1, b1), (w2, *b2), g3 = groups
        b2, gamma = (b2[0] if b2 else None), (g3[0].reshape(-1) if g3 else None)
        return w1.flatten(1), b1, w2, b2, gamma

    def fwd(x, groups, res=None):
        w1, b1, w2, b2, gamma = weights(groups)
        w2f, b2f = layer_scale.fold(w2.flatten(1), b2, gamma)
        x2 = _rows(x, conv)
        acc = None if res is None else _rows(res, conv)
        out, h0 = cpu.extension().mlp_forward(x2, w1, b1, w2f, b2f, acc, tanh, ROWS)
        return _back(out, x, conv, out.shape[1]), (x2, h0)

    def bwd(dy, saved, groups):
        (x2, h0), (w1, b1, w2, b2, gamma) = saved, weights(groups)
        w2f, b2f = layer_scale.fold(w2.flatten(1), b2, gamma)
        dx, dw1, db1, dw2f, db2f = cpu.extension().mlp_backward(
            _rows(dy, conv).contiguous(), x2, h0, b1, w1, w2f, tanh, ROWS, b2 is not None)
        fc2_grads, gamma_grads = layer_scale.unfold_grads(
            dw2f, db2f, w2.flatten(1), b2, gamma, groups[2][0].shape if groups[2] else None)
        return _back(dx, dy, conv, dx.shape[1]), (
            (dw1.view_as(groups[0][0]), db1),
            tuple(g.view_as(p) for g, p in zip(fc2_grads, groups[1])), gamma_grads)
    return MultiOpKernel(f"mlp_blocks[{'conv1x1' if conv else 'linear'},{approximate}]", fwd, bwd)
