"""glu_mlp (graph): a gated MLP, down(act(gate(x)) * up(x)) (LLaMA's and Mistral's SwiGLU,
GeGLU, ReGLU), gate / up / down = nn.Linear or F.linear over the last dim with or without
biases, act = SiLU / GELU / ReLU in any spelling match_act reads, optionally then
`res + ...` -> one Function: the two projections, the gate (the bound glu kernel: one pass per
direction), the down projection, the residual as its GEMM's accumulator. It saves x, a =
gate(x) and b = up(x); eager also keeps act(a) and the product for backward, which rebuilds
the product for the down projection's weight gradient in the same pass as da and db.
Packed: gate and up as the halves of one projection, `h, gate = proj(x).chunk(2, dim=-1)`
(or `torch.chunk`, `.split(half, -1)`; either half the gate: Phi-3, the GEGLU of diffusion
models) -> the same Function with one projection GEMM, the kernel reading both halves in place
and writing their gradient packed, the projection's backward one GEMM each for dx and dw."""
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
from fusebench.kernels.glu.function import glu_bwd, glu_fwd, glu_packed_bwd, glu_packed_fwd

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


def glu_mlp_site(ctx, act: str, packed: bool, gate_second: bool = False) -> Site:
    """run(x, (weight, bias) per Linear..., [res]): the projections (gate and up, or the
    packed one) then down, with the glu pair bound for this fuse(); plain torch ops for a
    dtype the bound C++ kernel does not take (float16 on CPU). The residual folds into the
    down projection's GEMM where its layout lets it."""
    pair = ctx.act("glu_packed" if packed else "glu")
    if packed:
        kernel = glu_packed_kernel(pair.fwd, pair.bwd, pair.impl, act, gate_second)
        torch_kernel = glu_packed_kernel(glu_packed_fwd, glu_packed_bwd, "function", act,
                                         gate_second)
    else:
        kernel = glu_mlp_kernel(pair.fwd, pair.bwd, pair.impl, act)
        torch_kernel = glu_mlp_kernel(glu_fwd, glu_bwd, "function", act)
    n = 4 if packed else 6                       # weight and bias of each Linear

    def run(x, *args):
        k = torch_kernel if pair.impl == "cpu" and x.dtype not in CPU_DTYPES else kernel
        groups = tuple(zip(args[:n:2], args[1:n:2]))
        wd, res = args[n - 2], args[n:]
        if not res:
            return run_ops(k, x, groups)
        if not foldable(res[0], x, wd, "linear"):
            return run_ops(k, x, groups) + res[0]        # eager's add, the same numbers
        return run_ops_residual(k, x, groups, res[0])
    return Site("fused_glu_mlp", run)


@functools.cache
def glu_packed_kernel(fwd_gate, bwd_gate, impl: str, act: str,
                      gate_second: bool) -> MultiOpKernel:
    """groups: ((w_proj[, b_proj]), (w_down[, b_down])); proj's output is [gate, up] along
    its last dim ([up, gate]: gate_second)."""
    def fwd(x, groups, res=None):
        (w, *b), (wd, *bd) = groups
        ab = gemm.nt(x, w, *b)
        p = fwd_gate(ab, act, gate_second)
        y = gemm.nt(p, wd, *bd) if res is None else gemm.nt_add(res, p, wd, *bd)
        return y, (x, ab)

    def bwd(dy, saved, groups):
        (x, ab), ((w, *b), (wd, *bd)) = saved, groups
        dy2 = _rows(dy)
        dp = gemm.nn(dy2, wd).view(*ab.shape[:-1], wd.shape[1])
        dab, p = bwd_gate(dp, ab, act, gate_second, True)
        dab2 = _rows(dab)
        grads = ((gemm.wgrad(dab2, _rows(x)), *(dab2.sum(0) for _ in b)),
                 (gemm.wgrad(dy2, p), *(dy2.sum(0) for _ in bd)))
        return gemm.nn(dab2, w).view(x.shape), grads
    side = "up,gate" if gate_second else "gate,up"
    return MultiOpKernel(f"glu_mlp[{act},{impl},packed {side}]", fwd, bwd)


def _half(n, chunk) -> int | None:
    """0 / 1: which half of `chunk`'s two outputs getitem node n takes, else None."""
    if N.op(n) != "getitem" or N.x_of(n) is not chunk:
        return None
    i = n.args[1] if len(n.args) > 1 else None
    return i if i in (0, 1) else None


