"""grn_mlp (graph): ConvNeXt V2's MLP, fc1 -> GELU -> GRN -> fc2 [-> + residual], as one
Function. GRN (Global Response Normalization) over an (N, H, W, C) tensor g:
G = ||g||_2 over H and W per image and channel, n = G / (mean_C G + eps), out = gamma * (g * n)
+ beta + g. Spelled as the reference code spells it (`torch.norm(x, p=2, dim=(1, 2),
keepdim=True)`, `gamma * (x * n) + beta + x`), as timm does (`x.norm(...)`, `x +
torch.addcmul(bias.view(1, 1, 1, -1), weight.view(1, 1, 1, -1), x * n)`) and as HF
transformers does (`torch.linalg.vector_norm(x, ord=2, ...)`); any order of the sum's terms
and the product's factors.

out = g * s + beta with s = 1 + gamma * n: a per-image, per-channel scale. The site keeps only
fc1's output h0 (as the mlp site does) and the (N, 1, 1, C) norms; eager keeps fc1's output,
the GELU's, `g * n` and GRN's output (4 tensors of fc1's width). Backward rebuilds g and the
GRN's output fc2's weight gradient reads, and runs GRN's backward on (N, C) sums.

Where the act is one the grn kernel family takes (GELU, tanh GELU, SiLU, ReLU) and a native
impl is bound (C++ on CPU, Triton on CUDA: kernels/grn), everything between the GEMMs is that
kernel: two passes over fc1's width per direction, fc1's bias added in its passes (1.11-1.14x
the torch path over ConvNeXt V2-Atto's train step: docs/fused.md, forty-eighth session).
Otherwise GRN runs in torch ops after the act's own pair (BiasAct, as in the mlp site)."""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusebench.fuse.binding import Pure
from fusebench.fuse.engine import MultiOpKernel, run_ops
from fusebench.fuse.fusions.fx_mlp import FC, BiasAct, _residual_nchw, _same, _to_nchw, foldable
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import match_act, pure_act
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.fx.residual import run_ops_residual
from fusebench.fuse.fx.spelled import factors
from fusebench.kernels.grn.function import ACTS as GRN_ACTS
from fusebench.kernels.grn.function import channel_grads
from fusebench.kernels.grn.native import DTYPES as GRN_DTYPES

SPATIAL = ((1, 2), (-3, -2))        # H, W of an (N, H, W, C) tensor
CHANNEL = ((-1,), (3,))


@dataclass(frozen=True)
class Grn:
    """A GRN an fx node computes: its input, the paths of gamma and beta (1-D, or shaped
    (1, 1, 1, C)), eps, and the nodes it absorbs (all but the input)."""
    x: fx.Node
    gamma: str
    beta: str
    eps: float
    nodes: tuple


def _row_param(n) -> str | None:
    """A parameter broadcast over the last dim: 1-D, shaped (1, .., 1, C), or a 1-D one
    viewed so (`w.view(1, 1, 1, -1)`)."""
    path = N.attr_path(n)
    if path is not None:
        v = N.attr_value(n)
        ok = isinstance(v, torch.Tensor) and v.dim() >= 1 and v.numel() == v.shape[-1]
        return path if ok else None
    if N.op(n) in ("view", "reshape") and all(d == 1 for d in N.dims(n)[:-1]):
        return N.last_param(N.x_of(n))
    return None


def _terms(n, seen: list) -> list:
    """The terms of a sum rooted at n: add nodes (no alpha) and addcmul(a, b, c) (value 1,
    its product as a ('mul', b, c) term), walked through nodes used only there."""
    if N.op(n) == "add" and not n.kwargs and len(n.args) == 2:
        seen.append(n)
        return [t for a in n.args for t in (_terms(a, seen) if isinstance(a, fx.Node)
                                            and len(a.users) == 1 else [a])]
    if N.op(n) == "addcmul" and len(n.args) == 3 and not n.kwargs:
        seen.append(n)
        return [n.args[0], ("mul", n.args[1], n.args[2])]
    return [n]


