"""The activation a matched node computes, and the pure fwd/bwd pair that computes exactly that.
silu runs the act family bound for this fuse() (binding.PREFERRED); relu, relu6, hardswish and
gelu run aten's own forward and backward ops (the same numbers as eager, inside one fused
Function); quick GELU x*sigmoid(1.702x) runs the user's own forward ops and its derivative.
`match_act` also reads activations written out by hand (fx/spelled.py)."""
from __future__ import annotations

import functools

import torch
import torch.fx as fx
import torch.nn.functional as F

from fusebench.fuse.binding import Pure
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.spelled import QUICK_GELU, Spelled, spelled

APPROXIMATE = ("none", "tanh")          # what F.gelu and the bias_gelu kernels compute


def activation(n: fx.Node) -> tuple[str, str] | str | None:
    """(one of N.ACTS, gelu approximate) for an activation node, a reason string for an
    activation no kernel here computes, None for anything else."""
    op = N.op(n)
    if op == "hardsigmoid":
        return f"activation {op}: no fused kernel computes it"
    if op not in N.ACTS:
        return None
    m = N.module(n)
    approx = (m.approximate if m is not None and op == "gelu"
              else N.arg(n, 1, "approximate", "none") if op == "gelu" else "none")
    if approx not in APPROXIMATE:
        return f"gelu approximate={approx!r}: not what the kernels compute"
    return op, approx


def match_act(n: fx.Node) -> Spelled | str | None:
    """The activation whose output is n: one node (a module or function) or a hand-written
    expression; a reason string for one no kernel here computes; None for anything else."""
    act = activation(n)
    if isinstance(act, tuple):
        return Spelled(act[0], act[1], N.x_of(n), ())
    return act if act is not None else spelled(n)


def act_ending_at(n: fx.Node) -> Spelled | str | None:
    """match_act(n) where n can end an activation (an act node, or the last op of one written
    out: a mul or a div), else None without looking further."""
    return match_act(n) if N.op(n) in (*N.ACTS, "hardsigmoid", "mul", "div") else None


@functools.cache
def _quick_gelu() -> Pure:
    def fwd(x):                                    # the user's own ops, so the same numbers
        return x * torch.sigmoid(QUICK_GELU * x)

    def bwd(dy, x):
        s = torch.sigmoid(QUICK_GELU * x)
        return dy * (s + QUICK_GELU * x * s * (1 - s))
    return Pure("quick_gelu", fwd, bwd)


@functools.cache
def _relu() -> Pure:
    return Pure("relu", torch.relu, lambda dy, x: torch.ops.aten.threshold_backward(dy, x, 0))


@functools.cache
def _relu6() -> Pure:
    return Pure("relu6", F.relu6,
                lambda dy, x: torch.ops.aten.hardtanh_backward(dy, x, 0.0, 6.0))


@functools.cache
def _hardswish() -> Pure:
    return Pure("hardswish", F.hardswish, torch.ops.aten.hardswish_backward)


PIECEWISE = {"relu": _relu, "relu6": _relu6, "hardswish": _hardswish}


@functools.cache
def _gelu(approximate: str) -> Pure:
    return Pure(f"gelu[{approximate}]", lambda x: F.gelu(x, approximate=approximate),
                lambda dy, x: torch.ops.aten.gelu_backward(dy, x, approximate=approximate))


def pure_act(op: str, approximate: str, ctx) -> Pure:
    """fwd(x) -> y, bwd(dy, x) -> dx for the activation."""
    if op == "silu":
        return ctx.act("silu")
    if op == "quick_gelu":
        return _quick_gelu()
    return PIECEWISE[op]() if op in PIECEWISE else _gelu(approximate)
