"""The op fuser: rewrites a model into fusebench's fused ops, one registered fusion at a time.

A fusion is a pure rewrite (TransformerEngine `ops/fuser.py` style): it looks at one module and
returns its fused replacement, or None when the pattern does not match. Fused modules hold no
state of their own: they keep the original submodules / Parameters under the same names, so
optimizers, state dicts and FSDP see the very same Parameters. Only the `infer` bench folds
conv+BN, and it does so on a copy.

Several basic ops in one autograd.Function (`FusedOps`): the number of parameters each op owns
is captured in forward (`ctx.counts`) and used in backward to split the gradients; backward
never calls `parameters()`. Under FSDP1(use_orig_params=True) `parameters()` returns [] during
backward, which is how a well-known fused-op framework died with "Expected op 0 to generate 0
param grads, but got 2".
"""
from __future__ import annotations

import copy
import functools
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.act import SiLUMemEff
from fusebench.models.layers import ConvBNAct, ConvMlp, LayerNorm2d, SqueezeExcite
from fusebench.registry import Registry

# --- several ops, one autograd.Function -------------------------------------------------------


@dataclass(frozen=True)
class FusedKernel:
    """Pure functions over groups of parameters, one group per basic op:
    fwd(x, groups) -> (y, saved tensors); bwd(dy, saved, groups) -> (dx, grads per group)."""
    name: str
    fwd: Callable
    bwd: Callable


def _split(flat: tuple, counts: tuple[int, ...]) -> tuple[tuple, ...]:
    out, i = [], 0
    for n in counts:
        out.append(tuple(flat[i:i + n]))
        i += n
    return tuple(out)


class FusedOps(torch.autograd.Function):
    """Runs a FusedKernel. Every tensor backward needs goes through save_for_backward, so saved
    tensor hooks (activation bytes) see it."""

    @staticmethod
    def forward(ctx, kernel: FusedKernel, counts: tuple[int, ...], x, *flat):
        y, saved = kernel.fwd(x, _split(flat, counts))
        ctx.kernel, ctx.counts, ctx.n_saved = kernel, counts, len(saved)   # captured here
        ctx.save_for_backward(*saved, *flat)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        tensors = ctx.saved_tensors
        saved, groups = tensors[:ctx.n_saved], _split(tensors[ctx.n_saved:], ctx.counts)
        dx, dgroups = ctx.kernel.bwd(dy, saved, groups)
        for i, (g, dg) in enumerate(zip(groups, dgroups)):
            if len(dg) != len(g):
                raise RuntimeError(f"Expected op {i} to generate {len(g)} param grads, "
                                   f"but got {len(dg)}")
        return (None, None, dx, *[d for dg in dgroups for d in dg])


def fused_ops(kernel: FusedKernel, x: torch.Tensor, groups) -> torch.Tensor:
    """groups: one tuple of Parameters per basic op, read from the owning modules at call time
    (FSDP swaps them per forward). The counts travel with the autograd node."""
    groups = tuple(tuple(p for p in g if p is not None) for g in groups)
    counts = tuple(len(g) for g in groups)
    return FusedOps.apply(kernel, counts, x, *[p for g in groups for p in g])


def _conv_bwd(dy, x, w, bias: bool, padding=(0, 0), groups=1):
    """(dx, dw, db|None) of conv2d(x, w, b, stride 1): aten's own backward, same as eager."""
    dx, dw, db = torch.ops.aten.convolution_backward(
        dy, x, w, [w.shape[0]] if bias else None, (1, 1), padding, (1, 1), False, (0, 0),
        groups, (True, True, bias))
    return dx, dw, db


