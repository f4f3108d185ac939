"""Kernel cells, worker side: run one in a worker (`run_cell`); run/kernel_plan.py plans them.

A kernel cell is one impl x mode x shape x direction. It measures the median time (and IQR),
effective GB/s from a bytes model, that as a % of a copy of the same tensor timed in the same
cell, the activation bytes saved for backward, and correctness vs a float64 reference on fresh
random inputs at the first call and again after timing. On CUDA the timing is
measure/cuda_timing.py's (L2-flushed step time, graph-replayed device time, launch_bound) with
NVML energy per step."""
from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from fusebench.dtypes import torch_dtype
from fusebench.errors import first_line
from fusebench.measure.correctness import finite_or_none
from fusebench.measure.events import EventLog
from fusebench.measure.noise import noise_event
from fusebench.spec import CellSpec, Correctness, ErrorInfo, Record, StepStats

GRAD_FLOOR = 1e-3   # a gradient's scale is at least this fraction of the largest gradient's


# ------------------------------------------------------------------------------------ problem
def problem_of(family: str):
    from fusebench.kernels import get_problem
    return get_problem(family)


class ImplModule(nn.Module):
    """Holds the family's parameter inputs (ln2d: weight, bias) as Parameters and its constants
    (ln2d: eps) as float attributes, so an impl fn can go through any mode's prepare(); the
    per-arity subclasses below call fn(x, *params, *consts) in a forward TorchScript can compile
    (fn is a closure variable, so scripting compiles the impl itself, or says why it cannot)."""

    def __init__(self, problem, params: dict[str, torch.Tensor]):
        super().__init__()
        self.problem = problem          # for the harness; forward never reads it
        self.names = list(problem.params)
        args = [nn.Parameter(params[n].detach().clone()) for n in problem.params]
        for i, a in enumerate([*args, *problem.consts]):
            setattr(self, f"a{i}", a)

    def inputs(self) -> list[nn.Parameter]:
        return [getattr(self, f"a{i}") for i in range(len(self.names))]


def impl_module(fn: Callable, problem, params: dict[str, torch.Tensor]) -> ImplModule:
    n = len(problem.params) + len(problem.consts)

    class Call0(ImplModule):
        def forward(self, x):
            return fn(x)

    class Call1(ImplModule):
        def forward(self, x):
            return fn(x, self.a0)

    class Call2(ImplModule):
        def forward(self, x):
            return fn(x, self.a0, self.a1)

    class Call3(ImplModule):
        def forward(self, x):
            return fn(x, self.a0, self.a1, self.a2)

    class Call4(ImplModule):        # gn_act: weight, bias, groups, eps
        def forward(self, x):
            return fn(x, self.a0, self.a1, self.a2, self.a3)

    classes = (Call0, Call1, Call2, Call3, Call4)
    if n >= len(classes):
        raise ValueError(f"kernel family {problem.family}: {n} arguments after x is more than "
                         f"the {len(classes) - 1} supported")
    return classes[n](problem, params)


