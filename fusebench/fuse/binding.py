"""Impl binding: which registered kernel impl each fused op calls, resolved once per fuse().

The maths lives in fusebench.kernels (act families, ln2d); here only which impl runs. A
multi-op Function needs an impl's *pure* forward/backward pair (no autograd node of its own),
so each act impl is listed with its pair, in one call convention:
  silu: fwd(x) -> y, bwd(dy, x) -> dx;   se_gate: fwd(x, g[, hard]) -> y,
  bwd(dy, x, g[, hard]) -> (dx, dg) (hard: a hardsigmoid gate's slope, `hard_gate`);
  bias_gelu: fwd(x, b, approximate) -> y, bwd(dy, x, b, approximate) -> (dx, db), and
  bwd_y(dy, x, b, approximate) -> (dx, db, y): the backward that also recomputes y (the MLP's
  fc2 weight gradient needs it) from the same read of x, one exp per value for both;
  glu: fwd(a, b, act) -> act(a) * b, bwd(dp, a, b, act, want_p) -> (da, db[, act(a) * b]);
  grn: fwd(h, b, gamma, beta, eps, act) -> (u, G, m), bwd(du, h, b, gamma, beta, G, m, act,
  want_u) -> (dh, db, dgamma, dbeta[, u]): GRN after bias + act (kernels/grn)."""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fusebench.kernels import get_impl
from fusebench.kernels.act import cpu as act_cpu
from fusebench.kernels.act import triton as act_triton
from fusebench.kernels.bn_act import cpu as bn_act_cpu
from fusebench.kernels.bn_act import triton as bn_act_triton
from fusebench.kernels.bn_act.reference import ACTS
from fusebench.kernels.gn_act import cpu as gn_act_cpu
from fusebench.kernels.gn_act import triton as gn_act_triton
from fusebench.kernels.ln2d import auto as ln2d_auto
from fusebench.kernels.ln2d import cpu as ln2d_cpu
from fusebench.kernels.rms_norm import cpu as rms_norm_cpu
from fusebench.kernels.rms_norm import triton as rms_norm_triton


@dataclass(frozen=True)
class Pure:
    impl: str
    fwd: Callable
    bwd: Callable
    bwd_y: Callable | None = None     # bwd that also gives fwd's output (bias_gelu only)


# pairs bound under a name of their own whose impls are another family's: glu_packed is glu on
# the two halves of one packed projection output, fwd(ab, act, gate_second) -> act(gate) * up,
# bwd(dp, ab, act, gate_second, want_p) -> (d_ab[, act(gate) * up]), d_ab packed as ab is
FAMILY_OF = {"glu_packed": "glu"}


def _function_pairs() -> dict[str, tuple[Callable, ...]]:
    # looked up when bound, not at import, so a spy on the family module sees the calls
    out = {}
    for family in ("silu", "se_gate", "bias_gelu", "glu", "glu_packed", "grn"):
        mod = importlib.import_module(f"fusebench.kernels.{FAMILY_OF.get(family, family)}"
                                      ".function")
        out[family] = (getattr(mod, f"{family}_fwd"), getattr(mod, f"{family}_bwd"))
    out["bias_gelu"] += (functools.partial(out["bias_gelu"][1], want_y=True),)
    return out


def _cpu_pairs() -> dict[str, tuple[Callable, ...]]:
    from fusebench.kernels.glu import native as glu_native
    from fusebench.kernels.grn import native as grn_native
    ext, d = act_cpu.extension(), act_cpu.dense
    return {"glu": (glu_native.glu_cpu_fwd, glu_native.glu_cpu_bwd),
            "grn": (grn_native.grn_cpu_fwd, grn_native.grn_cpu_bwd),
            "glu_packed": (glu_native.glu_packed_cpu_fwd, glu_native.glu_packed_cpu_bwd),
            "silu": (lambda x: ext.silu_forward(d(x)), ext.silu_backward),
            "se_gate": (lambda x, g, hard=0.0: ext.se_gate_forward(d(x), g, hard),
                        lambda dy, x, g, hard=0.0: tuple(ext.se_gate_backward(dy, x, g, hard))),
            "bias_gelu": (lambda x, b, a: ext.bias_gelu_forward(d(x), b, a == "tanh"),
                          lambda dy, x, b, a: tuple(ext.bias_gelu_backward(dy, x, b,
                                                                           a == "tanh")),
                          lambda dy, x, b, a: tuple(ext.bias_gelu_backward(dy, x, b, a == "tanh",
                                                                           True)))}


