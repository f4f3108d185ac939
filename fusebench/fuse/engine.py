"""The engine: several basic ops in one autograd.Function (TransformerEngine `ops/fuser.py` style).

A MultiOpKernel is pure functions over groups of parameters, one group per basic op. The number
of parameters each op owns is captured in forward (`ctx.counts`) and used in backward to split
the gradients; backward never calls `parameters()`. Under FSDP1(use_orig_params=True)
`parameters()` returns [] during backward, which is how a well-known fused-op framework died
with "Expected op 0 to generate 0 param grads, but got 2"."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusebench.fuse.recompute import Recompute


@dataclass(frozen=True)
class MultiOpKernel:
    """fwd(x, groups) -> (y, saved tensors); bwd(dy, saved, groups) -> (dx, grads per group)."""
    name: str
    fwd: Callable
    bwd: Callable


def split_groups(flat: tuple, counts: tuple[int, ...]) -> tuple[tuple, ...]:
    """flat parameters -> one tuple per op, `counts[i]` long each."""
    out, i = [], 0
    for n in counts:
        out.append(tuple(flat[i:i + n]))
        i += n
    return tuple(out)


class MultiOpFunction(torch.autograd.Function):
    """Runs a MultiOpKernel. Every tensor backward needs goes through save_for_backward, so saved
    tensor hooks (activation bytes) see it. A saved entry may be a Recompute (fuse/recompute.py):
    its tensors are saved and backward gets the tensor it rebuilds in that entry's place."""

    @staticmethod
    def forward(ctx, kernel: MultiOpKernel, counts: tuple[int, ...], x, *flat):
        y, saved = kernel.fwd(x, split_groups(flat, counts))
        save_entries(ctx, kernel, counts, saved, flat, x)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        dx, dflat, _ = backward_parts(ctx, dy)
        return (None, None, dx, *dflat)


def backward_parts(ctx, dy) -> tuple:
    """(dx, the flat parameter grads, the kernel's extra gradient or None) of a saved
    MultiOpKernel call: bwd may return (dx, grads per group[, one more input's grad])."""
    tensors = ctx.saved_tensors
    saved, groups = (_rebuilt(tensors[:ctx.n_saved], ctx.recipes),
                     split_groups(tensors[ctx.n_saved:], ctx.counts))
    with backward_autocast(ctx.autocast):
        dx, dgroups, *extra = ctx.kernel.bwd(dy, saved, groups)
    for i, (g, dg) in enumerate(zip(groups, dgroups)):
        if len(dg) != len(g):
            raise RuntimeError(f"Expected op {i} to generate {len(g)} param grads, "
                               f"but got {len(dg)}")
    return dx, [d for dg in dgroups for d in dg], extra[0] if extra else None


def forward_autocast(x: torch.Tensor) -> tuple[str, torch.dtype] | None:
    """(device type, dtype) of the autocast region forward runs in; None outside one."""
    dev = x.device.type
    return (dev, torch.get_autocast_dtype(dev)) if torch.is_autocast_enabled(dev) else None


def backward_autocast(state: tuple[str, torch.dtype] | None):
    """Backward in forward's autocast region, as torch.amp.custom_bwd does: autograd runs
    backward outside it, so a kernel's GEMMs and convs would meet the bf16/fp16 activations
    they made in forward with the fp32 parameters, and fail on the mixed dtypes."""
    return contextlib.nullcontext() if state is None else torch.autocast(state[0],
                                                                         dtype=state[1])


def save_entries(ctx, kernel: MultiOpKernel, counts: tuple[int, ...], saved, flat,
                 x: torch.Tensor) -> None:
    """What MultiOpFunction.backward reads: the kernel, the per-op parameter counts (captured
    here, in forward), forward's autocast region, and the saved entries (a Recompute saves its
    own tensors)."""
    ctx.autocast = forward_autocast(x)
    ctx.recipes = tuple(s if isinstance(s, Recompute) else None for s in saved)
    tensors = [t for s in saved for t in (s.tensors if isinstance(s, Recompute) else (s,))]
    ctx.kernel, ctx.counts, ctx.n_saved = kernel, counts, len(tensors)
    ctx.save_for_backward(*tensors, *flat)


def _rebuilt(tensors: tuple, recipes: tuple) -> tuple:
    """The saved entries in forward's order, each Recompute's tensor rebuilt from its own."""
    out, i = [], 0
    for r in recipes:
        n = 1 if r is None else len(r.tensors)
        out.append(tensors[i] if r is None else r(*tensors[i:i + n]))
        i += n
    return tuple(out)


def run_ops(kernel: MultiOpKernel, x: torch.Tensor, groups) -> torch.Tensor:
    """groups: one tuple of Parameters per basic op, read from the owning modules at call time
    (FSDP swaps them per forward). The counts travel with the autograd node."""
    groups = tuple(tuple(p for p in g if p is not None) for g in groups)
    counts = tuple(len(g) for g in groups)
    return MultiOpFunction.apply(kernel, counts, x, *[p for g in groups for p in g])


def conv_bwd(dy, x, w, bias: bool, padding=(0, 0), groups=1, mask=(True, True, True)):
    """(dx, dw, db|None) of conv2d(x, w, b, stride 1): aten's own backward, same as eager.
    mask (dx, dw, db) skips what is not asked for (None back); with dx alone, x only gives the
    input's shape and layout."""
    dx, dw, db = torch.ops.aten.convolution_backward(
        dy, x, w, [w.shape[0]] if bias else None, (1, 1), padding, (1, 1), False, (0, 0),
        groups, (mask[0], mask[1], bias and mask[2]))
    return dx, dw, db