def make_inputs(problem, shape, dtype, device, channels_last: bool, seed: int):
    """x, dy and the family's params of x's shape (a residual, glu's b) in x's memory format
    (as a model hands them: a layout copy inside the impl is not what is measured), the
    others as made; all random."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    dy = torch.randn(shape, generator=g)
    params = problem.make_params(shape, g) if problem.make_params else {}
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x, dy = (t.to(device=device, dtype=dtype).contiguous(memory_format=fmt) for t in (x, dy))
    return x, dy, {k: v.to(device=device, dtype=dtype).contiguous(
        memory_format=fmt if v.shape == x.shape else torch.contiguous_format)
        for k, v in params.items()}


def _reference(problem, x, dy, params, direction: str):
    xd = x.detach().double().requires_grad_()
    pd = [params[n].detach().double().requires_grad_() for n in problem.params]
    y = problem.reference(xd, *pd)
    if direction == "fwd":
        return y.detach(), None
    grads = torch.autograd.grad(y, (xd, *pd), dy.double())
    return y.detach(), dict(zip(problem.grad_names(), grads))


def _zero_grads(module: ImplModule, xg: torch.Tensor) -> None:
    xg.grad = None
    for p in module.inputs():
        p.grad = None


def _run_once(call, module: ImplModule, x, dy, direction: str, y_ref):
    """One forward (+ backward): (y, grads or None, what the call did wrong besides its
    numbers: kernels/checks.call_violations; no backward then)."""
    from fusebench.kernels.checks import call_violations
    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_(direction != "fwd")
    module.zero_grad(set_to_none=True)
    given = {"x": x.detach().clone(), **{n: p.detach().clone() for n, p in
                                         zip(module.names, module.inputs())}}
    y = call(xg)
    bad = call_violations(y, y_ref, given, {"x": xg, **dict(zip(module.names, module.inputs()))})
    if bad or direction == "fwd":
        return (y.detach() if torch.is_tensor(y) else None), None, bad
    y.backward(dy)
    grads = [xg.grad] + [p.grad for p in module.inputs()]
    return y.detach(), dict(zip(module.problem.grad_names(), grads)), []


@dataclasses.dataclass(frozen=True)
class KernelCheck:
    passed: bool
    err_out: float | None
    err_grad: float | None
    detail: str | None


def check(call, module: ImplModule, spec: CellSpec, shape, seed: int) -> KernelCheck:
    """One correctness check on fresh random inputs vs the float64 reference."""
    from fusebench.measure.correctness import TOLERANCES, grad_errs, rel_err
    problem = module.problem
    dtype = torch_dtype(spec.dtype)
    direction = spec.kernel.direction
    x, dy, params = make_inputs(problem, shape, dtype, spec.device, spec.channels_last, seed)
    with torch.no_grad():
        for name, p in zip(problem.params, module.inputs()):
            p.copy_(params[name])
    y_ref, g_ref = _reference(problem, x, dy, params, direction)
    y, grads, wrong = _run_once(call, module, x, dy, direction, y_ref)
    if wrong:       # in place, another dtype or shape: a mismatch whatever the numbers say
        return KernelCheck(False, None, None, "; ".join(wrong))
    tol = TOLERANCES[spec.dtype].base       # the model cells' base tolerance per dtype
    err_out = rel_err(y, y_ref)
    bad = [f"y {err_out:.1e}"] if not err_out <= tol else []
    err_grad = None
    if grads is not None:
        missing = [k for k, v in grads.items() if v is None]
        if missing:
            return KernelCheck(False, err_out, math.inf, f"no gradient for {', '.join(missing)}")
        errs = grad_errs(grads, g_ref, list(g_ref), GRAD_FLOOR)
        err_grad = max(errs.values())
        bad += [f"{k} {v:.1e}" for k, v in errs.items() if not v <= 3 * tol]  # sums over N*H*W
    detail = f"over tolerance {tol:g}: {', '.join(bad)}" if bad else None
    return KernelCheck(not bad, err_out, err_grad, detail)


def kink_recheck(result: KernelCheck, problem, again: Callable[[], KernelCheck]) -> KernelCheck:
    """A failed check of a problem with kinks, repeated once on other random inputs: the
    second decides (the model cells' rule, measure/correctness.rechecked): where float32
    rounding puts one pre-activation on the other side of ReLU's kink than float64 does,
    that element's gradient is off by all of dy (seen: 2 of 3.3M elements of a ResNet
    block's end, one seed in three); a wrong kernel fails both. The detail keeps the first
    failure."""
    if result.passed or not problem.kinks or result.err_out is None:
        return result
    second = again()
    verdict = "the first failure did not repeat" if second.passed else "failed again"
    return dataclasses.replace(second, detail=f"{result.detail}; on other inputs: "
                                              f"{second.detail or 'ok'} ({verdict})")


def saved_bytes(call, module, x, direction: str) -> int | None:
    """Unique storage bytes saved for backward by one forward (parameters excluded)."""
    from fusebench.measure.memory import SavedTensorBytes
    if direction == "fwd":
        return None
    counter = SavedTensorBytes(exclude=list(module.parameters()))
    xg = x.detach().clone(memory_format=torch.preserve_format).requires_grad_()
    with counter.track():
        y = call(xg)
    del y
    return counter.bytes


def _step_fn(call, module, x, dy, direction: str):
    """The timed step for a direction; bwd times backward only (forward runs untimed)."""
    xg = x.detach().requires_grad_(direction != "fwd")

    def fwd():
        with torch.no_grad():
            return call(x)

    def fwdbwd():
        _zero_grads(module, xg)
        call(xg).backward(dy)

    if direction == "fwd":
        return fwd, None
    if direction == "fwdbwd":
        return fwdbwd, None
    state = {}

    def setup():
        _zero_grads(module, xg)
        state["y"] = call(xg)

    def bwd():
        state.pop("y").backward(dy)

    return bwd, setup


def time_step(step, setup, n: int, device: str) -> list[float]:
    from fusebench.measure.timer import synchronize, time_steps
    if setup is None:
        return time_steps(step, n, device)
    out = []
    for _ in range(n):       # setup (the forward) must stay outside the timed region
        setup()
        synchronize(device)
        out += time_steps(step, 1, device)
    return out


def copy_fns(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The copies of x the kernels are held to (each a fresh output, as every kernel allocates):
    a plain clone and, on CPU, one whose output asks for huge pages as our C++ kernels' outputs
    do; `prealloc` (copy_ into a kept tensor) shows what fresh memory costs."""
    from fusebench.kernels.pages import empty_like_huge
    out = torch.empty_like(x)
    fns = {"plain": lambda: x.clone(memory_format=torch.preserve_format),
           "huge": lambda: empty_like_huge(x).copy_(x), "prealloc": lambda: out.copy_(x)}
    if x.device.type != "cpu":
        del fns["huge"]
    return fns


def _copy_record(x: torch.Tensor, samples: dict[str, list[float]]) -> dict[str, float | None]:
    """`copy_gbps`, the roofline: the faster of the plain and the hinted clone."""
    nbytes = 2 * x.numel() * x.element_size()
    gb = {k: nbytes / StepStats.from_samples(v).median / 1e6 for k, v in samples.items()}
    return {"copy_gbps": max(gb["plain"], gb.get("huge") or 0.0), "copy_plain_gbps": gb["plain"],
            "copy_huge_gbps": gb.get("huge"), "copy_prealloc_gbps": gb["prealloc"]}


def copy_gbps(x: torch.Tensor, n: int, device: str) -> dict[str, float | None]:
    """GB/s of the copies of x, each timed n times in a row (see copy_fns)."""
    from fusebench.measure.timer import time_steps
    return _copy_record(x, {k: time_steps(f, n, device) for k, f in copy_fns(x).items()})


def time_with_copies(step, setup, x: torch.Tensor, n: int, device: str):
    """(step samples, copy record). On CPU the kernel's steps and the copies alternate, one call
    each per round: a CPU VM's speed drifts within a cell, so a copy timed after all the steps
    is held to a different machine than the steps were (figures: docs/figures.md). On CUDA,
    timing is stable and steps stay back to back (per-step synchronisation would change what a
    launch-bound step measures), copies after."""
    from fusebench.measure.timer import time_steps
    if torch.device(device).type != "cpu":
        return time_step(step, setup, n, device), copy_gbps(x, max(n, 5), device)
    fns = copy_fns(x)
    steps: list[float] = []
    copies: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(max(n, 5)):
        if i < n:
            steps += time_step(step, setup, 1, device)
        for k, f in fns.items():
            copies[k] += time_steps(f, 1, device)
    return steps, _copy_record(x, copies)


def _timed(step, setup, x: torch.Tensor, nbytes: int, spec: CellSpec, events: EventLog):
    """(step samples, extra figures). CPU: steps and copies alternating (time_with_copies).
    CUDA: do_bench-style L2-flushed events plus the device time (measure/cuda_timing.py), NVML
    telemetry around the timed steps (energy per step)."""
    if torch.device(spec.device).type != "cuda":
        samples, copies = time_with_copies(step, setup, x, spec.steps, spec.device)
        gbps = nbytes / StepStats.from_samples(samples).median / 1e6
        return samples, {"gbps": gbps, "pct_of_copy": 100.0 * gbps / copies["copy_gbps"],
                         **copies}
    from fusebench.measure import cuda_timing
    from fusebench.measure.telemetry import GpuTelemetry
    tel = GpuTelemetry(spec.device)
    t = cuda_timing.time_kernel(cuda_timing.Backend(spec.device), step, setup,
                                copy_fns(x)["plain"], spec.steps, around_steps=lambda: tel)
    figures = cuda_timing.record_fields(t, nbytes, 2 * x.numel() * x.element_size(), events)
    return t.step_ms, {**figures, **(tel.result(samples=spec.steps) or {})}


# ------------------------------------------------------------------------------------ run_cell
class _Unavailable(Exception):
    pass


def _resolve_fn(problem, impl: str, device: str, dtype: str, events: EventLog, phase
                ) -> tuple[str, Callable]:
    """(name that really runs, fn). `auto` may fall back to its FALLBACK impl, with an event."""
    from fusebench.kernels.registry import get_impl, is_user_impl, load_user_impl
    if is_user_impl(impl):
        return impl, load_user_impl(impl)
    fam = problem.family
    k = get_impl(fam, impl)
    if impl == "auto" and problem.auto_module:
        auto = importlib.import_module(problem.auto_module)
        phase("build")
        name, reason = auto.resolve(device)
        if name is None:
            events.add("fallback", "fusebench",
                       f"{fam} auto could not be used ({reason}); ran '{auto.FALLBACK}'")
            return auto.FALLBACK, get_impl(fam, auto.FALLBACK).fn
        events.add("kernel", "fusebench", f"{fam} auto resolved to '{name}'")
        return name, get_impl(fam, name).fn
    for ok, reason in (k.available(device), k.takes(dtype)):
        if not ok:
            raise _Unavailable(reason)
    build = problem.build_for(impl)
    if build is not None:
        phase("build")
        ok, reason = build()
        if not ok:
            raise _Unavailable(reason)
    return impl, k.fn


def run_cell(spec: CellSpec, phase: Callable[[str], None]) -> Record:
    k = spec.kernel
    impl, shape, direction = k.impl, list(k.shape), k.direction
    events = EventLog()
    # measured kernel figures (gbps, pct_of_copy, copy_*_gbps, bytes, max_err) and ran_impl
    extra: dict[str, Any] = {"gbps": None, "pct_of_copy": None}

    def record(status, **kw):
        return Record(spec, status, events=events.events(), extra=extra, **kw)

    torch.manual_seed(spec.seed)
    try:
        with events.capture_warnings():
            ran, fn = _resolve_fn(problem_of(k.family), impl, spec.device, spec.dtype, events,
                                  phase)
    except _Unavailable as e:
        return record("unavailable", error=ErrorInfo("Unavailable", str(e)))
    if ran != impl:
        extra["ran_impl"] = ran        # the spec keeps the impl that was asked for
    from fusebench.modes import get_mode
    mode = get_mode(spec.mode)
    ok, reason = mode.available(spec.options(), spec.device)
    if not ok:
        return record("unavailable", error=ErrorInfo("Unavailable", reason))
    dtype = torch_dtype(spec.dtype)
    try:
        return _measure(spec, phase, fn, mode, dtype, shape, direction, events, extra, record)
    except Exception as e:  # an impl failing is this cell's record; other cells go on
        return record("error", error=ErrorInfo(type(e).__name__, first_line(e, 500)))


def _measure(spec, phase, fn, mode, dtype, shape, direction, events, extra, record) -> Record:
    from fusebench.measure.timer import time_call
    problem = problem_of(spec.kernel.family)
    x, dy, params = make_inputs(problem, shape, dtype, spec.device, spec.channels_last,
                                spec.seed + 1)
    module = impl_module(fn, problem, params)
    with events.capture_warnings(), events.capture_stderr():
        phase("compile")
        call = mode.prepare(module, (x,), spec.options(), events)
        # first call on fresh inputs: its time is the compile/first-call cost
        compile_s, first = time_call(lambda: check(call, module, spec, shape, spec.seed + 100),
                                     spec.device)
        first = kink_recheck(first, problem,
                             lambda: check(call, module, spec, shape, spec.seed + 101))
        phase("warmup")
        step, setup = _step_fn(call, module, x, dy, direction)
        if spec.warmup:
            time_step(step, setup, spec.warmup, spec.device)
        phase("timing")
        nbytes = problem.bytes_moved(shape, dtype, direction)
        samples, figures = _timed(step, setup, x, nbytes, spec, events)
        stats = StepStats.from_samples(samples)
        noise_event(stats, events)   # same noise warning as a model cell
        act = saved_bytes(call, module, x, direction)
        after = kink_recheck(check(call, module, spec, shape, spec.seed + 200), problem,
                             lambda: check(call, module, spec, shape, spec.seed + 201))
        mode.finish(events)
    extra.update(figures, bytes=nbytes)
    passed = first.passed and after.passed
    errs_out = [c.err_out for c in (first, after) if c.err_out is not None]
    errs_grad = [c.err_grad for c in (first, after) if c.err_grad is not None]
    detail = "; ".join(f"{at}: {c.detail}" for at, c in (("first_call", first),
                                                         ("after_timing", after)) if c.detail)
    corr = Correctness(passed=passed, max_rel_err_out=finite_or_none(max(errs_out, default=None)),
                       max_rel_err_grad=finite_or_none(max(errs_grad, default=None)),
                       checked_at=("first_call", "after_timing"), detail=detail or None)
    extra["max_err"] = finite_or_none(max(errs_out + errs_grad, default=None))
    return record("ok" if passed else "mismatch", step_ms=stats, compile_s=compile_s,
                  activation_bytes=act, correctness=corr)