def _triton_pairs() -> dict[str, tuple[Callable, ...]]:
    from fusebench.kernels.grn import native as grn_native
    tr = act_triton
    return {"glu": (tr.glu_triton_fwd, tr.glu_triton_bwd),
            "grn": (grn_native.grn_triton_fwd, grn_native.grn_triton_bwd),
            "glu_packed": (tr.glu_packed_triton_fwd, tr.glu_packed_triton_bwd),
            "silu": (tr.silu_triton_fwd, tr.silu_triton_bwd),
            "se_gate": (tr.se_gate_triton_fwd, tr.se_gate_triton_bwd),
            "bias_gelu": (lambda x, b, a: tr.bias_gelu_triton_fwd(x, b, a == "tanh"),
                          lambda dy, x, b, a: tr.bias_gelu_triton_bwd(dy, x, b, a == "tanh"),
                          lambda dy, x, b, a: tr.bias_gelu_triton_bwd(dy, x, b, a == "tanh",
                                                                      True))}


# impl name -> its pure pairs per act family (built when first bound: cpu loads its extension)
PAIRS: dict[str, Callable[[], dict[str, tuple[Callable, ...]]]] = {
    "function": _function_pairs, "cpu": _cpu_pairs, "triton": _triton_pairs}


def pure_pair(family: str, impl: str) -> Pure:
    if impl not in PAIRS:
        raise KeyError(f"no pure fwd/bwd pair for {family} impl {impl!r}")
    return Pure(impl, *PAIRS[impl]()[family])


def hard_gate(gate: Pure, slope: float) -> Pure:
    """A bound se_gate pair with the hardsigmoid gate (MobileNetV3's SE); `slope` as
    kernels/act/gate.py says (aten's float 1/6 or the exact one, per spelling)."""
    return Pure(f"{gate.impl}:hard", lambda x, g: gate.fwd(x, g, slope),
                lambda dy, x, g: gate.bwd(dy, x, g, slope))


def _by_layout(cl: Pure, nchw: Pure) -> Pure:
    """One pair that runs `cl` on channels-last x and `nchw` otherwise (decided by x's strides,
    both pairs bound once)."""
    def pick(x):
        return cl if x.is_contiguous(memory_format=torch.channels_last) \
            and not x.is_contiguous() else nchw
    both_y = cl.bwd_y is not None and nchw.bwd_y is not None
    return Pure(f"{cl.impl}|{nchw.impl}", lambda x, *a: pick(x).fwd(x, *a),
                lambda dy, x, *a: pick(x).bwd(dy, x, *a),
                (lambda dy, x, *a: pick(x).bwd_y(dy, x, *a)) if both_y else None)


# Best impl per device, by measurement (timings in docs/fused.md). On CPU the C++ se_gate pays
# (one-pass backward); the C++ silu backward is slower than aten's, so "function"; the C++
# bias_gelu pays on channels-last x (what the MLP sees after the LN2d kernel) but not on NCHW:
# "a|b" runs a on channels-last x and b otherwise.
# glu (SwiGLU's silu(a) * b): the C++ kernel, one pass per direction against aten's two forward
# and three backward passes, 1.5-1.6x fwd+bwd (benchmarks/llama_parts.py); CUDA: Triton, not
# yet timed there.
PREFERRED = {"cuda": {"silu": "triton", "se_gate": "triton", "bias_gelu": "triton",
                      "glu": "triton", "glu_packed": "triton", "grn": "triton"},
             "cpu": {"silu": "function", "se_gate": "cpu", "bias_gelu": "cpu|function",
                     "glu": "cpu", "glu_packed": "cpu", "grn": "cpu"}}
FALLBACK_IMPL = "function"


def bind_act(family: str, device: str, notes: list, impl: str | None = None) -> Pure:
    """The pure pair of `impl` (default: PREFERRED for the device; "a|b" = a on channels-last
    x, b otherwise) if usable here, else `function` with a kernel_fallback note. Resolved once
    per fuse(), never per call."""
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    name = impl or PREFERRED[device_type][family]
    pairs = [_bind_one(family, n, device, notes) for n in name.split("|")]
    pair = pairs[0] if len(pairs) == 1 else _by_layout(*pairs)
    notes.append(("info", f"{family}: kernel = '{pair.impl}'"))
    return pair