def _norm_of(n) -> fx.Node | None:
    """x of a 2-norm over x's H and W with keepdim: torch.norm / Tensor.norm (p 2 or 'fro',
    the default) or torch.linalg.vector_norm (ord 2, the default)."""
    kind = N.op(n)
    if kind not in ("norm", "vector_norm"):
        return None
    p = N.arg(n, 1, "ord" if kind == "vector_norm" else "p", 2 if kind == "vector_norm" else "fro")
    d = N.arg(n, 2, "dim")
    keep = N.arg(n, 3, "keepdim", False)
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    if p not in (2, 2.0) and not (kind == "norm" and p == "fro"):
        return None
    # torch.norm's tracing spells out `out=None, dtype=None`: any other argument set is not this
    extra = {k: v for k, v in n.kwargs.items() if k not in ("p", "ord", "dim", "keepdim")}
    return N.x_of(n) if tuple(sorted(d)) in SPATIAL and keep is True and len(n.args) <= 4 \
        and all(v is None for v in extra.values()) else None


def _normalised(n, x, seen: list) -> float | None:
    """eps of n = G / (G.mean(-1, keepdim=True) + eps) with G the 2-norm of x (_norm_of)."""
    ab = N.operands(n) if N.op(n) == "div" else None
    if not ab or not isinstance(ab[1], fx.Node) or _norm_of(ab[0]) is not x:
        return None
    g_norm, den = ab
    for mean, eps in N.commuted(den, "add"):
        md = N.mean_dims(mean) if isinstance(mean, fx.Node) else None
        if md is not None and md[0] in CHANNEL and md[1] and N.x_of(mean) is g_norm \
                and N.number(eps) is not None:
            seen.extend((n, den, mean, g_norm))
            return N.number(eps)
    return None


def grn_of(n: fx.Node) -> Grn | None:
    """The GRN whose output is n, or None."""
    seen: list = []
    terms = _terms(n, seen)
    if len(terms) != 3:
        return None
    for i, x in enumerate(terms):
        if not isinstance(x, fx.Node):
            continue
        rest = [t for j, t in enumerate(terms) if j != i]
        for beta, prod in (rest, rest[::-1]):
            got = _beta_and_product(x, beta, prod, list(seen))
            if got is not None:
                return got
    return None


def _beta_and_product(x, beta, prod, seen: list) -> Grn | None:
    beta_path = _row_param(beta) if isinstance(beta, fx.Node) else None
    if beta_path is None:
        return None
    if beta.op != "get_attr":                        # a view of a 1-D parameter
        seen.append(beta)
    if isinstance(prod, tuple):                     # addcmul's b * c
        parts = []
        for f in prod[1:]:
            c, fs = factors(f, seen) if isinstance(f, fx.Node) else (None, [])
            if c != 1.0:
                return None
            parts += fs
    else:
        c, parts = factors(prod, seen) if isinstance(prod, fx.Node) else (None, [])
        if c != 1.0:
            return None
    if len(parts) != 3 or x not in parts:
        return None
    others = [f for f in parts if f is not x]
    for gam, nrm in (others, others[::-1]):
        gamma = _row_param(gam)
        eps = _normalised(nrm, x, seen) if gamma is not None else None
        if eps is not None:
            if gam.op != "get_attr":
                seen.append(gam)
            return Grn(x, gamma, beta_path, eps, tuple(dict.fromkeys(seen)))
    return None


def _norms(g, eps):
    """(G, m): the (N, 1, 1, C) norms over H and W and their channel mean + eps."""
    # a sum of squares, not torch.linalg.vector_norm: aten's norm over dims (1, 2) of an
    # (N, H, W, C) tensor ran 1.8-50x slower at ConvNeXt V2's stage shapes (0.99 vs 0.56 ms at
    # (8, 40, 40, 160), 1.97 vs 0.04 ms at (8, 5, 5, 1280), 2 threads)
    big = g.square().sum((1, 2), keepdim=True).sqrt_()
    return big, big.mean(-1, keepdim=True) + eps


def _scale(big, m, gamma):
    """s = 1 + gamma * G / m: GRN's output is g * s + beta."""
    return torch.addcmul(torch.ones_like(big), gamma.reshape(-1), big / m)


