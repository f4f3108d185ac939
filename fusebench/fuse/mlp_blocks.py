"""The MLP's row-block schedule: fc1 -> bias + GELU -> fc2 [* gamma] [+ residual] run block by
block over the rows instead of layer by layer, where that pays: on CPU kernels/act/mlp_blocks.h
(in the act kernels' extension), on CUDA the Triton kernel act/_triton_kernels.mlp_fwd_kernel
(IMPLS).

Run layer by layer, each of the MLP's hidden tensors (rows x 4C) goes to memory and back
between the GEMMs and the GELU; run per 512-row block, the block's hidden tensors stay in L2.
The two schedules do the same arithmetic (aten's GEMMs, the act family's GELU), in another
order of the rows only: over a train step the blocks were 1.02-1.06x faster (ConvNeXt-atto and
the official ConvNeXt, channels-last, 1 and 2 threads; docs/fused.md, fortieth session); alone
on hot data the two tie.
That gain is the memory traffic a step has and a call timed alone on hot data does not, so the
schedule is a rule on the MLP's shape (MIN_HIDDEN_BYTES, MAX_CHANNELS), not a race.

`auto` (the default) runs the blocks on float32 / float64 CPU rows outside autocast where fc1's
output is at least MIN_HIDDEN_BYTES and its input at most MAX_CHANNELS wide, and the layers on
CUDA (the Triton blocks are not timed on a GPU yet); `layers` keeps the layer-by-layer path
(the A/B side of benchmarks/fusion_ab.py --mlp); `blocks` runs the blocks wherever the operands
allow (fused mode's --fused-mlp, tests)."""
from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusebench.errors import UsageError
from fusebench.fuse import layer_scale
from fusebench.fuse.conv1x1 import channels_last
from fusebench.fuse.engine import MultiOpKernel
from fusebench.fuse.race import Choice
from fusebench.kernels.act import cpu
from fusebench.kernels.act import triton as act_triton
from fusebench.kernels.triton_support import available as triton_available

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


def set_default(name: str) -> None:
    """The process's schedule (fused mode's --fused-mlp, for the cell this process runs)."""
    _choice.set(name)


def using(name: str):
    """Inside, the MLP sites take schedule `name` (benchmarks' A/B, tests)."""
    return _choice.using(name)


@dataclass(frozen=True)
class BlocksImpl:
    """One implementation of the blocks (kernels/act/mlp_blocks.h's contract: forward(x, w1, b1,
    w2, b2, res, tanh) -> (out, h0); backward(dy, x, h0, b1, w1, w2, tanh, has_b2) -> (dx, dw1,
    db1, dw2, db2)) and where `auto` runs it. Keyed in IMPLS by the bias_gelu impl whose GELU
    it computes: a site runs the blocks of the impl its bias + GELU is bound to (bound per
    device by measurement, fuse/binding.py), so both schedules compute the same GELU."""
    dtypes: tuple[torch.dtype, ...]
    ready: Callable[[str], tuple[bool, str]]    # device type -> (usable here, why not)
    forward: Callable
    backward: Callable
    says: str            # the event's words for what ran
    rule: str            # ... and for where `auto` runs it
    auto: bool           # `auto` runs it (where MIN_HIDDEN_BYTES / MAX_CHANNELS say): measured
    max_out: int | None = None      # widest fc2 output it takes
    max_hidden: int | None = None   # ... and most hidden units


def _cpu_ready(device: str) -> tuple[bool, str]:
    ok, why = cpu.available(device)
    return cpu.build() if ok else (ok, why)


def _cpu_forward(x, w1, b1, w2, b2, res, tanh):
    return cpu.extension().mlp_forward(x, w1, b1, w2, b2, res, tanh, ROWS)


def _cpu_backward(dy, x, h0, b1, w1, w2, tanh, has_b2):
    return cpu.extension().mlp_backward(dy, x, h0, b1, w1, w2, tanh, ROWS, has_b2)


IMPLS = {
    "cpu": BlocksImpl(
        (torch.float32, torch.float64), _cpu_ready, _cpu_forward, _cpu_backward,
        f"{ROWS}-row blocks kept in L2",
        f"where fc1's output is {MIN_HIDDEN_BYTES >> 10} KiB or more and its input at most "
        f"{MAX_CHANNELS} wide", auto=True),
    # CUDA's: fc1's tile, bias + GELU and fc2's share per 32 rows in registers; not timed on a
    # GPU yet, so `auto` keeps the layers there and --fused-mlp blocks runs it
    # (scripts/gpu_check.sh times both)
    "triton": BlocksImpl(
        act_triton.DTYPES, triton_available,
        act_triton.mlp_triton_forward, act_triton.mlp_triton_backward,
        "the Triton kernel's row blocks (the hidden tile in registers)",
        "the layers, the Triton blocks not yet timed on a GPU", auto=False,
        max_out=act_triton.MLP_MAX_O, max_hidden=act_triton.MLP_MAX_HIDDEN),
}