def _bind_one(family: str, name: str, device: str, notes: list) -> Pure:
    ok, reason = get_impl(FAMILY_OF.get(family, family), name).available(str(device))
    if ok and name == "cpu":
        ok, reason = act_cpu.build()             # a compile error shows up here, not mid-step
    if ok:
        return pure_pair(family, name)
    notes.append(("kernel_fallback", f"{family} '{name}' unavailable ({reason}); "
                                     f"ran '{FALLBACK_IMPL}' instead"))
    return pure_pair(family, FALLBACK_IMPL)


def resolve_ln2d(device: str, notes: list) -> tuple[str, Callable]:
    """The impl ln2d `auto` means here (cpu / triton), or `function` with a kernel_fallback note.

    cpu: the C++ kernel as cpu.LN2dCpuFunction (the custom op's per-call dispatch cost as much
    as the kernel at small shapes) with channels_last_out=True, for either layout of x. On an
    NCHW x y comes out channels-last as permute + layer_norm (eager) returns it, so the ConvMlp
    1x1 convs after it run oneDNN's faster NHWC path. A channels-last x (everything after the
    first LN) runs the kernel's per-row path, which since its backward lost GCC's gathers
    beats aten's layer_norm over the NHWC view at every ConvNeXt width, C = 40..768
    (benchmarks/ln2d_channels_last.py, docs/fused.md); before that the binding was
    "cpu|channels_last" (aten on channels-last x)."""
    name, reason = ln2d_auto.resolve(device)
    if name is None:
        notes.append(("kernel_fallback", f"ln2d auto unavailable ({reason}); "
                                         f"ran '{ln2d_auto.FALLBACK}' instead"))
        return ln2d_auto.FALLBACK, get_impl("ln2d", ln2d_auto.FALLBACK).fn
    fn = get_impl("ln2d", name).fn
    if name == "cpu":   # the kernel as an autograd.Function: no custom-op dispatch per call
        fn = functools.partial(ln2d_cpu.ln2d_cpu_function, channels_last_out=True)
    notes.append(("info", f"ln2d: kernel = '{name}'"))
    return name, fn


# cpu: one read of x per direction, 3.6-3.9x aten's F.rms_norm fwd+bwd at (8, 256, 256), 1 and
# 2 threads (benchmarks/llama_parts.py, docs/fused.md); on CPU aten composes F.rms_norm of
# pow / mean / rsqrt / mul. CUDA: aten's F.rms_norm, which has a fused CUDA kernel
# (aten::_fused_rms_norm): a written-out RMSNorm becomes that one call; the Triton kernel
# (`impls={"rms_norm": "triton"}`) is not yet timed against it.
RMS_NORM_PREFERRED = {"cuda": "eager", "cpu": "cpu"}


# the input dtypes each native rms_norm impl takes (the torch ones take any)
RMS_NORM_DTYPES = {"cpu": rms_norm_cpu.DTYPES, "triton": rms_norm_triton.DTYPES}


def resolve_rms_norm(device: str, notes: list,
                     impl: str | None = None) -> tuple[str, Callable, tuple | None]:
    """(impl name, fn(x, weight, eps), the dtypes it takes or None for any) for the rms_norm
    sites of this fuse(), or `function` with a kernel_fallback note when the preferred one
    cannot run here. cpu runs as an autograd.Function (RMSNormCpuFunction): no custom-op
    dispatch per call."""
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    name = impl or RMS_NORM_PREFERRED[device_type]
    ok, reason = get_impl("rms_norm", name).available(str(device))
    if ok and name == "cpu":
        ok, reason = rms_norm_cpu.build()        # a compile error shows up here, not mid-step
    if not ok:
        notes.append(("kernel_fallback", f"rms_norm '{name}' unavailable ({reason}); "
                                         f"ran '{FALLBACK_IMPL}' instead"))
        name = FALLBACK_IMPL
    notes.append(("info", f"rms_norm: kernel = '{name}'"))
    fn = rms_norm_cpu.rms_norm_cpu_function if name == "cpu" else get_impl("rms_norm", name).fn
    return name, fn, RMS_NORM_DTYPES.get(name)


