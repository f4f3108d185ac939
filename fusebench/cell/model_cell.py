"""One model x mode cell, run inside a worker process: build -> mode -> first call (compile) ->
correctness -> warm-up -> timed steps -> memory -> steady-state correctness -> events.

Memory (measure/memory.py): the baseline is taken after the model, its inputs, the optimizer and
the eager reference copy exist; `peak_mem_bytes` is the peak of the timed steps alone and
`extra["peak_mem_first_call_bytes"]` the peak of the first (compiling) call. The float64
correctness reference runs between the two windows, so it is in neither.

extra written here: first_call_s, input_shape ([C, H, W], or one shape per arg), inputs (dtype
and shape of each arg, models with their own example_inputs), tflops,
peak_mem_first_call_bytes, peak_mem_total_bytes, peak_mem_harness_bytes (left by the check
between the windows, taken out of the timed peak), contention (measure/contention.py fields over
the timed steps; gpu_processes on CUDA), rusage (measure/rusage.py: faults, context switches
and CPU ms per timed step), correctness_reference (per check: reference
dtype, tol_out, tol_grad, input_grads: how many input gradients were compared), GPU telemetry,
timing (measure/timer.py StepCount: how many timed steps and why) and warmup_ms (the timed
warm-up steps). The worker adds `threads`."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from fusebench.cell.model_step import CHECK_SEED, Loss, Step, first_tensor
from fusebench.cell.model_check import ReferenceRunner, checked_step, record_correctness
from fusebench.cell.report import Reporter
from fusebench.dtypes import amp_dtype_name, torch_dtype
from fusebench.cell.rank_cell import RankRun
from fusebench.measure import correctness as corr
from fusebench.measure.contention import CpuWindow, describe, gpu_other_processes, is_contended
from fusebench.measure.events import EventLog
from fusebench.measure.memory import PeakMemory, SavedTensorBytes
from fusebench.measure.rusage import UsageWindow
from fusebench.measure.telemetry import GpuTelemetry
from fusebench.measure.timer import time_budgeted, time_call, time_steps
from fusebench.models import inputs as model_inputs
from fusebench.spec import CellSpec, ErrorInfo, Record, StepStats

NOISY = 0.10   # IQR/median above this gets a noise warning event


@dataclass
class Built:
    """Everything the cell runs on, made before the memory baseline."""
    spec: CellSpec                 # with the image size actually run
    model: nn.Module
    inputs: model_inputs.ModelInputs
    loss: Loss
    params: int
    autocast: Callable
    opts: dict
    dist: RankRun | None
    opt: torch.optim.Optimizer | None
    ref: ReferenceRunner | None    # None: no correctness check
    flop_model: nn.Module

    @property
    def train(self) -> bool:
        return self.spec.model.bench == "train"


@dataclass
class FirstCall:
    step: Step
    result: corr.StepResult | None   # kept only when a check needs it, until that check
    seconds: float
    peak: int | None


@dataclass
class Timed:
    samples: list[float]
    peak: int | None
    harness: int            # bytes the check left between the windows, not in `peak`
    extra: dict             # telemetry, contention, timing (how many steps and why), warmup_ms


def _autocast(spec: CellSpec, device: torch.device) -> Callable:
    if not spec.model.amp:
        return contextlib.nullcontext
    amp_dtype = torch_dtype(amp_dtype_name(spec.model.amp_dtype, device.type))
    return lambda: torch.autocast(device.type, dtype=amp_dtype)


def _build(spec: CellSpec, phase: Reporter) -> Built:
    from fusebench.measure.flops import count_params
    from fusebench.models.source import coerce_kwargs, resolve_model

    device, dtype = torch.device(spec.device), torch_dtype(spec.dtype)
    train = spec.model.bench == "train"
    source = resolve_model(spec.model.name)
    torch.manual_seed(spec.seed)
    model = source.build(**coerce_kwargs(source.factory, dict(spec.model.kwargs)))
    params = count_params(model)
    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    model = model.to(device=device, dtype=dtype, memory_format=fmt).train(train)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    torch.manual_seed(spec.seed + 1)      # a model's own example_inputs draws from the global RNG
    batch = spec.model.batch_size
    inputs = source.example_inputs(model, spec.model.bench, batch, spec.model.img_size, device,
                                   dtype, gen, fmt, size_preset=spec.model.size_preset)
    if inputs.image_size is not None or spec.model.img_size is not None:
        # the size actually run (None: the model made its own inputs, --quick's size unused)
        spec = spec.with_model(img_size=inputs.image_size and inputs.image_size[1])
        phase.note(img_size=spec.model.img_size)   # kept if the runner has to kill the cell
    target = torch.randint(0, 1000, (batch,), generator=gen).to(device)
    # distributed: every rank uses the same seed and input, so DDP-averaged gradients equal
    # the single-process reference; eager is checked too (the wrapper is what's tested)
    dist = RankRun.from_spec(spec)
    autocast = _autocast(spec, device)
    check = spec.model.check and (spec.mode != "eager" or dist)
    # the optimizer is built here: its first construction imports dynamo (~76 MB), which is
    # the harness's cost, not the mode's
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if train else None
    loss = Loss(batch, target, spec.seed + 2)
    # the mode's options, plus what prepare may need to know of the step: bench, and the
    # autocast it runs under (fused mode's layout trial times the step the cell will time)
    return Built(spec, model, inputs, loss, params, autocast,
                 {**spec.options(), "bench": spec.model.bench, "autocast": autocast}, dist, opt,
                 ReferenceRunner(model, spec, autocast, inputs, loss) if check else None,
                 copy.deepcopy(model) if dist else model)   # sharded params cannot be counted


def _first_call(b: Built, mode, events: EventLog, mem: PeakMemory) -> FirstCall:
    args = b.inputs.args
    run_model = b.dist.wrap(mode, b.model, args, b.opts, events) if b.dist else b.model

    def first():
        fn = mode.prepare(run_model, args, b.opts, events)
        step = Step(fn, b.model, args, b.loss, b.train, b.autocast, b.opt)
        try:
            return step, step.run(seed=CHECK_SEED)
        except Exception as e:   # say what the model was given: most user-model failures
            model_inputs.annotate_call_error(e, b.inputs)
            raise
    seconds, (step, res) = time_call(first, b.spec.device)
    peak = mem.peak()
    if b.ref is None:
        return FirstCall(step, None, seconds, peak)
    # Not cloned: the check runs before any other step can overwrite them, and copies made on
    # this heap left holes the timed steps' allocations then fell into (the peak moved ~3%).
    grads = b.dist.full_grads(b.model) if b.dist and b.train else res.grads
    return FirstCall(step, res if grads is res.grads else corr.StepResult(res.out, grads),
                     seconds, peak)


def _steady_result(b: Built, step: Step, mode) -> tuple[dict, corr.StepResult]:
    """Weights after the timed steps and one more step on them (no update), with the inputs'
    gradients where the mode runs the same plan when an input requires grad (Mode docstring)
    and the run is single-process training."""
    return _result_now(b, step, mode.same_plan_with_input_grads and b.train and not b.dist)


def _result_now(b: Built, step: Step, input_grads: bool) -> tuple[dict, corr.StepResult]:
    """(the weights now, one step of `step` on them without an update)."""
    state = b.dist.full_state_dict(b.model) if b.dist else copy.deepcopy(b.model.state_dict())
    last = step.run(update=False, seed=CHECK_SEED, input_grads=input_grads)
    if b.dist and b.train:
        last = corr.StepResult(last.out, b.dist.full_grads(b.model))
    return state, last


def _repeat_failed(b: Built, step: Step, check: corr.Check, peak: int | None,
                   events: EventLog) -> corr.Check:
    """`check`, or where it failed, the same check repeated once on a slightly perturbed batch
    at the weights the mode has now (corr.rechecked says why; the record keeps both details and
    an event says it happened). Token inputs have nothing to perturb: there the weights are
    moved instead (_moved_weights) and put back after. Not for distributed runs (every rank
    would have to repeat it)."""
    if check.passed or b.dist:
        return check
    again = b.inputs.perturbed()
    state = copy.deepcopy(b.model.state_dict())
    input_grads = check.input_grads is not None   # asked the same as the failed check
    if again is not None:
        got = dataclasses.replace(step, inputs=again.args).run(
            update=False, seed=CHECK_SEED, input_grads=input_grads)
        out = corr.rechecked(check, b.ref.check(check.at, got, state, peak, inputs=again))
    else:
        try:
            moved = _moved_weights(b.model)
            got = step.run(update=False, seed=CHECK_SEED, input_grads=input_grads)
            out = corr.rechecked(check, b.ref.check(check.at, got, moved, peak),
                                 where="at perturbed weights")
        finally:
            b.model.load_state_dict(state)
    events.add("check_repeated", "fusebench", out.detail)
    return out


def _moved_weights(model, rel: float = 1e-3, seed: int = 0) -> dict:
    """Every floating Parameter times (1 + rel x fixed noise), in place; the state after. Where
    a value sits on an activation's kink by rounding, moving the weights moves every
    pre-activation off it, as a perturbed batch does for image inputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                noise = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
                p.mul_(1 + rel * noise)
    return copy.deepcopy(model.state_dict())


