"""GLU gate p = act(a) * b in plain torch ops: glu_fwd / glu_bwd (pure, no autograd node of
their own: the fused MLP's Function and the tests share them) -> GLUFunction, which saves a and
b only. Autograd of `F.silu(a) * b` keeps a, silu(a) and b alive for backward."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.function_class import function_class
from fusebench.kernels.registry import register_impl

ACTS = ("silu", "relu", "gelu", "gelu_tanh")


def act_of(a, act: str):
    if act == "silu":
        return F.silu(a)
    if act == "relu":
        return torch.relu(a)
    return F.gelu(a, approximate="tanh" if act == "gelu_tanh" else "none")


def act_grad(g, a, act: str):
    """g * act'(a), in aten's own backward ops (the same numbers as eager's autograd)."""
    if act == "silu":
        return torch.ops.aten.silu_backward(g, a)
    if act == "relu":
        return torch.ops.aten.threshold_backward(g, a, 0)
    return torch.ops.aten.gelu_backward(g, a, approximate="tanh" if act == "gelu_tanh"
                                        else "none")


def glu_reference(a, b, act: str = "silu"):
    """float64 ground truth."""
    return act_of(a.double(), act) * b.double()


def glu_fwd(a, b, act: str = "silu"):
    return act_of(a, act) * b


def glu_bwd(dp, a, b, act: str = "silu", want_p: bool = False):
    """(da, db), or (da, db, act(a) * b) with want_p (the down projection's weight gradient
    needs p; backward rebuilds it here rather than forward saving it)."""
    s = act_of(a, act)
    da, db = act_grad(dp * b, a, act), dp * s
    return (da, db, s * b) if want_p else (da, db)


def _halves(ab, gate_second: bool):
    gate, up = ab.chunk(2, -1)
    return (up, gate) if gate_second else (gate, up)


def glu_packed_fwd(ab, act: str = "silu", gate_second: bool = False):
    """act(gate) * up for ab = [gate, up] along the last dim ([up, gate]: gate_second): a
    projection's output that the model splits with `chunk(2, -1)`."""
    return glu_fwd(*_halves(ab, gate_second), act)


def glu_packed_bwd(dp, ab, act: str = "silu", gate_second: bool = False, want_p: bool = False):
    """(d_ab,) packed as ab, or (d_ab, act(gate) * up) with want_p."""
    gate, up = _halves(ab, gate_second)
    dg, du, *p = glu_bwd(dp, gate, up, act, want_p)
    return (torch.cat((du, dg) if gate_second else (dg, du), -1), *p)


def glu_function(fwd, bwd, name: str, once: bool = False) -> type:
    """An autograd.Function over a pure (fwd, bwd) pair of this family that saves a and b only
    (every glu impl but `eager` is one: torch ops here, the C++ and Triton ones in native.py).
    once: the backward is native code, so a double backward must fail, not return zeros."""
    def forward(ctx, a, b, act):
        ctx.save_for_backward(a, b)
        ctx.act = act
        return fwd(a, b, act)

    def backward(ctx, dp):
        a, b = ctx.saved_tensors
        return (*bwd(dp, a, b, ctx.act), None)
    return function_class(name, forward, backward, once)


GLUFunction = glu_function(glu_fwd, glu_bwd, "GLUFunction")


def checked_act(act: str) -> str:
    if act not in ACTS:
        raise ValueError(f"glu: act {act!r} not one of {', '.join(ACTS)}")
    return act


@register_impl("glu", "eager")
def glu_eager(a, b, act: str = "silu"):
    """act(a) * b in aten, as LLaMA writes it: saves a, act(a) and b."""
    return act_of(a, checked_act(act)) * b


@register_impl("glu", "function")
def glu_torch(a, b, act: str = "silu"):
    """autograd.Function in plain torch ops: saves only a and b."""
    return GLUFunction.apply(a, b, checked_act(act))