@dataclass(frozen=True)
class BnActImpl:
    """A BN(train) + act kernel's pure pair (kernels/bn_act: forward(x, w, b, running_mean,
    running_var, momentum, eps, act) -> (y, mean, invstd); backward(dy, x, w, b, mean, invstd,
    act) -> (dx, dw, db)), which x it computes (runs_on(x); other x run aten's sequence) and
    apply (the write pass from saved statistics: a consumer's backward recomputes y with it)."""
    name: str
    forward: Callable
    backward: Callable
    runs_on: Callable
    apply: Callable     # (x, w, b, mean, invstd, act) -> y: the forward's write pass alone


BN_ACT_IMPLS = {"cpu": bn_act_cpu, "triton": bn_act_triton}
# cpu: one stats + one write pass forward, two passes backward, 1.6-2.7x aten's BN + SiLU
# fwd+bwd at EfficientNet shapes (benchmarks/bn_act.py, docs/fused.md). CUDA keeps aten's
# sequence: the Triton kernel's fwd+bwd took 1.35-2.4x its device time on an H200 at 8x96x56x56
# (docs/kernels.md, GPU eighteenth session); `--fused-bn-act triton` runs it.
BN_ACT_PREFERRED = {"cuda": "aten", "cpu": "cpu"}


def _native_or_aten(family: str, impls: dict, preferred: dict, device: str, notes: list,
                    impl: str | None) -> tuple:
    """(the kernel module of the impl to run, or None for aten's sequence; its name) for a
    norm + act family, with an `info` event naming it, and a kernel_fallback note where the
    impl asked for cannot run here. The C++ one is built now: a compile error shows up here,
    not mid-step."""
    device_type = "cuda" if str(device).startswith("cuda") else "cpu"
    name = impl or preferred[device_type]
    mod = impls.get(name)
    if mod is None and name != "aten":
        raise KeyError(f"{family} impl {name!r}: one of aten, {', '.join(impls)}")
    if mod is not None:
        ok, reason = mod.available(str(device))
        if ok and name == "cpu":
            ok, reason = mod.build()
        if not ok:
            notes.append(("kernel_fallback", f"{family} '{name}' unavailable ({reason}); "
                                             f"ran 'aten' instead"))
            mod, name = None, "aten"
    notes.append(("info", f"{family}: kernel = '{name}'"))
    return mod, name


def resolve_bn_act(device: str, notes: list, impl: str | None = None) -> BnActImpl | None:
    """The bn_act kernel for this fuse() (None: aten's sequence), said as an event; resolved
    once."""
    mod, name = _native_or_aten("bn_act", BN_ACT_IMPLS, BN_ACT_PREFERRED, device, notes, impl)
    return None if mod is None else BnActImpl(name, mod.forward, mod.backward, mod.runs_on,
                                                 mod.apply)


@dataclass(frozen=True)
class GnActImpl:
    """The GroupNorm + act impl of one fuse(): fn(x, w, b, groups, eps, act) -> y (an
    autograd.Function saving x and the (N, G) statistics, or aten's sequence) and which x it
    computes, runs_on(x, groups) (other x run aten's sequence)."""
    name: str
    fn: Callable
    runs_on: Callable


def _aten_gn_act(x, w, b, groups: int, eps: float, act: str):
    return ACTS[act](torch.nn.functional.group_norm(x, groups, w, b, eps))


GN_ACT_IMPLS = {"cpu": gn_act_cpu, "triton": gn_act_triton}
# cpu: one stats + one write pass forward, two passes backward, saving x only; GroupNorm + SiLU
# fwd+bwd 1.1-2.3x aten's at diffusion UNet shapes, both layouts (benchmarks/unet_parts.py,
# docs/fused.md). CUDA keeps aten's sequence until the Triton kernel is timed against it there
# (`--fused-gn-act triton` runs it).
GN_ACT_PREFERRED = {"cuda": "aten", "cpu": "cpu"}


def resolve_gn_act(device: str, notes: list, impl: str | None = None) -> GnActImpl:
    """The gn_act impl for this fuse() (aten's sequence where the kernel cannot run here),
    said as an event; resolved once."""
    mod, name = _native_or_aten("gn_act", GN_ACT_IMPLS, GN_ACT_PREFERRED, device, notes, impl)
    if mod is None:
        return GnActImpl("aten", _aten_gn_act, lambda x, groups: False)
    function = mod.GNActCpuFunction if name == "cpu" else mod.GNActTritonFunction
    return GnActImpl(name, function.apply, mod.runs_on)
