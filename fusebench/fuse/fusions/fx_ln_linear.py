"""ln_linear (graph, opt-in): LayerNorm over the last dim -> Linear (a transformer's pre-norm)
-> one Function that saves the LN input and its (rows,) statistics, not LN(x), and recomputes
LN(x) in backward (fx/ln_linear_kernel.py). That is one (rows, C) activation less per site,
but one more LayerNorm pass per step: on CPU it did not measure faster than eager
(benchmarks/ln_linear.py, docs/fused.md), so it is off unless asked for (`fuse(opt_in=("ln_linear",))`,
`fusebench run -m fused --fused-ln-linear`); until then each candidate is a `not_fused` note
saying so. Where the Linear is an MLP's fc1 the mlp site takes the LayerNorm in (see
fx_mlp.ln_prologue); that site counts as both mlp and ln_linear."""
from __future__ import annotations

import torch

from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import match_act
from fusebench.fuse.fx.ln_linear_kernel import ln_linear
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern

OFF = ("off by default: it recomputes LayerNorm in backward (more work; not measured faster "
       "than eager on CPU, benchmarks/ln_linear.py); -m fused --fused-ln-linear fuses it")


def last_dim_ln(n):
    """(x, eps, weight path | None, bias path | None) of a LayerNorm over the last dim only,
    a reason, or None when n is no LayerNorm."""
    if N.op(n) != "layer_norm":
        return None
    m = N.module(n)
    if m is not None:
        if len(m.normalized_shape) != 1:
            return "LayerNorm over more than one dim"
        return (N.x_of(n), float(m.eps), m.weight is not None and f"{n.target}.weight" or None,
                getattr(m, "bias", None) is not None and f"{n.target}.bias" or None)
    shape, w_node, b_node = (N.arg(n, 1, "normalized_shape"), N.arg(n, 2, "weight"),
                             N.arg(n, 3, "bias"))
    w, b = N.last_param(w_node), N.last_param(b_node)
    eps = N.number(N.arg(n, 4, "eps", 1e-5))
    if (w_node is not None and w is None) or (b_node is not None and b is None) or eps is None:
        return "LayerNorm weight / bias not module parameters, or eps not a constant"
    one_dim = (isinstance(shape, (tuple, list, torch.Size)) and len(shape) == 1) or \
        (w is not None and not isinstance(shape, (tuple, list, torch.Size)))  # w.shape
    return (N.x_of(n), eps, w, b) if one_dim else "normalized_shape is not one constant dim"


def ln_before(fc_node, x, shapes: bool = False):
    """The last-dim LayerNorm feeding a Linear whose input is x, when nothing else uses it
    (shapes: nothing but shape queries, which the LayerNorm's input answers as well):
    (ln node, parsed, those queries) | a reason | None."""
    ln = last_dim_ln(x) if x is not None else None
    if ln is None or (isinstance(ln, tuple) and N.is_permute(ln[0], (0, 2, 3, 1))):
        return None                                  # LN over NCHW channels: the ln2d pattern
    if isinstance(ln, str):
        return ln
    queries = tuple(u for u in x.users if shapes and N.shape_query(u, x))
    if set(x.users) != {fc_node, *queries}:
        return "LayerNorm output used elsewhere too"
    return x, ln, queries


def _mlp_fc1(n, bench: str, depth: int = 12) -> bool:
    """n feeds an activation (one node or written out) whose output a Linear takes, through
    identity dropouts (nn.TransformerEncoderLayer's `dropout` at p = 0): fc1."""
    todo, seen = list(n.users), set()
    while todo and len(seen) < depth * 4:
        u = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        act = match_act(u)
        if act is not None and not isinstance(act, str) and act.x is n:
            fc2 = N.single_user(u)
            while fc2 is not None and N.identity_dropout(fc2, bench):
                fc2 = N.single_user(fc2)
            return fc2 is not None and N.op(fc2) == "linear"
        todo.extend(u.users)
    return False


def ln_args(ln) -> tuple:
    x, eps, w, b = ln
    return x, eps, w and Attr(w), b and Attr(b)


@register_pattern("ln_linear", benches=("train",))
def ln_then_linear(n, scope):
    """LayerNorm -> Linear -> one Function saving x and the stats (opt-in; see module doc)."""
    fc = N.fc(n) if N.op(n) == "linear" else None
    got = ln_before(n, fc.x, shapes=True) if isinstance(fc, tuple) else None
    if got is None:
        return None
    if isinstance(got, str):                         # not a site, opted in or not
        return Miss("ln_linear", got)
    if "ln_linear" not in scope.ctx.opt_in:
        return Miss("ln_linear", OFF)
    if _mlp_fc1(n, scope.ctx.bench):
        return None                                  # the mlp site takes the LayerNorm in
    (ln_node, ln, queries), w, b = got, fc.weight, fc.bias
    x, eps, lw, lb = ln_args(ln)

    def ask_the_input():             # LayerNorm keeps the shape: its input answers them
        for u in queries:
            u.replace_input_with(ln_node, x)
    site = Site("fused_ln_linear", lambda x, lw, lb, w, b: ln_linear(x, eps, lw, lb, w, b))
    return Hit("ln_linear", n, site, (x, lw, lb, Attr(w), b and Attr(b)), (ln_node,),
               mutate=ask_the_input)