def _warmup_and_time(step: Step, spec: CellSpec, phase: Reporter, around_timing: Callable,
                     out: dict) -> list[float]:
    """Warm-up then the timed steps (inside `around_timing`: memory, contention, telemetry).
    The warm-up steps are timed too: a budget's step count is calibrated on them."""
    phase("warmup")
    phase.expect(spec.warmup)
    warm = time_steps(step, spec.warmup, spec.device, on_step=phase.step) if spec.warmup else []
    phase("timing")
    with around_timing():
        samples, count = time_budgeted(step, spec.device, budget_s=spec.budget,
                                       steps=spec.steps, warm_ms=warm, on_step=phase.step,
                                       on_total=phase.expect)
        out["n"] = len(samples)
    out["timing"], out["warmup_ms"] = count.to_dict(), warm
    return samples


@contextlib.contextmanager
def _timing_window(spec: CellSpec, mem: PeakMemory, out: dict) -> Iterator[None]:
    """What is measured around the timed steps, besides their times: the memory peak of these
    steps alone, other processes' CPU use, this process's faults, context switches and CPU
    time per step, NVML telemetry (GPU only; no NVML -> no fields)."""
    mem.reset_peak()
    # the CPU window outermost: a short one is held open after the steps (contention.py), with
    # the other windows already closed
    with CpuWindow(hold_for=torch.get_num_threads()) as window, \
            GpuTelemetry(spec.device) as telemetry, UsageWindow() as usage:
        yield
    out["peak"] = mem.peak()
    out["contention"] = window.result(threads=torch.get_num_threads())
    out["rusage"] = usage.result(out["n"])
    out["telemetry"] = telemetry.result(samples=spec.samples_per_step * out["n"]) or {}


