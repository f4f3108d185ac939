"""glu_mlp (graph): a gated MLP, down(act(gate(x)) * up(x)) (LLaMA's and Mistral's SwiGLU,
GeGLU, ReGLU), gate / up / down = nn.Linear or F.linear over the last dim with or without
biases, act = SiLU / GELU / ReLU in any spelling match_act reads, optionally then
`res + ...` -> one Function: the two projections, the gate (the bound glu kernel: one pass per
direction), the down projection, the residual as its GEMM's accumulator. It saves x, a =
gate(x) and b = up(x); eager also keeps act(a) and the product for backward, which rebuilds
the product for the down projection's weight gradient in the same pass as da and db."""
from __future__ import annotations

import functools

import torch

from fusebench.fuse import gemm
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.fusions.fx_mlp import _residual, foldable
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import match_act
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.fx.residual import run_ops_residual
from fusebench.kernels.glu.function import glu_bwd, glu_fwd

GLU_ACT = {("silu", "none"): "silu", ("relu", "none"): "relu", ("gelu", "none"): "gelu",
           ("gelu", "tanh"): "gelu_tanh"}        # (match_act's kind, approximate) -> glu act
CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _rows(t):
    return t.reshape(-1, t.shape[-1])


@functools.cache
def glu_mlp_kernel(fwd_gate, bwd_gate, impl: str, act: str) -> MultiOpKernel:
    """groups: ((w_gate[, b_gate]), (w_up[, b_up]), (w_down[, b_down]))."""
    def fwd(x, groups, res=None):
        (wg, *bg), (wu, *bu), (wd, *bd) = groups
        a, b = gemm.nt(x, wg, *bg), gemm.nt(x, wu, *bu)
        p = fwd_gate(a, b, act)
        y = gemm.nt(p, wd, *bd) if res is None else gemm.nt_add(res, p, wd, *bd)
        return y, (x, a, b)

    def bwd(dy, saved, groups):
        (x, a, b), ((wg, *bg), (wu, *bu), (wd, *bd)) = saved, groups
        dy2 = _rows(dy)
        dp = gemm.nn(dy2, wd).view(a.shape)
        da, db, p = bwd_gate(dp, a, b, act, True)
        da2, db2, x2 = _rows(da), _rows(db), _rows(x)
        dx = gemm.nn(da2, wg).add_(gemm.nn(db2, wu)).view(x.shape)
        grads = ((gemm.wgrad(da2, x2), *(da2.sum(0) for _ in bg)),
                 (gemm.wgrad(db2, x2), *(db2.sum(0) for _ in bu)),
                 (gemm.wgrad(dy2, p), *(dy2.sum(0) for _ in bd)))
        return dx, grads
    return MultiOpKernel(f"glu_mlp[{act},{impl}]", fwd, bwd)


def glu_mlp_site(ctx, act: str, residual: bool) -> Site:
    """run(x, wg, bg, wu, bu, wd, bd[, res]) with the glu kernel bound for this fuse(); plain
    torch ops for a dtype the bound C++ kernel does not take (float16 on CPU)."""
    pair = ctx.act("glu")
    kernel = glu_mlp_kernel(pair.fwd, pair.bwd, pair.impl, act)
    torch_kernel = glu_mlp_kernel(glu_fwd, glu_bwd, "function", act)

    def run(x, wg, bg, wu, bu, wd, bd, *res):
        k = torch_kernel if pair.impl == "cpu" and x.dtype not in CPU_DTYPES else kernel
        groups = ((wg, bg), (wu, bu), (wd, bd))
        if not res:
            return run_ops(k, x, groups)
        if not foldable(res[0], x, wd, "linear"):
            return run_ops(k, x, groups) + res[0]        # eager's add, the same numbers
        return run_ops_residual(k, x, groups, res[0])
    return Site("fused_glu_mlp", run)


def _gate_and_up(mul):
    """(act match, act node, gate FcCall, up node, up FcCall) when mul = act(gate(x)) * up(x)
    (either order) with gate and up Linears on one x; a reason; or None."""
    for act_node, up_node in N.commuted(mul, "mul"):
        act = match_act(act_node)
        if act is None or isinstance(act, str):
            continue
        gate, up = N.fc(act.x), N.fc(up_node)
        if not (isinstance(gate, tuple) and isinstance(up, tuple)):
            continue
        if gate.x is not up.x:
            return "the gate and up projections read different inputs"
        if gate.kind != "linear" or up.kind != "linear":
            return "gate / up are not Linears over the last dim"
        return act, act_node, gate, up_node, up
    return None


@register_pattern("glu_mlp", benches=("train", "infer"))
def glu_mlp(n, scope):
    """down(act(gate(x)) * up(x)) [-> + residual] -> one Function."""
    down = N.fc(n)
    if not isinstance(down, tuple):
        return None
    mul, drops = N.above_identities(down.x, scope.ctx.bench)
    got = _gate_and_up(mul) if N.op(mul) == "mul" else None
    if got is None:
        return None
    if isinstance(got, str):
        return Miss("glu_mlp", got)
    act, act_node, gate, up_node, up = got
    kind = GLU_ACT.get((act.kind, act.approximate))
    if kind is None:
        return Miss("glu_mlp", f"activation {act.kind}: the glu kernels compute SiLU, GELU "
                               f"and ReLU")
    if down.kind != "linear":
        return Miss("glu_mlp", "the down projection is not a Linear over the last dim")
    gate_node = act.x
    inner = {n, *down.inner, *drops}
    if not (set(gate_node.users) <= {act_node, *act.nodes} and set(act_node.users) == {mul}
            and set(up_node.users) == {mul} and set(mul.users) <= inner):
        return Miss("glu_mlp", "an intermediate output is used elsewhere too")
    out, res, skipped = _residual(n, scope)
    args = tuple(a and Attr(a) for a in (gate.weight, gate.bias, up.weight, up.bias,
                                          down.weight, down.bias))
    site = glu_mlp_site(scope.ctx, kind, res is not None)
    return Hit("glu_mlp", out, site, (gate.x, *args, *([res] if res is not None else [])),
               (n, mul, *drops, act_node, *act.nodes, gate_node, up_node, *gate.inner,
                *up.inner, *down.inner, *skipped))