@functools.cache
def grn_mlp_kernel(ba: BiasAct, eps: float) -> MultiOpKernel:
    fc_bwd = FC["linear"].bwd

    def fwd(h0, groups, res=None):
        (b1,), (gamma, beta), (w2, *b2) = (groups[0] or (None,)), groups[1], groups[2]
        g = ba.fwd(h0, b1)
        big, m = _norms(g, eps)
        b2 = b2[0] if b2 else None
        u = torch.addcmul(beta.reshape(-1), g, _scale(big, m, gamma))
        y = FC["linear"].fwd(u, w2, b2) if res is None else FC["linear"].add(res, u, w2, b2)
        return y, ((g if ba.from_output else h0), big, m)

    def bwd(dy, saved, groups):
        (kept, big, m), (b1,) = saved, (groups[0] or (None,))
        (gamma, beta), (w2, *b2) = groups[1], groups[2]
        g = kept if ba.from_output else ba.fwd(kept, b1)
        s = _scale(big, m, gamma)
        du, weight_grads = fc_bwd(dy, kept, w2, bool(b2))
        # the GRN output fc2's weight gradient reads, rebuilt (per-image products dy_i^T g_i
        # giving dw2 and ds without it ran 0.94x; docs/fused.md, forty-seventh session)
        dw2, db2 = weight_grads(torch.addcmul(beta.reshape(-1), g, s))
        # GRN's backward on (N, C) sums, as the grn family's impls run it
        k, dgamma, dbeta = channel_grads((du * g).sum((1, 2)), du.sum((1, 2)), big.flatten(1),
                                         m.flatten(), gamma, beta)
        dg = du.mul_(s).addcmul_(g, k[:, None, None])
        if ba.from_output:
            dh, db1 = ba.from_output(dg, kept), None
        else:
            dh, db1 = ba.bwd(dg, kept, b1)
        return dh, ((db1,) if b1 is not None else (), (dgamma, dbeta),
                    (dw2, db2) if b2 else (dw2,))
    return MultiOpKernel(f"grn_mlp[{ba.act.impl}]", fwd, bwd)


@functools.cache
def grn_pair_kernel(pair: Pure, act: str, eps: float) -> MultiOpKernel:
    """The site with GRN's elementwise part in the bound grn family pair (kernels/grn: the C++
    or Triton kernels, two passes over fc1's width per direction, g recomputed in each):
    fc1's bias added there too, so its gradient comes out of the second backward pass."""
    fc_bwd = FC["linear"].bwd

    def fwd(h0, groups, res=None):
        (b1,), (gamma, beta), (w2, *b2) = (groups[0] or (None,)), groups[1], groups[2]
        u, big, m = pair.fwd(h0, b1, gamma, beta, eps, act)
        b2 = b2[0] if b2 else None
        y = FC["linear"].fwd(u, w2, b2) if res is None else FC["linear"].add(res, u, w2, b2)
        return y, (h0, big, m)

    def bwd(dy, saved, groups):
        (h0, big, m), (b1,) = saved, (groups[0] or (None,))
        (gamma, beta), (w2, *b2) = groups[1], groups[2]
        du, weight_grads = fc_bwd(dy, h0, w2, bool(b2))
        dh, db1, dgamma, dbeta, u = pair.bwd(du, h0, b1, gamma, beta, big, m, act, True)
        dw2, db2 = weight_grads(u)
        return dh, ((db1,) if b1 is not None else (), (dgamma, dbeta),
                    (dw2, db2) if b2 else (dw2,))
    return MultiOpKernel(f"grn_mlp[{pair.impl}]", fwd, bwd)


@functools.cache
def act_kernel(ba: BiasAct) -> MultiOpKernel:
    """act(h0 [+ b1]) alone, for the site's path where the input is not 4-D."""
    def fwd(h0, groups):
        return ba.fwd(h0, groups[0][0] if groups[0] else None), (h0,)

    def bwd(dy, saved, groups):
        b1 = groups[0][0] if groups[0] else None
        dh, db1 = ba.bwd(dy, saved[0], b1)
        return dh, ((db1,) if b1 is not None else (),)
    return MultiOpKernel(f"act[{ba.act.impl}]", fwd, bwd)


def grn_eager(g, gamma, beta, eps):
    """GRN as the reference writes it, in autograd's ops: the site's path where the input is
    not 4-D (dims (1, 2) are then not H and W: not what the kernel computes)."""
    big, m = _norms(g, eps)
    return gamma * (g * (big / m)) + beta + g