def takes(impl: str, x: torch.Tensor, conv: bool, w1: torch.Tensor, b1: torch.Tensor | None,
          w2: torch.Tensor, *params: torch.Tensor | None) -> bool:
    """Whether this call runs in impl's row blocks (and noted as the call shape's schedule): the
    choice, the operands (rows that are a view of x: a channels-last x for a 1x1 conv,
    conv1x1's own test; fc1's bias, which the blocks add; one device and a dtype the impl
    takes; no autocast), for `auto` the impl's rule, and the impl ready on x's device."""
    ok = (_choice.name != "layers" and b1 is not None
          and _operands_fit(IMPLS[impl], x, conv, w1, b1, w2, *params))
    _ran[(impl, conv, tuple(x.shape), tuple(w1.shape[:2]), x.dtype)] = "blocks" if ok else "layers"
    return ok


def _operands_fit(impl: BlocksImpl, x, conv, w1, b1, w2, *params) -> bool:
    ts = [x, w1, b1, w2, *(p for p in params if p is not None)]
    return ((channels_last(x) if conv else x.is_contiguous())
            and x.dtype in impl.dtypes
            and all(t.device == x.device and t.dtype == x.dtype for t in ts)
            and not torch.is_autocast_enabled(x.device.type)
            and (impl.max_out is None or w2.shape[0] <= impl.max_out)
            and (impl.max_hidden is None or w1.shape[0] <= impl.max_hidden)
            and (_choice.name == "blocks" or (impl.auto
                                              and _hidden_bytes(x, conv, w1) >= MIN_HIDDEN_BYTES
                                              and w1.shape[1] <= MAX_CHANNELS))
            and impl.ready(x.device.type)[0])


def binds(bias_gelu) -> str | None:
    """The blocks' impl for a site whose bias + GELU is bound to `bias_gelu` (a binding.Pure or
    None): the blocks' GELU is the act kernels' own (cpu_math.h's loops, the Triton kernels'),
    so only where one of those is bound (CPU's default "cpu|function", CUDA's "triton"; none
    under --fused-impl bias_gelu=function)."""
    name = None if bias_gelu is None else bias_gelu.impl.split("|")[0]
    return name if name in IMPLS else None


def tally() -> Counter:
    """How many MLP call shapes ran each schedule so far."""
    return Counter(_ran.values())


def describe() -> list[str]:
    """The event lines, one per impl whose sites were called: how many of their call shapes
    ran in blocks (none before a call)."""
    lines = []
    for name in dict.fromkeys(key[0] for key in _ran):
        runs = [v for key, v in _ran.items() if key[0] == name]
        why = f"auto: {IMPLS[name].rule}" if _choice.name == "auto" \
            else f"--fused-mlp {_choice.name}"
        lines.append(f"mlp: {runs.count('blocks')} of {len(runs)} MLP call shapes ran in "
                     f"{IMPLS[name].says} (fuse/mlp_blocks.py, {why})")
    return lines


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
def kernel(impl: str, conv: bool, approximate: str) -> MultiOpKernel:
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
        out, h0 = IMPLS[impl].forward(x2, w1, b1, w2f, b2f, acc, tanh)
        return _back(out, x, conv, out.shape[1]), (x2, h0)

    def bwd(dy, saved, groups):
        (x2, h0), (w1, b1, w2, b2, gamma) = saved, weights(groups)
        w2f, b2f = layer_scale.fold(w2.flatten(1), b2, gamma)
        dx, dw1, db1, dw2f, db2f = IMPLS[impl].backward(
            _rows(dy, conv).contiguous(), x2, h0, b1, w1, w2f, tanh, b2 is not None)
        fc2_grads, gamma_grads = layer_scale.unfold_grads(
            dw2f, db2f, w2.flatten(1), b2, gamma, groups[2][0].shape if groups[2] else None)
        return _back(dx, dy, conv, dx.shape[1]), (
            (dw1.view_as(groups[0][0]), db1),
            tuple(g.view_as(p) for g, p in zip(fc2_grads, groups[1])), gamma_grads)
    return MultiOpKernel(f"mlp_blocks[{impl},{'conv1x1' if conv else 'linear'},{approximate}]",
                         fwd, bwd)
