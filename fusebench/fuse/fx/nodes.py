"""What an fx node computes, whatever the spelling: `op(node)` names it ("add", "layer_norm",
"gelu", ...) for torch functions, operators, tensor methods and nn modules alike, and `arg`
reads an argument given by position or keyword. The patterns in fusions/fx_*.py are written
against these names, so `x.mean(1, keepdim=True)`, `torch.mean(x, dim=1, keepdim=True)` and
`x.mean(dim=(1,), keepdim=True)` are one thing to them."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse.rule import computes_as, torch_layer_of

FUNCTIONS = {
    torch.add: "add", operator.add: "add", torch.sub: "sub", operator.sub: "sub",
    torch.mul: "mul", operator.mul: "mul", torch.div: "div", operator.truediv: "div",
    torch.pow: "pow", operator.pow: "pow", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt",
    torch.mean: "mean", torch.permute: "permute", operator.getitem: "getitem",
    torch.flatten: "flatten", torch.reshape: "reshape", torch.unsqueeze: "unsqueeze",
    F.layer_norm: "layer_norm", F.batch_norm: "batch_norm", F.linear: "linear",
    F.conv2d: "conv2d",
    F.gelu: "gelu", F.silu: "silu", F.relu: "relu", torch.relu: "relu",
    torch.tanh: "tanh", torch.erf: "erf", torch.special.erf: "erf",
    torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", F.hardsigmoid: "hardsigmoid",
    F.relu6: "relu6", F.dropout: "dropout", torch.dropout: "dropout", F.hardswish: "hardswish",
    F.adaptive_avg_pool2d: "adaptive_avg_pool2d", F.rms_norm: "rms_norm",
    torch.chunk: "chunk", torch.split: "split", F.group_norm: "group_norm",
    operator.matmul: "matmul", torch.matmul: "matmul", torch.bmm: "bmm",
    F.softmax: "softmax", torch.softmax: "softmax", torch.masked_fill: "masked_fill",
    torch.transpose: "transpose", operator.eq: "eq", torch.eq: "eq",
    torch.norm: "norm", torch.linalg.vector_norm: "vector_norm", torch.addcmul: "addcmul",
}
METHODS = {"add", "sub", "mul", "div", "pow", "sqrt", "rsqrt", "mean", "permute", "relu",
           "sigmoid", "tanh", "erf", "view", "reshape", "unsqueeze", "flatten", "squeeze",
           "to", "float", "type_as", "type", "chunk", "split", "matmul", "bmm", "softmax",
           "masked_fill", "transpose", "eq", "norm", "addcmul"}
MODULES = {
    nn.LayerNorm: "layer_norm", nn.Linear: "linear", nn.Conv2d: "conv2d", nn.GELU: "gelu",
    nn.SiLU: "silu", nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Hardsigmoid: "hardsigmoid",
    nn.ReLU6: "relu6", nn.Hardswish: "hardswish", nn.BatchNorm2d: "batch_norm",
    nn.BatchNorm1d: "batch_norm",
    nn.AdaptiveAvgPool2d: "adaptive_avg_pool2d", nn.Flatten: "flatten", nn.Dropout: "dropout",
    nn.Identity: "identity", nn.RMSNorm: "rms_norm", nn.GroupNorm: "group_norm",
    nn.Softmax: "softmax",
}
ACTS = ("silu", "relu", "gelu", "relu6", "hardswish")   # activations with a fused kernel here


def op(n) -> str | None:
    if not isinstance(n, fx.Node):
        return None
    if n.op == "call_function":
        return FUNCTIONS.get(n.target)
    if n.op == "call_method":
        return n.target if n.target in METHODS else None
    if n.op == "call_module":
        m = module(n)
        return MODULES.get(type(m)) or MODULES.get(torch_layer_of(m))
    return None


def module(n: fx.Node) -> nn.Module | None:
    if n.op != "call_module":
        return None
    return n.graph.owning_module.get_submodule(n.target)


def arg(n: fx.Node, i: int, name: str, default=None):
    """Argument `name` of call n: positional index i (counting the tensor as 0) or keyword."""
    if len(n.args) > i:
        return n.args[i]
    return n.kwargs.get(name, default)


def x_of(n) -> fx.Node | None:
    """The data input of an op node (its first argument)."""
    a = n.args[0] if n.args else n.kwargs.get("input")
    return a if isinstance(a, fx.Node) else None


def identity_dropout(n, bench: str) -> bool:
    """An nn.Identity, or a dropout that is the identity here (p == 0, or any p outside
    training): timm's Mlp has both between its act and fc2 (drop1, norm), its BatchNormAct2d
    an nn.Identity `drop` between the norm and the act."""
    if op(n) == "identity":
        return True
    if op(n) != "dropout":
        return False
    m = module(n)
    training = m.training if m is not None else arg(n, 2, "training", arg(n, 2, "train", True))
    return dropout_p(n) == 0 or (training is False) or (m is not None and bench == "infer")


def dropout_p(n) -> float | None:
    """A dropout node's p (nn.Dropout's, or F.dropout's / torch.dropout's constant argument)."""
    m = module(n)
    return m.p if m is not None else number(arg(n, 1, "p", 0.5))


def above_identities(n, bench: str, inside: frozenset = frozenset()) -> tuple:
    """(the node above n's identity dropouts, those dropouts): walking up through identities
    that have no other user; n itself may have several, all in `inside` (a written-out
    activation reads its input more than once: timm's BatchNormAct2d `act(drop(x))` with
    `x * sigmoid(x)` as the act)."""
    skipped = []
    while n is not None and identity_dropout(n, bench) and (
            len(n.users) == 1 or (not skipped and set(n.users) <= inside)):
        skipped.append(n)
        n = x_of(n)
    return n, tuple(skipped)


def shape_query(u: fx.Node, x: fx.Node) -> bool:
    """u reads only x's shape (`x.size()`, `x.size(d)`, `x.shape`, `x.dim()`): nanoGPT's
    attention takes `b, t, c = x.size()` of its normed input."""
    return (u.op == "call_method" and u.target in ("size", "dim") and u.args[:1] == (x,)) or (
        u.op == "call_function" and u.target is getattr and u.args == (x, "shape"))


def single_user(n: fx.Node) -> fx.Node | None:
    users = list(n.users)
    return users[0] if len(users) == 1 else None


def dims(n: fx.Node, start: int = 1, name: str = "dims") -> tuple | None:
    """permute / view-style argument lists: `(x, 0, 2, 3, 1)` or `(x, (0, 2, 3, 1))`."""
    rest = n.args[start:] if len(n.args) > start else ()
    if not rest:
        rest = n.kwargs.get(name, n.kwargs.get("size", n.kwargs.get("shape", ())))
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        rest = rest[0]
    return tuple(rest)


def is_permute(n, order: tuple[int, ...]) -> bool:
    return op(n) == "permute" and dims(n) == order


def mean_dims(n) -> tuple[tuple[int, ...], bool] | None:
    """(dims, keepdim) of a mean node, dims normalised to a sorted tuple (negative kept)."""
    if op(n) != "mean":
        return None
    d = arg(n, 1, "dim")
    if d is None:
        return None
    d = tuple(d) if isinstance(d, (tuple, list)) else (d,)
    return tuple(sorted(d)), bool(arg(n, 2, "keepdim", False))


def is_channel_mean(n) -> bool:
    return mean_dims(n) == ((1,), True)


def is_spatial_mean(n, keepdim: bool) -> bool:
    md = mean_dims(n)
    return md is not None and md[1] == keepdim and md[0] in ((2, 3), (-2, -1))


def operands(n) -> tuple | None:
    """The two operands of a binary op node (tensor method or function)."""
    a = n.args[0] if n.args else None
    b = arg(n, 1, "other")
    return (a, b) if a is not None and b is not None else None


def commuted(n, name: str) -> tuple:
    """Both orders of a commutative op's operands when n is op `name`, else ()."""
    if op(n) != name:
        return ()
    ab = operands(n)
    return (ab, ab[::-1]) if ab else ()


def square_of(n):
    """x of `x ** 2` / `x.pow(2)` / `x * x`."""
    if op(n) == "pow" and number(arg(n, 1, "exponent")) == 2.0:
        return x_of(n)
    ab = operands(n) if op(n) == "mul" else None
    return ab[0] if ab and ab[0] is ab[1] else None


def number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def attr_path(n) -> str | None:
    return n.target if isinstance(n, fx.Node) and n.op == "get_attr" else None


def attr_value(n: fx.Node):
    obj = n.graph.owning_module
    for part in n.target.split("."):
        obj = getattr(obj, part)
    return obj


def channel_param(n) -> str | None:
    """The path of a 1-D parameter broadcast over dim 1 of a 4-D tensor: `w[:, None, None]`,
    `w[None, :, None, None]`, `w.view(1, -1, 1, 1)`, `w.reshape(-1, 1, 1)`,
    `w.unsqueeze(-1).unsqueeze(-1)`, or a parameter already shaped (C, 1, 1) / (1, C, 1, 1)."""
    if attr_path(n):
        v = attr_value(n)
        ok = isinstance(v, torch.Tensor) and v.dim() >= 3 and v.shape[-2:] == (1, 1) \
            and v.numel() == v.shape[-3]
        return n.target if ok else None
    base = x_of(n) if op(n) in ("getitem", "view", "reshape", "unsqueeze") else None
    if base is None:
        return None
    if op(n) == "unsqueeze" and arg(n, 1, "dim") == -1 and op(base) == "unsqueeze" \
            and arg(base, 1, "dim") == -1:
        return last_param(x_of(base))
    if op(n) == "getitem":
        idx = n.args[1]
        ok = isinstance(idx, tuple) and idx[-2:] == (None, None) and \
            [i for i in idx[:-2] if i is not None] == [slice(None)]
        return last_param(base) if ok else None
    shape = dims(n)
    if shape and shape[-2:] == (1, 1) and all(s == 1 for s in shape[:-3]):
        return last_param(base)
    return None


def last_param(n) -> str | None:
    """The path of a 1-D parameter (broadcast over the last dim as it is)."""
    if attr_path(n):
        v = attr_value(n)
        return n.target if isinstance(v, torch.Tensor) and v.dim() == 1 else None
    return None


def hooked(m: nn.Module) -> bool:
    return bool(m._forward_hooks or m._forward_pre_hooks or m._backward_hooks
                or getattr(m, "_backward_pre_hooks", None))


def not_pointwise(conv: nn.Conv2d) -> str | None:
    """Why conv is not a GEMM over channels (1x1, stride 1, groups 1, no padding); None if it is."""
    # "same" on a 1x1 kernel pads nothing (HF transformers writes its 1x1 convs that way)
    if conv.kernel_size != (1, 1) or conv.stride != (1, 1) or conv.groups != 1 \
            or conv.padding not in ((0, 0), "valid", "same") or conv.padding_mode != "zeros":
        return "conv is not 1x1 / stride 1 / groups 1 / no padding"
    return None


class FcCall(NamedTuple):
    """A Linear / 1x1 conv / Conv1D a node computes: its spelling (fx_mlp's FC), input,
    weight and bias paths, and the nodes of its own that only it uses (Conv1D's reshapes)."""
    kind: str
    x: fx.Node
    weight: str
    bias: str | None
    inner: tuple = ()


def fc(n):
    """The FcCall of a Linear / 1x1-conv / Conv1D node, a reason, or None."""
    kind, m = op(n), module(n)
    if kind in ("view", "reshape"):
        return conv1d(n)
    if kind not in ("linear", "conv2d"):
        return None
    if m is not None:
        if kind == "conv2d" and (why := not_pointwise(m)):
            return why
        if not (computes_as(m, nn.Linear) or computes_as(m, nn.Conv2d)):
            return None
        return FcCall(kind, x_of(n), f"{n.target}.weight",
                      f"{n.target}.bias" if m.bias is not None else None)
    if kind != "linear":
        return "functional conv2d (only nn.Conv2d modules are matched)"
    w, b = attr_path(arg(n, 1, "weight")), arg(n, 2, "bias")
    if w is None or (b is not None and last_param(b) is None):
        return "weight / bias are not module parameters"
    return FcCall(kind, x_of(n), w, last_param(b) if b is not None else None)


def conv1d(n):
    """HF transformers' Conv1D (GPT-2's c_fc / c_proj), a linear with its weight stored
    (in, out): `addmm(b, x.view(-1, x.size(-1)), w).view(x.size()[:-1] + (out,))`."""
    mm = x_of(n)
    if not (isinstance(mm, fx.Node) and mm.op == "call_function" and mm.target is torch.addmm
            and len(mm.args) == 3 and not mm.kwargs):
        return None
    b, flat, w = mm.args
    if attr_path(w) is None or attr_value(w).dim() != 2 or last_param(b) is None \
            or op(flat) not in ("view", "reshape"):
        return None
    x, rows = x_of(flat), dims(flat)
    nf = attr_value(w).shape[-1]
    last = _size_of(rows[1], x, -1) if len(rows) == 2 and rows[0] == -1 else None
    shape = dims(n)
    lead = shape[0] if len(shape) == 1 and op(shape[0]) == "add" else None
    ab = operands(lead) if lead is not None else None
    head = ab[0] if ab and ab[1] == (nf,) and op(ab[0]) == "getitem" \
        and ab[0].args[1] == slice(None, -1, None) else None
    size = _size_of(x_of(head), x) if head is not None else None
    if last is None or size is None:
        return None
    inner = tuple(k for k in (mm, flat, last, lead, head, size) if isinstance(k, fx.Node))
    return FcCall("conv1d", x, attr_path(w), last_param(b), inner)


def _size_of(k, x, *index):
    """k itself when it is `x.size(*index)` (or `x.shape` for no index), True for a number
    where an index is given (the channel count written out), else None."""
    if isinstance(k, fx.Node):
        if k.op == "call_method" and k.target == "size" and k.args == (x, *index):
            return k
        return k if not index and k.op == "call_function" and k.target is getattr \
            and k.args == (x, "shape") else None
    return True if index and number(k) is not None else None


@dataclass(frozen=True)
class BnCall:
    """The BatchNorm2d (or BatchNorm1d) whose batch norm a node computes, at `path` in the
    traced module."""
    path: str
    module: nn.BatchNorm2d | nn.BatchNorm1d


NO_AFFINE_OR_STATS = "BatchNorm without affine parameters or running statistics"
_BN_ARGS = ((1, "running_mean"), (2, "running_var"), (3, "weight"), (4, "bias"))


def batch_norm_call(n, root: nn.Module, one_d: bool = False) -> BnCall | str | None:
    """What batch norm node n computes: an nn.BatchNorm2d call, or F.batch_norm on one
    BatchNorm2d's own running statistics, weight and bias with its eps, momentum and training
    flag (a subclass's forward written out, as timm's BatchNormAct2d is); a reason string for
    a batch norm that is neither; None for anything else. `root` is the traced module (the
    graph's own module tree holds placeholders on get_attr paths). one_d: a BatchNorm1d's
    too (bn_act's and bn_train's sites view its (N, C, L) or (N, C) input as an image; the
    other BN patterns take images only, and a BatchNorm1d is no candidate of theirs)."""
    if op(n) != "batch_norm":
        return None
    kinds = (nn.BatchNorm2d, nn.BatchNorm1d) if one_d else nn.BatchNorm2d
    if n.op == "call_module":
        return BnCall(n.target, module(n)) if isinstance(module(n), kinds) else None
    given = [arg(n, i, name) for i, name in _BN_ARGS]
    if any(a is None for a in given):
        return NO_AFFINE_OR_STATS
    paths = [attr_path(a) for a in given]
    owner = {p.rpartition(".")[0] for p in paths if p is not None}
    bad = "functional batch_norm on tensors that are not one BatchNorm2d's own"
    if None in paths or len(owner) != 1 or [p.rpartition(".")[2] for p in paths] != \
            [name for _, name in _BN_ARGS] or "" in owner:
        return bad
    m = root.get_submodule(owner.pop())
    if isinstance(m, nn.BatchNorm1d) and not one_d:
        return None
    if not isinstance(m, kinds):
        return bad
    # the module's own settings; a momentum of None (cumulative average) the trace froze at
    # 1 / num_batches_tracked: the site computes it at each call, as the module does
    same = (arg(n, 5, "training", False) == m.training and arg(n, 7, "eps", 1e-5) == m.eps
            and (m.momentum is None or arg(n, 6, "momentum", 0.1) == m.momentum))
    return BnCall(paths[0].rpartition(".")[0], m) if same else \
        f"{bad}: its eps, momentum or training flag differ from the module's"


class GnCall(NamedTuple):
    """What a group norm node computes: its input, groups, eps and parameter paths (None for
    GroupNorm(affine=False))."""
    x: fx.Node
    groups: int
    eps: float
    weight: str | None
    bias: str | None


def group_norm_call(n) -> GnCall | str | None:
    """The GnCall of an nn.GroupNorm call (or a subclass that keeps its forward) or of
    F.group_norm on module parameters with constant groups and eps (a subclass's forward
    calling it: guided-diffusion's GroupNorm32); a reason string for one that is neither;
    None for anything else."""
    if op(n) != "group_norm":
        return None
    m = module(n)
    if m is not None:
        w = f"{n.target}.weight" if m.affine else None
        return GnCall(x_of(n), m.num_groups, m.eps, w, f"{n.target}.bias" if m.affine else None)
    groups, eps = number(arg(n, 1, "num_groups")), number(arg(n, 4, "eps", 1e-5))
    w, b = arg(n, 2, "weight"), arg(n, 3, "bias")
    wp, bp = (last_param(t) if t is not None else None for t in (w, b))
    if groups is None or eps is None or (w is None) != (b is None) or \
            (w is not None and (wp is None or bp is None)):
        return "functional group_norm whose groups / eps are not constants or whose weight " \
               "and bias are not module parameters"
    return GnCall(x_of(n), int(groups), eps, wp, bp)