def _timed(b: Built, step: Step, mem: PeakMemory, phase: Reporter, events: EventLog) -> Timed:
    measured: dict = {}
    samples = _warmup_and_time(step, b.spec, phase,
                               lambda: _timing_window(b.spec, mem, measured), measured)
    extra = {**measured["telemetry"], "timing": measured["timing"],
             "warmup_ms": measured["warmup_ms"], "rusage": measured["rusage"]}
    contention = measured["contention"]
    if contention is not None:
        if torch.device(b.spec.device).type == "cuda":
            contention["gpu_processes"] = gpu_other_processes(
                torch.device(b.spec.device).index or 0)
        extra["contention"] = contention
        if is_contended(contention):
            events.add("contention", "fusebench", describe(contention))
    if mem.heap_set is not None:       # CPU: the malloc policy the steps ran under
        extra["heap"] = mem.heap if mem.heap_set else "libc default (no mallopt)"
    return Timed(samples, measured["peak"], mem.harness, extra)


def run_cell(spec: CellSpec, phase: Callable[[str], None]) -> Record:
    from fusebench.modes import get_mode

    events = EventLog()
    phase = Reporter.of(phase)
    with events.capture_stderr(), events.capture_warnings():
        phase("build")
        b = _build(spec, phase)
        mode = get_mode(spec.mode)
        ok, reason = mode.available(b.opts, spec.device)   # dist support: checked by precheck
        if not ok:
            return Record(b.spec, "unavailable", events=events.events(),
                          error=ErrorInfo("Unavailable", reason), params=b.params)
        mem = PeakMemory(b.spec.device, b.spec.heap)
        mem.reset()
        phase("compile")
        first = _first_call(b, mode, events, mem)
        phase.note(first_call_s=first.seconds)     # kept if the cell is killed later
        checks, checked, via = [], first.step, ""
        if b.ref:
            phase("check")
            # what the float64 run leaves is not the mode's memory, nor is its heap layout
            checked, via, check = mem.aside(lambda: _first_check(b, first, mode, events))
            checks.append(check)
        step, first.result = first.step, None        # nothing of the check lives through timing
        mem.settle()
        timed = _timed(b, step, mem, phase, events)
        if b.ref:
            phase("check")
            state, last = _steady_result(b, checked, mode)
            checks.append(_repeat_failed(b, checked, b.ref.check("steady", last, state,
                                                                 first.peak), first.peak, events))
            del state, last
        mode.finish(events)
    checks = [dataclasses.replace(c, detail=f"{c.detail} {via}") if via else c for c in checks]
    return _record(b, step, first, timed, checks, events)


