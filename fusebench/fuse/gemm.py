"""The dense GEMMs of fused mode's sites (1x1 convs on channels-last views, the MLP's linears),
on the CPU library that runs them faster.

aten's fp32 `mm` calls MKL's sgemm. On this project's AMD EPYC (Zen 4) VM MKL 2024.2 takes a
generic path (MKL_VERBOSE names no AVX-512), while oneDNN, which aten uses for its own convs,
runs AVX-512 there. Summed over one fused train step's calls (b8, 160 px, benchmarks/gemm.py),
oneDNN's matmul took 0.78-0.93x of mm's time for the forward GEMMs and 0.75-0.87x for the
input gradients (EfficientNet-B3 and ConvNeXt-atto, 1 and 2 threads; up to 1.7x per call at
narrow K). The weight gradient contracts the N*H*W rows: oneDNN's matmul would take it only
from a transposed copy, and its 1x1-conv weight gradient was slower (1.05-1.45x mm's time),
so it stays on mm in every backend.

That ranking is the CPU's, not the libraries': on an Intel Xeon (Emerald Rapids) VM, where MKL
runs AVX-512, the same recorded calls summed to 21.5 ms (mm) against 22.6 ms (oneDNN) forward
and 21.5 against 22.7 input gradients (EfficientNet-B3, 2 threads; thirty-fourth session).

Backends are a registry. `auto` (the default) races them, as cudnn.benchmark picks a
convolution algorithm: the first time a call of a given kind, shape, layout and thread count
comes, it runs on both (one warm-up each, then RACE_REPS alternating), and calls like it run on
the faster from then on, oneDNN only where it is RACE_MARGIN faster (aten's mm is the plain
path). Operands oneDNN does not take (not fp32 CPU with contiguous rows, or
under autocast) run aten without a race; a build without oneDNN (`torch.ops.mkldnn.
_linear_pointwise`) runs aten. Both accumulate in fp32 and differ in summation order only:
tests hold both to a float64 reference."""
from __future__ import annotations

import functools
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fusebench.errors import UsageError
from fusebench.fuse.race import Choice, Verdicts, best_times
from fusebench.registry import Registry


@dataclass(frozen=True)
class GemmBackend:
    """nt(a, w, b) = a @ w^T + b over a's last dim; nn(a, w) = a @ w; nt_add(res, a, w, b) =
    res + nt(a, w, b); `suits(a, w)`: the operands this backend takes (else aten runs that
    call); `missing()`: why it cannot run in this torch build (None: it can)."""
    name: str
    nt: Callable
    nn: Callable
    nt_add: Callable
    suits: Callable[..., bool]
    missing: Callable[[], str | None]
    description: str


def _aten_nt_add(res, a, w, b):
    acc = res + b if b is not None else res.clone()
    acc.view(-1, acc.shape[-1]).addmm_(a.reshape(-1, a.shape[-1]), w.t())
    return acc


def _onednn_missing() -> str | None:
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (MKLDNN)"
    try:
        torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return "this torch build has no torch.ops.mkldnn._linear_pointwise"
    return None


def _onednn_nt(a, w, b=None):
    return torch.ops.mkldnn._linear_pointwise(a, w, b, "none", [], "")


def _onednn_nn(a, w):
    # w^T as the strided view: oneDNN reads the transposed layout itself. A contiguous copy of
    # w^T first cost more than the GEMM gained at EfficientNet's 5x5 stages (benchmarks/gemm.py)
    return torch.ops.mkldnn._linear_pointwise(a, w.t(), None, "none", [], "")


def _onednn_nt_add(res, a, w, b):
    # the residual as oneDNN's binary post-op: one pass for the output, none for the add
    return torch.ops.mkldnn._linear_pointwise.binary(a, res, w, b, "add")


def _onednn_suits(a, w, b=None, res=None) -> bool:
    ts = [t for t in (a, w, b, res) if t is not None]
    return (all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
                for t in ts)
            and a.dim() >= 2 and not torch.is_autocast_enabled("cpu")
            and (res is None or res.shape == (*a.shape[:-1], w.shape[0])))


GEMMS: Registry[GemmBackend] = Registry("GEMM backend")
GEMMS.add("aten", GemmBackend("aten", F.linear, torch.matmul, _aten_nt_add,
                              lambda *a, **k: True, lambda: None,
                              "aten's mm / addmm (MKL's sgemm in x86 wheels)"))
GEMMS.add("onednn", GemmBackend(
    "onednn", _onednn_nt, _onednn_nn, _onednn_nt_add, _onednn_suits, _onednn_missing,
    "oneDNN's matmul (torch.ops.mkldnn._linear_pointwise) for forward and input gradients; "
    "aten's mm for weight gradients"))

CHOICES = ("auto", "onednn", "aten")


@functools.cache
def resolve(name: str = "auto") -> GemmBackend:
    """The backend `name` stands for here; a named one this build lacks is a UsageError."""
    if name == "auto":
        return GEMMS["aten"] if _onednn_missing() else GEMMS["onednn"]
    backend = GEMMS[name]
    why = backend.missing()
    if why:
        raise UsageError(f"GEMM backend '{name}' unavailable: {why}")
    return backend


