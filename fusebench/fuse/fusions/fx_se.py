"""se_gate (graph): squeeze-excitation in any spelling -> one Function:
  pool:   nn.AdaptiveAvgPool2d(1) / F.adaptive_avg_pool2d(x, 1) / x.mean((2, 3), keepdim=True)
          (or without keepdim / flattened, before Linear layers)
  reduce -> SiLU/ReLU/GELU -> expand: 1x1 nn.Conv2d or nn.Linear (with biases)
  gate:   sigmoid (module, torch.sigmoid or method) or hardsigmoid (MobileNetV3's; a module,
          F.hardsigmoid or written out as relu6(e + 3) / 6), reshaped to (N, C, 1, 1) if
          needed, * x.
The x-sized work is the gate (the se_gate act family bound for this fuse()); the rest is
(N, C)-sized, with reduce/expand as matrix products on the flattened weights.
se_project (train): the same SE whose only use is a pointwise nn.Conv2d, absorbed with it (a
site counted as se_gate too); the gate folds into the conv's weights per image where that pays
(fusions/se_project.py)."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.binding import Pure, hard_gate
from fusebench.fuse.conv1x1 import is_pointwise, run_conv
from fusebench.fuse.engine import run_ops
from fusebench.fuse.fusions.se_gate import se_kernel
from fusebench.fuse.fusions.se_project import folds, se_project
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.acts import activation, pure_act
from fusebench.fuse.fx.pattern import Attr, Hit, Miss, Site, register_pattern
from fusebench.fuse.fx.spelled import hard_sigmoid
from fusebench.fuse.rule import computes_as
from fusebench.kernels.act.gate import ATEN_SIXTH, EXACT_SIXTH


def gates(ctx, hard: float) -> Pure:
    """The bound se_gate pair, with the hardsigmoid gate of that slope where the SE has one."""
    gate = ctx.act("se_gate")
    return hard_gate(gate, hard) if hard else gate


def se_site(gate: Pure, act: Pure) -> Site:
    kernel = se_kernel(gate, act)

    def run(x, reduce, expand):
        return run_ops(kernel, x, ((reduce.weight, reduce.bias), (expand.weight, expand.bias)))
    return Site("fused_se", run)


def _squeezed(n, x):
    """True when n is the global average of x: (N, C, 1, 1) for convs, (N, C) for Linear."""
    op = N.op(n)
    if op == "adaptive_avg_pool2d":
        size = N.module(n).output_size if N.module(n) is not None else N.arg(n, 1, "output_size")
        return N.x_of(n) is x and size in (1, (1, 1), [1, 1])
    if op == "mean":
        return N.x_of(n) is x and N.is_spatial_mean(n, N.mean_dims(n)[1])
    if op in ("flatten", "view", "reshape", "squeeze"):
        return _squeezed(N.x_of(n), x)
    return False


def _fc(n):
    """The reduce/expand module: a 1x1 conv or Linear with a bias; a reason otherwise."""
    m = N.module(n)
    if computes_as(m, nn.Linear) or (computes_as(m, nn.Conv2d) and m.kernel_size == (1, 1)
                                and m.groups == 1 and m.stride == (1, 1)):
        return m if m.bias is not None else "reduce/expand without a bias"
    return None


def _unbroadcast(n):
    """The (N, C) / (N, C, 1, 1) node under a view(n, c, 1, 1) / [:, :, None, None]."""
    if N.op(n) in ("view", "reshape") and N.dims(n)[-2:] == (1, 1):
        return N.x_of(n)
    if N.op(n) == "getitem" and isinstance(n.args[1], tuple) and n.args[1][-2:] == (None, None):
        return N.x_of(n)
    return n


def _reason(act, reduce, expand) -> str | None:
    if not isinstance(act, tuple):
        return act or "an activation no kernel here computes"
    return next((r for r in (_fc(reduce), _fc(expand)) if isinstance(r, str)), None)


def match_se(n):
    """(x, reduce, expand, (act kind, approximate), the hard gate's slope (0: sigmoid), inner
    nodes) when n is `x * gate(SE(x))`; a Miss (an SE no kernel here computes) or None."""
    ab = N.operands(n) if N.op(n) == "mul" else None
    for x, gate in (ab, ab[::-1]) if ab else ():
        g = _unbroadcast(gate)
        spelled = hard_sigmoid(g)
        hard = ATEN_SIXTH if N.op(g) == "hardsigmoid" else EXACT_SIXTH if spelled else 0.0
        if not (N.op(g) == "sigmoid" or hard) or not isinstance(x, type(n)):
            continue
        expand, written = spelled if spelled else (N.x_of(g), ())
        act_node = N.x_of(expand) if _fc(expand) is not None else None
        reduce = N.x_of(act_node) if act_node is not None else None
        if reduce is None or _fc(reduce) is None or not _squeezed(N.x_of(reduce), x):
            continue
        act = activation(act_node)
        reason = _reason(act, reduce, expand)
        if reason:
            return Miss("se_gate", reason)
        return (x, reduce, expand, act, hard,
                (g, gate, *written, expand, act_node, reduce, N.x_of(reduce)))
    return None


@register_pattern("se_gate", benches=("train", "infer"))
def squeeze_excite(n, scope):
    """pool -> reduce -> act -> expand -> sigmoid -> * x (convs or Linear) -> one Function."""
    got = match_se(n)
    if not isinstance(got, tuple):
        return got
    x, reduce, expand, act, hard, inner = got
    return Hit("se_gate", n, se_site(gates(scope.ctx, hard), pure_act(*act, scope.ctx)),
               (x, Attr(reduce.target), Attr(expand.target)), inner)


@register_pattern("se_project", benches=("train",))
def squeeze_excite_project(n, scope):
    """An SE whose only use is a pointwise conv -> one Function, the gate folded into the
    conv's weights where that pays (tried before se_gate, at the same mul node)."""
    proj = _projection(n)
    got = match_se(n) if proj is not None else None
    if not isinstance(got, tuple):
        return None                    # a Miss: se_gate, tried next, reports it
    x, reduce, expand, act, hard, inner = got
    site = se_project_site(gates(scope.ctx, hard), pure_act(*act, scope.ctx), hard)
    return Hit("se_project", proj, site, (x, Attr(reduce.target), Attr(expand.target),
                                          Attr(proj.target)), (*inner, n), also=("se_gate",))


def _projection(n):
    """The pointwise nn.Conv2d that is n's only use, or None."""
    u = N.single_user(n)
    if u is None or N.op(u) != "conv2d" or N.x_of(u) is not n:
        return None
    return u if is_pointwise(N.module(u)) and len(u.args) == 1 and not u.kwargs else None


def se_project_site(gate: Pure, act: Pure, hard: float = 0.0) -> Site:
    """proj(SE(x)): se_project's folded Function where it `folds`, else the SE site's
    Function and then the conv (a GEMM on channels-last). hard: `gate` is hard_gate's."""
    se = se_kernel(gate, act)

    def run(x, reduce, expand, proj):
        if folds(x, proj.weight):
            return se_project(x, reduce, expand, proj, act, hard)
        y = run_ops(se, x, ((reduce.weight, reduce.bias), (expand.weight, expand.bias)))
        return run_conv(proj, y)
    return Site("fused_se_project", run)