# --- the kernels the fused ops call, bound once per fuse() --------------------------------------
# The maths lives in fusebench.kernels.act / kernels.ln2d; here only which impl runs. A multi-op
# Function needs an impl's *pure* forward/backward pair (no autograd node of its own), so each
# act impl is listed with its pair, in one call convention:
#   silu: fwd(x) -> y, bwd(dy, x) -> dx;   se_gate: fwd(x, g) -> y, bwd(dy, x, g) -> (dx, dg);
#   bias_gelu: fwd(x, b, approximate) -> y, bwd(dy, x, b, approximate) -> (dx, db).


@dataclass(frozen=True)
class Pure:
    impl: str
    fwd: Callable
    bwd: Callable


def _pure_pair(family: str, impl: str) -> Pure:
    if impl == "function":
        from fusebench.kernels.act.bias_gelu import bias_gelu_bwd, bias_gelu_fwd
        from fusebench.kernels.act.se_gate import se_gate_bwd, se_gate_fwd
        from fusebench.kernels.act.silu import silu_bwd, silu_fwd
        pairs = {"silu": (silu_fwd, silu_bwd), "se_gate": (se_gate_fwd, se_gate_bwd),
                 "bias_gelu": (bias_gelu_fwd, bias_gelu_bwd)}
    elif impl == "cpu":
        from fusebench.kernels.act import cpu
        ext, d = cpu.extension(), cpu._dense
        pairs = {"silu": (lambda x: ext.silu_forward(d(x)), ext.silu_backward),
                 "se_gate": (lambda x, g: ext.se_gate_forward(d(x), g),
                             lambda dy, x, g: tuple(ext.se_gate_backward(dy, x, g))),
                 "bias_gelu": (lambda x, b, a: ext.bias_gelu_forward(d(x), b, a == "tanh"),
                               lambda dy, x, b, a: tuple(
                                   ext.bias_gelu_backward(dy, x, b, a == "tanh")))}
    elif impl == "triton":
        from fusebench.kernels.act import triton as tr
        pairs = {"silu": (tr.silu_triton_fwd, tr.silu_triton_bwd),
                 "se_gate": (tr.se_gate_triton_fwd, tr.se_gate_triton_bwd),
                 "bias_gelu": (lambda x, b, a: tr.bias_gelu_triton_fwd(x, b, a == "tanh"),
                               lambda dy, x, b, a: tr.bias_gelu_triton_bwd(dy, x, b,
                                                                           a == "tanh"))}
    else:
        raise KeyError(f"no pure fwd/bwd pair for {family} impl {impl!r}")
    return Pure(impl, *pairs[family])


def _by_layout(cl: Pure, nchw: Pure) -> Pure:
    """One pair that runs `cl` on channels-last x and `nchw` otherwise (decided by x's strides,
    both pairs bound once)."""
    def pick(x):
        return cl if x.is_contiguous(memory_format=torch.channels_last) \
            and not x.is_contiguous() else nchw
    return Pure(f"{cl.impl}|{nchw.impl}", lambda x, *a: pick(x).fwd(x, *a),
                lambda dy, x, *a: pick(x).bwd(dy, x, *a))


# Best impl per device, by measurement (docs/kernels.md, docs/fused.md; 2-vCPU VM, fwd+bwd):
# on CPU the C++ se_gate pays (one-pass backward, 1.3-2.5x); the C++ silu backward runs ~3x
# slower than aten's silu_backward: "function". The C++ bias_gelu is one pass per direction and
# pays on channels-last x (what the ConvNeXt MLP sees after the fused LN2d: 5.5 vs 7.2 ms bwd at
# 8x160x56x56, ~60 ms per convnext_atto train step), but its NCHW backward is ~13x slower than
# aten's gelu_backward: "cpu|function" runs cpu on channels-last x, function on NCHW.
PREFERRED = {"cuda": {"silu": "triton", "se_gate": "triton", "bias_gelu": "triton"},
             "cpu": {"silu": "function", "se_gate": "cpu", "bias_gelu": "cpu|function"}}
FALLBACK_IMPL = "function"