def _checked(name: str) -> str:
    if name not in CHOICES:
        raise UsageError(f"GEMM backend '{name}': valid: {', '.join(CHOICES)}")
    resolve(name)
    return name


_choice = Choice(_checked)


def current() -> GemmBackend:
    return resolve(_choice.name)


def using(name: str):
    """Inside, fused sites run their GEMMs on backend `name` (the mode's --fused-gemm, the
    A/B side of benchmarks/fusion_ab.py --gemm)."""
    return _choice.using(name)


def set_default(name: str) -> None:
    """The process's backend from here on (the fused mode's worker, once per cell)."""
    _choice.set(name)


def describe() -> str:
    """The event line fused mode reports for its GEMMs."""
    name, b = _choice.name, current()
    if name != "auto":
        return f"gemm: '{b.name}' ({b.description})"
    if b.name == "aten":
        return f"gemm: auto -> 'aten' ({b.description}; no race: {_onednn_missing()})"
    return ("gemm: auto -> per call shape, the faster of 'onednn' and 'aten', timed the first "
            f"time the shape runs ({GEMMS['onednn'].description}; {GEMMS['aten'].description})")


def describe_raced() -> str | None:
    """What auto chose, once calls have run (None: nothing raced)."""
    return _raced.describe("gemm", "call shapes", {"onednn": "onednn", "aten": "aten"})


RACE_REPS = 3           # timed runs per side after the warm-up: the minimum is kept
RACE_MARGIN = 0.03      # oneDNN only where its time is at least this much below mm's
_raced = Verdicts()      # (kind, threads, shapes, strides, dtypes) -> the winner


def _key(kind: str, args) -> tuple:
    return (kind, torch.get_num_threads(),
            *((tuple(t.shape), t.stride(), t.dtype) if isinstance(t, torch.Tensor) else None
              for t in args))


def _race(kind: str, args) -> GemmBackend:
    """The faster backend for this call (fuse/race.py: a warm-up each, then RACE_REPS
    alternating); GEMMs are pure, so the extra runs change nothing but the clock."""
    sides = (GEMMS["aten"], GEMMS["onednn"])
    best = best_times({s.name: functools.partial(getattr(s, kind), *args) for s in sides},
                      RACE_REPS)
    return sides[1] if best["onednn"] < best["aten"] * (1 - RACE_MARGIN) else sides[0]


def _pick(kind: str, a, w, b=None, res=None) -> GemmBackend:
    got = current()
    if not got.suits(a, w, b, res=res):
        if _choice.name == got.name:        # asked for by name: say where it did not run
            warnings.warn(f"gemm: the {got.name} backend does not take these operands "
                          f"({a.dtype}, {a.device.type}, "
                          f"{'' if a.is_contiguous() else 'non-'}contiguous rows); aten's mm ran")
        return GEMMS["aten"]
    if _choice.name != "auto" or got.name == "aten":
        return got
    args = _ARGS[kind](a, w, b, res)
    return GEMMS[_raced.winner(_key(kind, args), lambda: _race(kind, args).name)]


# each kind's arguments, in its backend functions' order
_ARGS = {"nt": lambda a, w, b, res: (a, w, b), "nn": lambda a, w, b, res: (a, w),
         "nt_add": lambda a, w, b, res: (res, a, w, b)}


def raced() -> Counter:
    """How many call shapes auto sent to each backend in this process so far."""
    return _raced.tally()


def nt(a, w, b=None):
    """a @ w^T (+ b) over a's last dim, no autograd node (inside a Function)."""
    return _pick("nt", a, w, b).nt(a, w, b)


def nn(a, w):
    """a @ w over a's last dim (a linear's input gradient)."""
    return _pick("nn", a, w).nn(a, w)


def nt_add(res, a, w, b=None):
    """res + a @ w^T (+ b): res as the GEMM's accumulator, no separate pass for the add."""
    return _pick("nt_add", a, w, b, res).nt_add(res, a, w, b)


def wgrad(dy, x):
    """dy^T @ x over all rows: a weight's gradient, (N, K) from (..., N) and (..., K)."""
    return dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class _Linear(torch.autograd.Function):
    """linear(x, w, b) whose forward and input gradient run on the current backend."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return nt(x, w, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = dy.contiguous()        # a strided dy would be copied by oneDNN anyway
        dx = nn(dy, w) if ctx.needs_input_grad[0] else None
        dw = wgrad(dy, x) if ctx.needs_input_grad[1] else None
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] \
            else None
        return dx, dw, db


def linear(x, w, b=None):
    """F.linear(x, w, b) with autograd, its GEMMs on the current backend where it suits the
    operands; F.linear itself otherwise (so autocast and the aten backend see no change)."""
    backend = current()
    if backend.name == "aten" or not backend.suits(x, w, b):
        return F.linear(x, w, b)
    return _Linear.apply(x, w, b)


__all__ = ["CHOICES", "GEMMS", "GemmBackend", "current", "describe", "describe_raced", "linear",
           "nn", "nt", "nt_add", "raced", "resolve", "set_default", "using", "wgrad"]