def grn_mlp_site(ba: BiasAct, eps: float, residual: bool, nchw_out: bool,
                 pair: tuple[Pure, str] | None = None) -> Site:
    """run(x, w1, b1, gamma, beta, w2, b2[, res]): with residual, res + the MLP (the add in
    fc2's GEMM where layouts allow); nchw_out: the rows go back to (N, C, H, W) first. pair:
    the bound grn family pair and its act name, where the act is one it takes."""
    torch_kernel = grn_mlp_kernel(ba, eps)
    kernel = grn_pair_kernel(*pair, eps) if pair else torch_kernel
    takes = GRN_DTYPES.get(pair[0].impl, ()) if pair else ()
    bias_in_fc1 = ba.bias_in_fc1 and not pair
    fc = FC["linear"]

    def run(x, w1, b1, gamma, beta, w2, b2, *rest):
        res = rest[0] if residual else None
        back, acc = (_to_nchw, res.permute(0, 2, 3, 1) if res is not None and res.dim() == 4
                     else None) if nchw_out else (_same, res)
        if x.dim() != 4:          # fc1's output is not (N, H, W, C): the GRN as written
            h0 = fc.fwd(x, w1, b1 if ba.bias_in_fc1 else None)
            g = run_ops(act_kernel(ba), h0, ((None if ba.bias_in_fc1 else b1,),))
            y = back(fc.fwd(grn_eager(g, gamma, beta, eps), w2, b2))
            return y if res is None else y + res
        h0 = fc.fwd(x, w1, b1 if bias_in_fc1 else None)
        groups, kern = ((None if bias_in_fc1 else b1,), (gamma, beta), (w2, b2)), kernel
        if pair and h0.dtype not in takes:   # float64 on CUDA, float16 on CPU: torch's ops
            warnings.warn(f"grn_mlp: the grn {pair[0].impl} kernel does not take {h0.dtype}; "
                          f"ran GRN in torch ops")
            if ba.bias_in_fc1 and b1 is not None:
                h0 = h0 + b1
            groups, kern = ((None if ba.bias_in_fc1 else b1,), *groups[1:]), torch_kernel
        if res is None:
            return run_ops(kern, h0, groups)
        if acc is None or not foldable(acc, h0, w2, "linear"):
            return back(run_ops(kern, h0, groups)) + res
        return back(run_ops_residual(kern, h0, groups, acc))
    return Site("fused_grn_mlp", run)


@register_pattern("grn_mlp", benches=("train", "infer"))
def grn_mlp(n, scope):
    """Linear -> GELU (any act with a kernel) [-> identity dropouts] -> GRN [-> identities] ->
    Linear [-> + residual] -> one Function."""
    fc2 = N.fc(n)
    if not isinstance(fc2, tuple):
        return None
    out, drops2 = N.above_identities(fc2.x, scope.ctx.bench)
    grn = grn_of(out) if out is not None else None
    if grn is None:
        return None
    if fc2.kind != "linear":
        return Miss("grn_mlp", "GRN before a 1x1 conv or Conv1D (only Linear fc2 is fused)")
    act_node, drops1 = N.above_identities(grn.x, scope.ctx.bench)
    act = match_act(act_node) if act_node is not None else None
    if act is None or isinstance(act, str):
        return Miss("grn_mlp", act or "GRN whose input is not an activation")
    fc1 = N.fc(act.x)
    if not isinstance(fc1, tuple) or fc1.kind != "linear":
        return Miss("grn_mlp", fc1 if isinstance(fc1, str) else "no Linear before the act")
    inside = {*grn.nodes, *drops1, *drops2, n}
    if not set(grn.x.users) <= inside or not set(act.x.users) <= {act_node, *act.nodes} \
            or any(not set(k.users) <= inside for k in grn.nodes if k is not out) \
            or (act_node is not grn.x and len(act_node.users) != 1) \
            or not set(out.users) <= {*drops2, n}:
        return Miss("grn_mlp", "an intermediate output is used elsewhere too")
    bias_gelu = scope.ctx.act("bias_gelu") if act.kind == "gelu" and fc1.bias else None
    ba = BiasAct(pure_act(act.kind, act.approximate, scope.ctx), bias_gelu, act.approximate, -1)
    name = "gelu_tanh" if act.kind == "gelu" and act.approximate == "tanh" else act.kind
    bound = scope.ctx.act("grn") if name in GRN_ACTS else None
    # the grn family's torch pair would run the act in aten too: the site's own torch path
    # keeps the act in its bound kernel (bias_gelu's C++ one on CPU)
    pair = (bound, name) if bound is not None and bound.impl != "function" else None
    args = (Attr(fc1.weight), fc1.bias and Attr(fc1.bias), Attr(grn.gamma), Attr(grn.beta),
            Attr(fc2.weight), fc2.bias and Attr(fc2.bias))
    nodes = (*drops2, *grn.nodes, *drops1, act_node, *act.nodes, act.x, *fc2.inner)
    end, res, skipped, nchw_out = _residual_nchw(n, scope)
    if res is not None:
        args = (*args, res)
    return Hit("grn_mlp", end, grn_mlp_site(ba, grn.eps, res is not None, nchw_out, pair),
               (fc1.x, *args), (*nodes, *skipped))