def _splits_in_halves(c, width: int) -> bool:
    """c is `t.chunk(2, -1)` / `torch.chunk(t, 2, dim=-1)` or `t.split(width // 2, -1)`."""
    dim = N.arg(c, 2, "dim", 0)
    if dim != -1:
        return False
    if N.op(c) == "chunk":
        return N.arg(c, 1, "chunks") == 2
    size = N.arg(c, 1, "split_size_or_sections", N.arg(c, 1, "split_size"))
    return N.op(c) == "split" and width % 2 == 0 and size in (width // 2, [width // 2] * 2,
                                                               (width // 2,) * 2)


def _packed(mul):
    """(act, act node, proj FcCall, proj node, chunk node, (gate item, up item), gate_second)
    when mul = act(gate) * up with gate, up the halves of one Linear's output; a reason; or
    None."""
    for act_node, up_item in N.commuted(mul, "mul"):
        act = match_act(act_node)
        if act is None or isinstance(act, str) or N.op(N.x_of(act.x)) not in ("chunk", "split"):
            continue
        chunk = N.x_of(act.x)
        gate_i, up_i = _half(act.x, chunk), _half(up_item, chunk)
        if gate_i is None or up_i is None or gate_i == up_i:
            continue
        proj_node = N.x_of(chunk)
        proj = N.fc(proj_node)
        if not isinstance(proj, tuple) or proj.kind != "linear":
            return "the packed gate / up projection is not a Linear over the last dim"
        m = N.module(proj_node)
        width = m.out_features if m is not None else \
            proj_node.graph.owning_module.get_parameter(proj.weight).shape[0]
        if not _splits_in_halves(chunk, width):
            return "the projection is split other than in two halves along its last dim"
        return act, act_node, proj, proj_node, chunk, (act.x, up_item), gate_i == 1
    return None


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


def _act_kind(act):
    kind = GLU_ACT.get((act.kind, act.approximate))
    return kind, None if kind else Miss("glu_mlp", f"activation {act.kind}: the glu kernels "
                                                   f"compute SiLU, GELU and ReLU")


def _packed_hit(n, down, mul, drops, got, scope):
    if isinstance(got, str):
        return Miss("glu_mlp", got)
    act, act_node, proj, proj_node, chunk, (gate_item, up_item), gate_second = got
    kind, miss = _act_kind(act)
    if miss:
        return miss
    inner = {n, *down.inner, *drops}
    if not (set(proj_node.users) == {chunk} and set(chunk.users) == {gate_item, up_item}
            and set(gate_item.users) <= {act_node, *act.nodes}
            and set(act_node.users) == {mul} and set(up_item.users) == {mul}
            and set(mul.users) <= inner):
        return Miss("glu_mlp", "an intermediate output is used elsewhere too")
    out, res, skipped = _residual(n, scope)
    args = tuple(a and Attr(a) for a in (proj.weight, proj.bias, down.weight, down.bias))
    site = glu_mlp_site(scope.ctx, kind, True, gate_second)
    return Hit("glu_mlp", out, site, (proj.x, *args, *([res] if res is not None else [])),
               (n, mul, *drops, act_node, *act.nodes, gate_item, up_item, chunk, proj_node,
                *proj.inner, *down.inner, *skipped))


@register_pattern("glu_mlp", benches=("train", "infer"))
def glu_mlp(n, scope):
    """down(act(gate(x)) * up(x)) [-> + residual] -> one Function (gate and up two Linears,
    or the halves of one)."""
    down = N.fc(n)
    if not isinstance(down, tuple):
        return None
    mul, drops = N.above_identities(down.x, scope.ctx.bench)
    if N.op(mul) != "mul":
        return None
    packed = _packed(mul)
    if packed is not None:
        if down.kind != "linear":
            return Miss("glu_mlp", "the down projection is not a Linear over the last dim")
        return _packed_hit(n, down, mul, drops, packed, scope)
    got = _gate_and_up(mul)
    if got is None:
        return None
    if isinstance(got, str):
        return Miss("glu_mlp", got)
    act, act_node, gate, up_node, up = got
    kind, miss = _act_kind(act)
    if miss:
        return miss
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
    site = glu_mlp_site(scope.ctx, kind, False)
    return Hit("glu_mlp", out, site, (gate.x, *args, *([res] if res is not None else [])),
               (n, mul, *drops, act_node, *act.nodes, gate_node, up_node, *gate.inner,
                *up.inner, *down.inner, *skipped))
