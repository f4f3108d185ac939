"""mlp (graph): fc1 -> GELU/SiLU -> fc2 [-> * gamma], fc = nn.Linear / F.linear over the last
dim, a 1x1 nn.Conv2d over NCHW (ConvNeXt's pwconv1/pwconv2 with layer scale, a GPT's
c_fc/c_proj), or HF transformers' Conv1D (GPT-2's c_fc/c_proj: addmm on a weight stored
(in, out), no layer scale). One Function does the activation + fc2 (+ gamma, folded into fc2's
weight and bias inside the Function) and saves only fc1's output; the activation fc2's weight
gradient needs is recomputed in backward. GELU with a bias runs the bias_gelu act family bound
for this fuse(), fc1's bias added in that kernel's pass (fc1 runs without it); the rest runs
aten's ops, fc1's bias in fc1's GEMM."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusebench.fuse import gemm, layer_scale, mlp_blocks
from fusebench.fuse.binding import Pure
from fusebench.fuse.conv1x1 import channels_last, conv1x1, conv1x1_add
from fusebench.fuse.engine import MultiOpKernel, conv_bwd, run_ops
from fusebench.fuse.fusions.fx_ln_linear import ln_args, ln_before
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fusions.fx_se import match_se
from fusebench.fuse.fx.acts import match_act, pure_act
from fusebench.fuse.fx.ln_linear_kernel import ln_linear
from fusebench.fuse.fx.residual import run_ops_residual
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern


def _linear_bwd(dy, x_like, w, has_bias):
    """(dx, weight_grads) of linear(g, w): dx now, weight_grads(g) -> (dw, db|None) later, so
    a caller can rebuild g after dx (with the activation's backward) from one reshape of dy."""
    # dy arrives as the permuted view of an NCHW-strided grad in ConvNeXt (the residual's):
    # `dy @ w` on that ran a batched bmm; one reshape (a copy only where needed) and mm instead
    dy2 = dy.reshape(-1, dy.shape[-1])
    return gemm.nn(dy2, w).view(*dy.shape[:-1], w.shape[1]), \
        lambda g: (gemm.wgrad(dy2, g), dy2.sum(0) if has_bias else None)


def _conv1x1_bwd(dy, x_like, w, has_bias):
    """_linear_bwd's split for a 1x1 conv. On channels-last activations, GEMMs on their
    (N*H*W, C) views, which are free: two convolution_backward calls (dx, then dw / db) cost
    1.3x the single call at 8x160x40x40, the GEMMs 0.6x (1 thread; docs/fused.md, twelfth
    session); aten's backward as two calls otherwise."""
    if channels_last(x_like):
        dx, weight_grads = _linear_bwd(dy.permute(0, 2, 3, 1), None, w.flatten(1), has_bias)
        return dx.permute(0, 3, 1, 2), \
            lambda g: _as_conv(weight_grads(g.permute(0, 2, 3, 1)), w)
    dx = conv_bwd(dy, x_like, w, False, mask=(True, False, False))[0]
    return dx, lambda g: conv_bwd(dy, g, w, has_bias, mask=(False, True, True))[1:]


def _as_conv(grads, w):
    dw, db = grads
    return dw.view(w.shape), db


def _conv1d_bwd(dy, x_like, w, has_bias):
    """_linear_bwd's split for a weight stored (in, out) (HF's Conv1D): its gradient comes out
    in that layout, g^T @ dy."""
    dy2 = dy.reshape(-1, dy.shape[-1])
    return gemm.nn(dy2, w.t()).view(*dy.shape[:-1], w.shape[0]), \
        lambda g: (gemm.wgrad(g, dy2), dy2.sum(0) if has_bias else None)


@dataclass(frozen=True)
class Fc:
    """One spelling of an MLP's fc: fwd(x, w, b), bwd (the split backward above), its channel
    dim, add(res, x, w, b) = res + fwd with res as the GEMM's accumulator, rows(res, h0):
    whether res and h0's layouts let that GEMM take res as they are, and the weight's output
    dim (1: stored (in, out))."""
    fwd: Callable
    bwd: Callable
    cdim: int
    add: Callable
    rows: Callable[..., bool]
    odim: int = 0


def _contiguous_rows(res, h0) -> bool:
    return res.is_contiguous()


FC = {"linear": Fc(gemm.linear, _linear_bwd, -1, gemm.nt_add, _contiguous_rows),
      # conv1x1_add's GEMM rows are the (N, H, W, C) views: channels-last res and h0
      "conv2d": Fc(conv1x1, _conv1x1_bwd, 1, conv1x1_add,
                   lambda res, h0: channels_last(res) and channels_last(h0)),
      # w.t(): a strided view, which aten's addmm reads as it is (oneDNN's path wants it
      # contiguous, so these GEMMs stay aten's)
      "conv1d": Fc(lambda x, w, b=None: gemm.linear(x, w.t(), b), _conv1d_bwd, -1,
                   lambda res, x, w, b=None: gemm.nt_add(res, x, w.t(), b), _contiguous_rows,
                   odim=1)}


# acts whose derivative reads off their output g alike (g > 0; 0 < g < 6, as aten's
# hardtanh_backward reads z): the site keeps g, as eager's ReLU does, and recomputes nothing
FROM_OUTPUT = {"relu": lambda dg, g: torch.ops.aten.threshold_backward(dg, g, 0),
               "relu6": lambda dg, g: torch.ops.aten.hardtanh_backward(dg, g, 0.0, 6.0)}


class BiasAct:
    """act(h0 + b1) and its backward (dh, db1) along the fc's channel dim; b1 may be None.
    from_output(dg, g): the act's backward from its output, for FROM_OUTPUT's acts."""

    def __init__(self, act: Pure, bias_gelu: Pure | None, approximate: str, cdim: int):
        self.act, self.bias_gelu, self.approx, self.cdim = act, bias_gelu, approximate, cdim
        self.from_output = FROM_OUTPUT.get(act.impl)
        # fc1's bias stays in fc1's GEMM (addmm's epilogue) unless a bias_gelu kernel adds it
        # in its own pass: otherwise `h0 + b1` would be one more pass over fc1's output in
        # forward and two in backward (the rebuild and the derivative), which made a SiLU MLP
        # slower than eager's (docs/fused.md, forty-fifth session)
        self.bias_in_fc1 = self.from_output is not None or bias_gelu is None

    def _nchw(self, h):
        """bias_gelu's (N, C, H, W) operand. A linear's (..., C) goes in as the free view
        (1, C, 1, M): channels-last strides, so the C++ kernel's row path runs on it (the
        (M, C, 1, 1) view this was before counts as NCHW, so the layout pick sent it to aten's
        add + gelu: an extra pass, 1.05-2.3x slower at ConvNeXt's widths, docs/fused.md)."""
        return h.reshape(-1, h.shape[-1]).t()[None, :, None, :] if self.cdim == -1 else h

    def _back(self, y, h):      # _nchw's inverse for the kernel's output
        return y[0, :, 0, :].t().reshape(h.shape) if self.cdim == -1 else y

    def _bc(self, b, h):
        return b if self.cdim == -1 else b[:, None, None]

    def fwd(self, h0, b1):
        if b1 is not None and self.bias_gelu is not None:
            return self._back(self.bias_gelu.fwd(self._nchw(h0), b1, self.approx), h0)
        return self.act.fwd(h0 if b1 is None else h0 + self._bc(b1, h0))

    def bwd(self, dg, h0, b1):
        if b1 is not None and self.bias_gelu is not None:
            dh, db = self.bias_gelu.bwd(self._nchw(dg), self._nchw(h0), b1, self.approx)
            return self._back(dh, h0), db
        dh = self.act.bwd(dg, h0 if b1 is None else h0 + self._bc(b1, h0))
        other = [d for d in range(dh.dim()) if d != self.cdim % dh.dim()]
        return dh, (dh.sum(other) if b1 is not None else None)

    def bwd_recomputing(self, dg, h0, b1):
        """(dh, db1, act(h0 + b1)) in one kernel where the bound bias_gelu has one, else None."""
        if b1 is None or self.bias_gelu is None or self.bias_gelu.bwd_y is None:
            return None
        dh, db, g = self.bias_gelu.bwd_y(self._nchw(dg), self._nchw(h0), b1, self.approx)
        return self._back(dh, h0), db, self._back(g, h0)


def _same(t):
    return t


def mlp_backward(ba: BiasAct, fc_bwd, dy, h0, b1, w2, has_b2, drop=_same):
    """(dh, db1, dw2, db2) of fc2(drop(act(h0 + b1))) from the saved h0: fc2's dx first, then
    the activation's backward, which also rebuilds the activation fc2's weight gradient needs
    (bias_gelu's bwd_y: one pass, one exp per value; else act.fwd, then act.bwd). drop(t):
    t through the forward's dropout mask (the identity where there is none)."""
    dg, weight_grads = fc_bwd(dy, h0, w2, has_b2)
    dg = drop(dg)
    got = ba.bwd_recomputing(dg, h0, b1)
    if got is None:
        g = ba.fwd(h0, b1)
        dh, db1 = ba.bwd(dg, h0, b1)
    else:
        dh, db1, g = got
    return (dh, db1, *weight_grads(drop(g)))


def _dropout(g, p: float):
    """(F.dropout(g, p, True), what backward masks with), drawn as F.dropout draws it, so that
    a seeded step masks as eager's does. aten's dropout runs native_dropout (a bool mask) on
    CUDA / XPU, and on CPU multiplies by a float noise tensor, bernoulli_(1 - p) / (1 - p):
    that noise is kept (a multiply by a bool mask ran 4x slower than by floats on CPU)."""
    if g.device.type in ("cuda", "xpu"):
        return torch.native_dropout(g, p, True)
    noise = torch.empty_like(g).bernoulli_(1 - p).div_(1 - p)
    return g * noise, noise


def _dropped(mask, p: float):
    """t -> t through _dropout's mask: the mask's gradient, and the dropout's output rebuilt
    from the act's (t * mask, as aten's own dropout computes both)."""
    if mask is None:
        return _same
    if mask.dtype == torch.bool:
        return lambda t: torch.ops.aten.native_dropout_backward(t, mask, 1.0 / (1.0 - p))
    return lambda t: t * mask


@functools.cache
def mlp_kernel(ba: BiasAct, fc: str, p: float = 0.0) -> MultiOpKernel:
    """p: a live dropout's between the act and fc2 (0 < p < 1), drawn as F.dropout draws it
    (_dropout); its mask is saved, the dropout's output rebuilt in backward (eager keeps
    both)."""
    fc_fwd, fc_bwd, fc_add, cdim = FC[fc].fwd, FC[fc].bwd, FC[fc].add, FC[fc].cdim

    def unpack(groups):
        g1, g2, g3 = groups
        gamma = g3[0].reshape(-1) if g3 else None
        return (g1[0] if g1 else None), g2[0], (g2[1] if len(g2) > 1 else None), gamma

    def fwd(h0, groups, res=None):
        b1, w2, b2, gamma = unpack(groups)
        g = ba.fwd(h0, b1)
        keep = g if ba.from_output else h0     # what backward rebuilds the rest from
        saved = (keep,)
        if p:
            g, mask = _dropout(g, p)
            saved = (keep, mask)
        if gamma is not None and layer_scale.on_rows(      # fc2's output kept for dgamma
                w2, h0.numel() // h0.shape[cdim] * w2.shape[FC[fc].odim]):
            t = fc_fwd(g, w2, b2)
            return layer_scale.scaled(t, gamma, cdim, res), (*saved, t)
        if res is None:
            return fc_fwd(g, *layer_scale.fold(w2, b2, gamma)), saved
        return fc_add(res, g, *layer_scale.fold(w2, b2, gamma)), saved

    def bwd(dy, saved, groups):
        (kept, *rest), (b1, w2, b2, gamma) = saved, unpack(groups)
        drop = _dropped(rest[0] if p else None, p)
        gamma_shape = groups[2][0].shape if gamma is not None else None
        on_rows = len(rest) > bool(p)           # forward saved fc2's unscaled output too
        if on_rows:
            dy, dgam = layer_scale.scaled_grads(dy, rest[-1], gamma, cdim, gamma_shape)
            w2f, b2f = w2, b2
        else:
            w2f, b2f = layer_scale.fold(w2, b2, gamma)
        if ba.from_output:                    # kept = g; fc1's bias is in fc1's own GEMM
            dg, weight_grads = fc_bwd(dy, kept, w2f, b2 is not None)
            dh, db1 = ba.from_output(drop(dg), kept), None
            dw2f, db2f = weight_grads(drop(kept))
        else:
            dh, db1, dw2f, db2f = mlp_backward(ba, fc_bwd, dy, kept, b1, w2f, b2 is not None,
                                               drop)
        if on_rows:
            fc2_grads, gamma_grads = (dw2f, db2f) if b2 is not None else (dw2f,), (dgam,)
        else:
            fc2_grads, gamma_grads = layer_scale.unfold_grads(dw2f, db2f, w2, b2, gamma,
                                                              gamma_shape)
        return dh, ((db1,) if b1 is not None else (), fc2_grads, gamma_grads)
    return MultiOpKernel(f"mlp[{fc},{ba.act.impl}{f',dropout {p}' if p else ''}]", fwd, bwd)


def mlp_site(ba: BiasAct, fc: str, ln_eps: float | None = None,
             residual: bool = False, p: float = 0.0, nchw_out: bool = False) -> Site:
    """run(x, [ln weight, ln bias,] w1, b1, w2, b2, [res,] [gamma]): with ln_eps, fc1 takes
    LayerNorm(x) (ln_linear); with residual, res + the MLP, the add inside fc2's GEMM; p: a
    live dropout between the act and fc2; nchw_out: the MLP's (N, H, W, C) rows go back to
    (N, C, H, W) before the add (`res + y.permute(0, 3, 1, 2)`), so fc2's GEMM accumulates
    into res's (N, H, W, C) view: rows of a channels-last res."""
    kernel, fc_fwd = mlp_kernel(ba, fc, p), FC[fc].fwd
    # the row-block schedule (fuse/mlp_blocks.py) takes fc1 too: a GELU with fc1's bias on an
    # act kernel (C++ or Triton), no LayerNorm before fc1, no live dropout, a weight stored
    # (out, in)
    impl = mlp_blocks.binds(ba.bias_gelu)
    blocks = mlp_blocks.kernel(impl, fc == "conv2d", ba.approx) \
        if impl and ln_eps is None and not p and fc != "conv1d" else None

    def run(x, *args):
        if ln_eps is not None:
            lw, lb, *args = args
        w1, b1, w2, b2, *rest = args
        res, gamma = (rest[0], rest[1:]) if residual else (None, rest)
        gamma = gamma[0] if gamma else None
        # the accumulator: res, or with nchw_out its (N, H, W, C) view (none for a res that
        # only broadcasts); where it cannot be one, eager's (permute and) add, same numbers
        back, acc = (_to_nchw, res.permute(0, 2, 3, 1) if res is not None and res.dim() == 4
                     else None) if nchw_out else (_same, res)
        fold = res is not None and acc is not None and foldable(acc, x, w2, fc)
        if blocks is not None and \
                mlp_blocks.takes(impl, x, fc == "conv2d", w1, b1, w2, b2, gamma,
                                 acc if fold else None):
            groups = ((w1, b1), (w2, b2), (gamma,))
            if res is None:
                return run_ops(blocks, x, groups)
            return back(run_ops_residual(blocks, x, groups, acc)) if fold \
                else back(run_ops(blocks, x, groups)) + res
        # fc1 without its bias where the bias_gelu kernel adds it (it saves fc1's output and
        # rebuilds act(h0 + b1) in backward), with it otherwise (BiasAct.bias_in_fc1); LN(x)
        # recomputed in backward with ln_eps
        b_in = b1 if ba.bias_in_fc1 else None
        h0 = fc_fwd(x, w1, b_in) if ln_eps is None else ln_linear(x, ln_eps, lw, lb, w1, b_in)
        groups = ((None if ba.bias_in_fc1 else b1,), (w2, b2), (gamma,))
        if res is None:
            return run_ops(kernel, h0, groups)
        if not fold:
            return back(run_ops(kernel, h0, groups)) + res
        return back(run_ops_residual(kernel, h0, groups, acc))
    return Site("fused_mlp", run)


def _to_nchw(t):
    return t.permute(0, 3, 1, 2)


def foldable(res, h0, w2, fc: str) -> bool:
    """res can be fc2's GEMM accumulator: the output's shape, dtype and the GEMM's row layout."""
    shape = list(h0.shape)
    shape[FC[fc].cdim] = w2.shape[FC[fc].odim]
    return (list(res.shape) == shape and res.dtype == h0.dtype == w2.dtype
            and FC[fc].rows(res, h0) and not torch.is_autocast_enabled(res.device.type))


def ln_prologue(fc1_node, x, scope):
    """(ln node, (x, eps, lw, lb)) when ln_linear is asked for and a LayerNorm feeds fc1."""
    if "ln_linear" not in scope.ctx.opt_in or scope.ctx.bench != "train":
        return None
    got = ln_before(fc1_node, x)
    return (got[0], ln_args(got[1])) if isinstance(got, tuple) else None   # no shape queries


def _gamma(fc2, op: str, scope):
    """(mul node, gamma path) when fc2's only use is a layer-scale multiply."""
    u = N.single_user(fc2)
    if u is None or N.op(u) != "mul":
        return None, None
    a, b = N.operands(u) or (None, None)
    other = b if a is fc2 else a
    path = N.last_param(other) if op == "linear" else N.channel_param(other)
    return (u, path) if path else (None, None)


def _residual(out, scope):
    """(the add node, the residual, nodes skipped) when out's only use is `res + out` (through
    identity dropouts); else (out, None, ())."""
    skipped, u = [], N.single_user(out)
    while u is not None and N.identity_dropout(u, scope.ctx.bench):
        skipped.append(u)
        u = N.single_user(u)
    ab = N.operands(u) if u is not None and N.op(u) == "add" and len(u.args) == 2 \
        and not u.kwargs else None
    last = skipped[-1] if skipped else out
    if not ab or last not in ab or ab[0] is ab[1]:
        return out, None, ()
    res = ab[1] if ab[0] is last else ab[0]
    if not isinstance(res, fx.Node):
        return out, None, ()
    return u, res, (out, *skipped)


def _residual_nchw(out, scope):
    """_residual, also through a permute of a linear's (N, H, W, C) rows back to (N, C, H, W)
    first: the official ConvNeXt block's `shortcut + x.permute(0, 3, 1, 2)`. (the add node, the
    residual, nodes skipped, whether the permute was there)."""
    u = N.single_user(out)
    if u is not None and N.is_permute(u, (0, 3, 1, 2)):
        add, res, skipped = _residual(u, scope)
        if res is not None:
            return add, res, (out, *skipped), True
    return (*_residual(out, scope), False)


def _live_dropout(drop, fc2_node, fc2, below: tuple, bench: str):
    """A live dropout (p > 0, training) between an MLP's act and fc2 (nn.TransformerEncoderLayer's
    `dropout`, default p 0.1): (the act's node, the dropout and identities above it, p); a
    Miss where it cannot join the site; None where it is no MLP's (a classifier's
    `Dropout -> Linear`). `below`: the identities between it and fc2."""
    above, more = N.above_identities(N.x_of(drop), bench)
    act = match_act(above) if above is not None else None
    if act is None or isinstance(act, str) or not isinstance(N.fc(act.x), tuple):
        return None
    p = N.dropout_p(drop)
    if p is None or not 0 < p < 1:
        return Miss("mlp", "a dropout between the activation and fc2 whose p is not a "
                           "constant in (0, 1)")
    into = len(drop.users) == 1 if below else set(drop.users) <= {fc2_node, *fc2.inner}
    if not into:
        return Miss("mlp", "an intermediate output is used elsewhere too")
    return above, (drop, *more), float(p)


def _gates_an_se(fc2, depth: int = 6) -> bool:
    """fc2's output becomes an SE's gate (through the sigmoid and views): SENet's Linear SE on
    `pool(x).view(b, c)`, which the se_gate pattern takes at the multiply further down."""
    u = N.single_user(fc2)
    for _ in range(depth):
        if u is None:
            return False
        if N.op(u) == "mul":
            return isinstance(match_se(u), tuple)
        u = N.single_user(u)
    return False


@register_pattern("mlp", benches=("train", "infer"))
def mlp(n, scope):
    """Linear/1x1-conv -> GELU/SiLU [-> identity dropouts] -> Linear/1x1-conv [-> * gamma]
    [-> + residual] -> one Function."""
    fc2 = N.fc(n)
    act_node, drops = N.above_identities(fc2.x, scope.ctx.bench) if isinstance(fc2, tuple) \
        else (None, ())
    p = 0.0
    if N.op(act_node) == "dropout":    # one above_identities did not skip: p > 0 in training
        live = _live_dropout(act_node, n, fc2, drops, scope.ctx.bench)
        if not isinstance(live, tuple):
            return live
        act_node, more, p = live
        drops = (*drops, *more)
    act = match_act(act_node) if act_node is not None else None
    if act is None:
        return None
    if isinstance(act, str):   # a candidate only where an fc feeds the act (not a BN: MobileNet)
        return Miss("mlp", act) if isinstance(N.fc(N.x_of(act_node)), tuple) else None
    fc1 = N.fc(act.x)
    if isinstance(fc1, str) or isinstance(fc2, str):
        return Miss("mlp", next(r for r in (fc1, fc2) if isinstance(r, str)))
    if fc1 is None or N.op(fc1.x) == "adaptive_avg_pool2d" or N.mean_dims(fc1.x) \
            or _gates_an_se(n):
        return None                     # on a pooled (N, C) vector: the squeeze-excite pattern
    if fc1.kind != fc2.kind:
        return Miss("mlp", "fc1 and fc2 are different kinds (Linear, 1x1 conv, Conv1D)")
    fc1_node = act.x
    # a Conv1D reads its input's size too: those nodes are fc2's own
    into_fc2 = len(act_node.users) == 1 if drops else set(act_node.users) <= {n, *fc2.inner}
    if not set(fc1_node.users) <= {act_node, *act.nodes} or not into_fc2:
        return Miss("mlp", "an intermediate output is used elsewhere too")
    op = fc1.kind
    mul, gamma = _gamma(n, op, scope) if FC[op].odim == 0 else (None, None)
    bias_gelu = scope.ctx.act("bias_gelu") if act.kind == "gelu" and fc1.bias else None
    ba = BiasAct(pure_act(act.kind, act.approximate, scope.ctx), bias_gelu, act.approximate,
                 FC[op].cdim)
    args = (Attr(fc1.weight), fc1.bias and Attr(fc1.bias), Attr(fc2.weight),
            fc2.bias and Attr(fc2.bias), *([Attr(gamma)] if gamma else []))
    nodes = (*drops, act_node, *act.nodes, fc1_node, *fc1.inner, *fc2.inner,
             *([n] if mul else []))
    ln = ln_prologue(fc1_node, fc1.x, scope) if op == "linear" else None
    head, eps = (fc1.x,), None
    if ln is not None:
        (ln_node, (x, eps, lw, lb)) = ln
        head, nodes = (x, lw, lb), (*nodes, ln_node)
    out, res, skipped, nchw_out = _residual_nchw(mul or n, scope) if op == "linear" \
        else (*_residual(mul or n, scope), False)
    if res is not None:
        args = (*args[:4], res, *args[4:])
    return Hit("mlp", out, mlp_site(ba, op, eps, res is not None, p, nchw_out), (*head, *args),
               (*nodes, *skipped), also=("ln_linear",) if ln else ())