def bind_act(family: str, device: str, notes: list, impl: str | None = None) -> Pure:
    """The pure pair of `impl` (default: PREFERRED for the device; "a|b" = a on channels-last
    x, b otherwise) if usable here, else `function` with a kernel_fallback note. Resolved once
    per fuse(), never per call."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    name = impl or PREFERRED[kind][family]
    pairs = [_bind_one(family, n, device, notes) for n in name.split("|")]
    pair = pairs[0] if len(pairs) == 1 else _by_layout(*pairs)
    notes.append(("info", f"{family}: kernel = '{pair.impl}'"))
    return pair


def _bind_one(family: str, name: str, device: str, notes: list) -> Pure:
    from fusebench.kernels import get_impl
    ok, reason = get_impl(family, name).available(str(device))
    if ok and name == "cpu":
        from fusebench.kernels.act import cpu
        ok, reason = cpu.build()                 # a compile error shows up here, not mid-step
    if ok:
        return _pure_pair(family, name)
    notes.append(("kernel_fallback", f"{family} '{name}' unavailable ({reason}); "
                                     f"ran '{FALLBACK_IMPL}' instead"))
    return _pure_pair(family, FALLBACK_IMPL)


# bias + GELU + fc2 (ConvNeXt MLP tail), ops bias (fc1.bias) and fc2 (weight, bias): saves only
# the pre-bias fc1 output h0 (N, 4C, H, W); the GELU output fc2's weight gradient needs is
# recomputed in backward instead of kept.
@functools.cache
def bias_gelu_fc2_kernel(act: Pure, approximate: str) -> FusedKernel:
    def fwd(h0, groups):
        (b1,), (w2, b2) = groups
        return F.conv2d(act.fwd(h0, b1, approximate), w2, b2), (h0,)

    def bwd(dy, saved, groups):
        (h0,), ((b1,), (w2, b2)) = saved, groups
        g = act.fwd(h0, b1, approximate)                    # (N, 4C, H, W), recomputed
        dg, dw2, db2 = _conv_bwd(dy, g, w2, True)
        dh, db1 = act.bwd(dg, h0, b1, approximate)
        return dh, ((db1,), (dw2, db2))
    return FusedKernel(f"bias_gelu_fc2[{act.impl},{approximate}]", fwd, bwd)


# squeeze-excite: gate(x, expand(silu(reduce(mean_hw(x))))), ops reduce (w, b) and expand (w, b).
# The x-sized work is the gate's (act se_gate impl); the rest is (N, C, 1, 1)-sized.
@functools.cache
def se_gate_kernel(gate: Pure, silu: Pure) -> FusedKernel:
    def fwd(x, groups):
        (wr, br), (we, be) = groups
        s = x.mean((2, 3), keepdim=True)                    # (N, C, 1, 1)
        r = F.conv2d(s, wr, br)                             # (N, R, 1, 1)
        e = F.conv2d(silu.fwd(r), we, be)                   # (N, C, 1, 1) gate logits
        return gate.fwd(x, e), (x, s, r, e)

    def bwd(dy, saved, groups):
        x, s, r, e = saved
        (wr, br), (we, be) = groups
        dx, de = gate.bwd(dy, x, e)
        da, dwe, dbe = _conv_bwd(de, silu.fwd(r), we, True)
        ds, dwr, dbr = _conv_bwd(silu.bwd(da, r), s, wr, True)
        dx = dx + ds / (x.shape[2] * x.shape[3])            # mean's backward spreads ds over H*W
        return dx, ((dwr, dbr), (dwe, dbe))
    return FusedKernel(f"se_gate[{gate.impl}]", fwd, bwd)


# training-mode BatchNorm + SiLU, op BN (weight, bias): saves the BN input and the (C,)
# statistics; the BN output that SiLU's backward needs is recomputed (one addcmul pass). aten's
# batch norm updates the running statistics exactly as eager does.
def bn_silu_kernel(silu: Pure, running_mean, running_var, momentum: float,
                   eps: float) -> FusedKernel:
    def fwd(c, groups):
        (w, b), = groups
        y, mean, invstd = torch.ops.aten.native_batch_norm(
            c, w, b, running_mean, running_var, True, momentum, eps)
        return silu.fwd(y), (c, mean, invstd)

    def bwd(dy, saved, groups):
        (c, mean, invstd), ((w, b),) = saved, groups
        scale = invstd * w                                  # (C,): y = c * scale + shift
        shift = b - mean * scale
        y = torch.addcmul(shift[:, None, None], c, scale[:, None, None])
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(
            silu.bwd(dy, y), c, w, None, None, mean, invstd, True, 0.0, (True, True, True))
        return dx, ((dw, db),)
    return FusedKernel(f"bn_silu[{silu.impl}]", fwd, bwd)


# --- fused modules (no state of their own) ----------------------------------------------------


class FusedModule(nn.Module):
    """Marker base: a module the fuser produced. `fusion` names the fusion that made it."""
    fusion = ""


class FusedLayerNorm2d(FusedModule):
    """LN2d through a kernel impl; weight and bias are the original module's Parameters."""
    fusion = "ln2d"

    def __init__(self, src: LayerNorm2d, impl: str, fn: Callable):
        super().__init__()
        self.num_channels, self.eps, self.impl, self._fn = src.num_channels, src.eps, impl, fn
        self.weight, self.bias = src.weight, src.bias          # same Parameters, same names

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        return self._fn(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_channels}, eps={self.eps}, impl={self.impl}"