def _first_check(b: Built, first: FirstCall, mode,
                 events: EventLog) -> tuple[Step, str, corr.Check]:
    """(the step the checks run, the note for their details, the first check): of the first
    call's own step at the initial weights; where the checks run a twin
    (model_check.checked_step), of the twin's first step at the weights the first call left,
    timed for the record (it compiles: not the mode's compile time)."""
    checked, via = checked_step(first.step, mode, b.ref, events)
    if checked is first.step:
        got, state = first.result, b.ref.init_state
    else:
        seconds, (state, got) = time_call(lambda: _result_now(b, checked, False), b.spec.device)
        events.add("info", "fusebench", f"the correctness twin's first step took {seconds:.1f} s "
                                        "(compiling it; not in compile s)")
    return checked, via, _repeat_failed(b, checked, b.ref.check("first", got, state, first.peak),
                                        first.peak, events)


def _record(b: Built, step: Step, first: FirstCall, timed: Timed, checks: list,
            events: EventLog) -> Record:
    stats = StepStats.from_samples(timed.samples)
    if stats.median > 0 and stats.iqr / stats.median > NOISY:
        events.add("noise", "fusebench",
                   f"noisy timing: IQR/median = {stats.iqr / stats.median:.0%} (> {NOISY:.0%})")
    act = _activation_bytes(step, b.model) if b.train else None
    gflops, step_gflop = _flops(b)
    batch = b.spec.model.batch_size
    extra = {"first_call_s": first.seconds, "input_shape": b.inputs.shapes(),
             "tflops": step_gflop / (stats.median / 1e3) / 1e3 if step_gflop else None,
             "peak_mem_first_call_bytes": first.peak, "peak_mem_harness_bytes": timed.harness,
             "peak_mem_total_bytes": PeakMemory(b.spec.device).total_peak(), **timed.extra}
    if b.inputs.image_size is None:
        extra["inputs"] = b.inputs.describe()
    correctness, status = record_correctness(checks, events, extra)
    return Record(
        b.spec, status, params=b.params, gflops=gflops, throughput=batch / (stats.median / 1e3),
        step_ms=stats, compile_s=first.seconds, peak_mem_bytes=timed.peak,
        activation_bytes=act, events=events.events(), correctness=correctness, extra=extra)


def _activation_bytes(step: Step, model: nn.Module) -> int | None:
    """Bytes saved for backward by one forward of the prepared callable (params excluded).
    Done after timing and counters, so any retrace the hooks cause is not charged to the mode."""
    # FSDP2 parameters are DTensors: their local shards are what the process holds
    params = [getattr(p, "_local_tensor", p) for p in model.parameters()]
    counter = SavedTensorBytes(exclude=params)
    with counter.track(), warnings_silenced(), step.autocast():
        out = first_tensor(step.fn(*step.inputs))
    del out
    model.zero_grad(set_to_none=True)
    return counter.bytes


@contextlib.contextmanager
def warnings_silenced():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _flops(b: Built) -> tuple[float | None, float | None]:
    """Forward GFLOPs per sample and GFLOP per step (fwd+bwd for train), counted on an eager
    copy (mode-independent by definition)."""
    from fusebench.measure.flops import step_flops
    m = copy.deepcopy(b.flop_model)

    def forward():
        with b.autocast():
            out = first_tensor(m(*b.inputs.args))
            return b.loss(out) if b.train else out
    try:
        fwd, total = step_flops(forward, (lambda loss: loss.backward()) if b.train else None)
    except Exception:  # flop counting is informational; a model it cannot trace still benches
        return None, None
    return fwd / b.spec.model.batch_size / 1e9, total / 1e9