class FusedConvMlp(FusedModule):
    """fc1 (no bias) -> FusedOps[bias+GELU (fc1.bias), fc2 (weight, bias)]."""
    fusion = "mlp_bias_gelu"

    def __init__(self, src: ConvMlp, act: Pure):
        super().__init__()
        self.fc1, self.fc2 = src.fc1, src.fc2
        self.kernel = bias_gelu_fc2_kernel(act, src.act.approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        h0 = F.conv2d(x, self.fc1.weight)                    # (N, 4C, H, W), bias in the fusion
        return fused_ops(self.kernel, h0, ((self.fc1.bias,), (self.fc2.weight, self.fc2.bias)))


class FusedSqueezeExcite(FusedModule):
    """FusedOps[reduce (weight, bias), SiLU, expand (weight, bias), sigmoid gate]."""
    fusion = "se_gate"

    def __init__(self, src: SqueezeExcite, gate: Pure, silu: Pure):
        super().__init__()
        self.conv_reduce, self.conv_expand = src.conv_reduce, src.conv_expand
        self.kernel = se_gate_kernel(gate, silu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:      # (N, C, H, W)
        return fused_ops(self.kernel, x, ((self.conv_reduce.weight, self.conv_reduce.bias),
                                          (self.conv_expand.weight, self.conv_expand.bias)))


class FusedConvBNSiLU(FusedModule):
    """conv -> FusedOps[BatchNorm (weight, bias) + SiLU] while training; eager BN otherwise."""
    fusion = "bn_silu"

    def __init__(self, src: ConvBNAct, silu: Pure):
        super().__init__()
        self.conv, self.bn, self._silu = src.conv, src.bn, silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv(x)
        bn = self.bn
        if not (bn.training and bn.track_running_stats and bn.affine):
            return F.silu(bn(c))
        bn.num_batches_tracked.add_(1)       # as nn.BatchNorm2d.forward does
        m = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
        kernel = bn_silu_kernel(self._silu, bn.running_mean, bn.running_var, m, bn.eps)
        return fused_ops(kernel, c, ((bn.weight, bn.bias),))


class FusedDepthwiseConv(FusedModule):
    """Depthwise conv: aten's forward, fusebench's C++ backward (kernels.dwconv). Same
    Parameters under the same names (weight, bias) as the nn.Conv2d it replaces."""
    fusion = "dwconv"

    def __init__(self, src: nn.Conv2d):
        super().__init__()
        self.in_channels, self.kernel_size = src.in_channels, src.kernel_size
        self.weight, self.bias = src.weight, src.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from fusebench.kernels.dwconv import cpu
        if cpu.runs_on(x):
            return cpu.dwconv_cpu(x, self.weight, self.bias)
        # e.g. bf16 under autocast: aten runs, and says so (captured as a warning event)
        warnings.warn(f"dwconv: the C++ kernel takes float32/float64 CPU input, got {x.dtype} "
                      f"on {x.device}; ran aten's depthwise conv instead", stacklevel=2)
        k = self.kernel_size[0]
        return F.conv2d(x, self.weight, self.bias, padding=k // 2, groups=self.in_channels)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, kernel_size={self.kernel_size}, backward=cpu"


class MemoryEfficientSiLU(SiLUMemEff, FusedModule):
    """kernels.act's SiLUMemEff (saves its input only), marked as the fuser's product."""
    fusion = "silu_me"


class FoldedConvAct(FusedModule):
    """Inference: conv with BatchNorm folded into its weight and bias, then the activation."""
    fusion = "conv_bn_fold"

    def __init__(self, conv: nn.Conv2d, act: nn.Module):
        super().__init__()
        self.conv, self.act = conv, act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(x))


@torch.no_grad()
def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A new conv equal to bn(conv(x)) with bn's running statistics (eval mode)."""
    fused = copy.deepcopy(conv)
    scale = bn.weight * torch.rsqrt(bn.running_var + bn.eps) if bn.affine else \
        torch.rsqrt(bn.running_var + bn.eps)
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    shift = bn.bias if bn.affine else torch.zeros_like(bn.running_mean)
    fused.weight.copy_(conv.weight * scale.reshape(-1, 1, 1, 1))
    fused.bias = nn.Parameter((bias - bn.running_mean) * scale + shift)
    return fused


# --- the registry of fusions ------------------------------------------------------------------


@dataclass(frozen=True)
class Fusion:
    name: str
    matches: tuple[type, ...]
    rewrite: Callable[[nn.Module, "FuseContext"], nn.Module | None]
    benches: tuple[str, ...]
    description: str = ""


@dataclass
class FuseContext:
    bench: str
    device: str
    ln2d: tuple[str, Callable] | None = None      # (impl name, fn), resolved once
    dwconv: bool | None = None                    # the dwconv kernel built here, checked once
    notes: list[tuple[str, str]] = field(default_factory=list)   # (event kind, message)
    impls: dict[str, str] = field(default_factory=dict)          # family -> impl override
    bound: dict[str, Pure] = field(default_factory=dict)         # family -> pair, once

    def act(self, family: str) -> Pure:
        """The act family's kernels for this fuse(): resolved on first use, then reused."""
        if family not in self.bound:
            self.bound[family] = bind_act(family, self.device, self.notes,
                                          self.impls.get(family))
        return self.bound[family]


FUSIONS: Registry[Fusion] = Registry("fusion")
ORDER: list[str] = []      # registration order = application order (Registry lists sorted)


def register_fusion(name: str, matches, benches=("train", "infer"), description: str = ""):
    """Decorator: `rewrite(module, ctx) -> new module | None` becomes fusion `name`. Fusions
    are tried in registration order; a module a fusion replaced is not visited again."""
    def deco(fn):
        types = matches if isinstance(matches, tuple) else (matches,)
        FUSIONS.add(name, Fusion(name, types, fn, tuple(benches),
                                 description or (fn.__doc__ or "").strip().split("\n")[0]))
        ORDER.append(name)
        return fn
    return deco


@register_fusion("conv_bn_fold", ConvBNAct, benches=("infer",))
def _fold(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct -> one conv with BatchNorm folded in (+ act), inference only."""
    return FoldedConvAct(fold_conv_bn(m.conv, m.bn), m.act)


@register_fusion("conv_bn_fold_seq", nn.Sequential, benches=("infer",))
def _fold_seq(m: nn.Sequential, ctx: FuseContext):
    """nn.Sequential(..., Conv2d, BatchNorm2d, ...) -> folded conv, BN dropped (user models)."""
    mods, out, i, hit = list(m), [], 0, False
    while i < len(mods):
        if (i + 1 < len(mods) and type(mods[i]) is nn.Conv2d and type(mods[i + 1]) is
                nn.BatchNorm2d and mods[i + 1].track_running_stats):
            out.append(FoldedConvAct(fold_conv_bn(mods[i], mods[i + 1]), nn.Identity()))
            i, hit = i + 2, True
        else:
            out.append(mods[i])
            i += 1
    return nn.Sequential(*out) if hit else None


@register_fusion("se_gate", SqueezeExcite)
def _se(m: SqueezeExcite, ctx: FuseContext):
    """SqueezeExcite -> one Function: reduce, SiLU, expand, sigmoid gate."""
    if type(m.act) is not nn.SiLU or type(m.gate) is not nn.Sigmoid:
        return None
    return FusedSqueezeExcite(m, ctx.act("se_gate"), ctx.act("silu"))


@register_fusion("bn_silu", ConvBNAct, benches=("train",))
def _bn_silu(m: ConvBNAct, ctx: FuseContext):
    """ConvBNAct with SiLU -> BN+SiLU in one Function that keeps only the BN input."""
    if type(m.act) is not nn.SiLU or type(m.bn) is not nn.BatchNorm2d:
        return None
    return FusedConvBNSiLU(m, ctx.act("silu"))


@register_fusion("silu_me", nn.SiLU)
def _silu(m: nn.SiLU, ctx: FuseContext):
    """nn.SiLU -> memory-efficient SiLU (saves its input only)."""
    return MemoryEfficientSiLU(impl=ctx.act("silu").impl)


@register_fusion("mlp_bias_gelu", ConvMlp)
def _mlp(m: ConvMlp, ctx: FuseContext):
    """ConvMlp -> fc1 without bias, then bias+GELU+fc2 in one Function (keeps fc1's output)."""
    if type(m.act) is not nn.GELU or (m.drop.p > 0 and ctx.bench == "train"):
        return None
    if m.fc2.kernel_size != (1, 1) or m.fc2.groups != 1 or m.fc1.bias is None \
            or m.fc2.bias is None:
        return None
    return FusedConvMlp(m, ctx.act("bias_gelu"))


@register_fusion("dwconv", nn.Conv2d, benches=("train",))
def _dwconv(m: nn.Conv2d, ctx: FuseContext):
    """Depthwise 5x5/7x7 conv (stride 1, same padding) -> aten forward + C++ backward (CPU)."""
    from fusebench.kernels.dwconv import cpu
    if not ctx.device.startswith("cpu") or cpu.supports(m):
        return None
    if ctx.dwconv is None:                 # build (or fail) once per fuse(), not per site
        ok, reason = cpu.build()
        ctx.dwconv = ok
        if not ok:
            ctx.notes.append(("kernel_fallback", f"dwconv cpu unavailable ({reason}); "
                                                 f"depthwise convs left to aten"))
    return FusedDepthwiseConv(m) if ctx.dwconv else None


@register_fusion("ln2d", LayerNorm2d)
def _ln2d(m: LayerNorm2d, ctx: FuseContext):
    """LayerNorm2d -> the fused LN2d kernel (function impl when it cannot build)."""
    if ctx.ln2d is None:
        ctx.ln2d = resolve_ln2d(ctx.device, ctx.notes)
    impl, fn = ctx.ln2d
    return FusedLayerNorm2d(m, impl, fn)


def resolve_ln2d(device: str, notes: list) -> tuple[str, Callable]:
    """The impl `fused` means here (cpu / triton), or `function` with a kernel_fallback note.

    cpu: bound as "cpu|channels_last". An NCHW x runs the C++ kernel with channels_last_out=True:
    y comes out channels-last as permute + layer_norm (eager) returns it, so the ConvMlp 1x1
    convs after it run oneDNN's NHWC path (NCHW made convnext_atto's conv time ~1.9x in a train
    step). A channels-last x (everything after the first LN) runs aten's layer_norm over the
    free NHWC view: measured faster than the C++ kernel's channels-last path for C >= 80
    (8x160x14x14 fwd+bwd 0.57 vs 1.1 ms; docs/fused.md)."""
    from fusebench.kernels import get_impl
    from fusebench.kernels.ln2d import fused
    name, reason = fused.resolve(device)
    if name is None:
        notes.append(("kernel_fallback", f"ln2d fused unavailable ({reason}); "
                                         f"ran '{fused.FALLBACK}' instead"))
        return fused.FALLBACK, get_impl("ln2d", fused.FALLBACK).fn
    fn = get_impl("ln2d", name).fn
    if name == "cpu":
        name, fn = "cpu|channels_last", _ln2d_by_layout(
            functools.partial(fn, channels_last_out=True), get_impl("ln2d", "channels_last").fn)
    notes.append(("info", f"ln2d: fused kernel = '{name}'"))
    return name, fn


def _ln2d_by_layout(nchw: Callable, cl: Callable) -> Callable:
    def ln2d(x, weight, bias, eps):
        dense_cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        return (cl if dense_cl else nchw)(x, weight, bias, eps)
    return ln2d


# --- the walk ---------------------------------------------------------------------------------


@dataclass
class FuseResult:
    model: nn.Module
    sites: Counter                   # fusion name -> modules rewritten
    unfused: Counter                 # leaf module type -> count, outside every fused module
    notes: list[tuple[str, str]]


def fuse(model: nn.Module, bench: str = "train", device: str = "cpu",
         only: list[str] | None = None, impls: dict[str, str] | None = None) -> FuseResult:
    """Apply every registered fusion for `bench`. Train: submodules are swapped in place
    (same Parameters, same names; the root is never replaced). Infer: a fused deep copy.
    `impls` overrides PREFERRED per act family, e.g. {"se_gate": "function"}."""
    if bench == "infer":
        model = copy.deepcopy(model)
    ctx = FuseContext(bench, str(device), impls=dict(impls or {}))
    sites: Counter = Counter()
    for fusion in FUSIONS.resolve(ORDER if only is None else [n for n in ORDER if n in only]):
        if bench not in fusion.benches:
            continue
        root = (fusion.rewrite(model, ctx) if bench == "infer" and type(model) in fusion.matches
                else None)      # the root is replaced only on the inference copy
        if root is not None:
            model, sites[fusion.name] = root.train(model.training), sites[fusion.name] + 1
        sites[fusion.name] += _apply(model, fusion, ctx)
    return FuseResult(model, +sites, unfused_leaves(model), ctx.notes)


def _apply(mod: nn.Module, fusion: Fusion, ctx: FuseContext) -> int:
    """Rewrite matching children of `mod` (recursively, outside fused modules); returns how
    many were replaced. Exact type match: a subclass may change forward."""
    n = 0
    for name, child in list(mod.named_children()):
        if isinstance(child, FusedModule):
            continue
        new = fusion.rewrite(child, ctx) if type(child) in fusion.matches else None
        if new is not None:
            new.train(child.training)
            setattr(mod, name, new)
            n += 1
        else:
            n += _apply(child, fusion, ctx)
    return n


def unfused_leaves(model: nn.Module) -> Counter:
    out: Counter = Counter()

    def walk(mod: nn.Module):
        if isinstance(mod, FusedModule):
            return
        children = list(mod.children())
        if not children and mod is not model:
            out[type(mod).__name__] += 1
        for c in children:
            walk(c)
    walk(model)
    return out


def list_fusions() -> list[str]:
    return list(ORDER)
