"""One model x mode cell, run inside a worker process: build -> mode -> first call (compile) ->
correctness -> warm-up -> timed steps -> memory -> steady-state correctness -> events."""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch
import torch.nn as nn

from fusebench.cell.rank_cell import RankRun
from fusebench.measure import correctness as corr
from fusebench.measure.events import EventLog
from fusebench.measure.memory import PeakMemory, SavedTensorBytes
from fusebench.measure.telemetry import GpuTelemetry
from fusebench.measure.timer import time_call, time_steps
from fusebench.spec import CellSpec, Correctness, ErrorInfo, Record, StepStats

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NOISY = 0.10   # IQR/median above this gets a noise warning event


def _first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
            with contextlib.suppress(TypeError):
                return _first_tensor(o)
    raise TypeError(f"model output has no tensor (got {type(out).__name__})")


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    # classification heads get cross-entropy; anything else a mean square (still exercises bwd)
    if out.dim() == 2 and out.shape[0] == target.shape[0]:
        return nn.functional.cross_entropy(out.float(), target % out.shape[1])
    return out.float().pow(2).mean()


@dataclass
class Step:
    """Callable train/infer step over a prepared callable; keeps the last output."""
    fn: Callable
    model: nn.Module
    x: torch.Tensor
    target: torch.Tensor
    train: bool
    autocast: Callable
    opt: torch.optim.Optimizer | None = None

    def run(self, update: bool = True, seed: int | None = None) -> corr.StepResult:
        if seed is not None:   # same dropout masks for the mode and its reference
            torch.manual_seed(seed)
        if not self.train:
            with torch.inference_mode(), self.autocast():
                out = _first_tensor(self.fn(self.x))
            return corr.StepResult(out, None)
        self.model.zero_grad(set_to_none=True)
        with self.autocast():
            out = _first_tensor(self.fn(self.x))
            loss = _loss(out, self.target)
        loss.backward()
        grads = {n: p.grad for n, p in self.model.named_parameters() if p.requires_grad}
        result = corr.StepResult(out.detach(), grads)
        if update:
            self.opt.step()
        return result

    def __call__(self):
        self.run()


CHECK_SEED = 12345


def _eager_step(model: nn.Module, x, target, train: bool, autocast) -> corr.StepResult:
    return Step(model, model, x, target, train, autocast).run(update=False, seed=CHECK_SEED)


class Reference:
    """Eager copies of the model for correctness: float64 where it fits, and the run dtype."""

    def __init__(self, model: nn.Module, spec: CellSpec, autocast):
        self.model = copy.deepcopy(model)
        self.spec = spec
        self.autocast = autocast

    def run(self, state: dict, x, target, fits64: bool):
        train = self.spec.model.bench == "train"
        self.model.load_state_dict(state)
        eager = _eager_step(self.model, x, target, train, self.autocast)
        eager = corr.StepResult(eager.out.clone(), _clone(eager.grads))
        if not fits64:
            return eager, eager, self.spec.dtype
        m64 = copy.deepcopy(self.model).double()
        ref = _eager_step(m64, x.double(), target, train, contextlib.nullcontext)
        del m64
        return ref, eager, "float64"


def _clone(grads):
    return None if grads is None else {k: (v.clone() if v is not None else None)
                                       for k, v in grads.items()}


def _fits_float64(device: torch.device, first_peak: int | None) -> bool:
    """A float64 copy needs ~2x the run's working set; skip it when that would not fit."""
    need = 2 * (first_peak or 0)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return need < 0.8 * free
    return need < 0.6 * psutil.virtual_memory().available


def run_cell(spec: CellSpec, phase: Callable[[str], None]) -> Record:
    from fusebench.measure.flops import count_params
    from fusebench.models.source import coerce_kwargs, resolve_model
    from fusebench.modes import get_mode

    events = EventLog()
    device = torch.device(spec.device)
    dtype = DTYPES[spec.dtype]
    amp_dtype = torch.bfloat16 if device.type == "cpu" else torch.float16
    autocast = ((lambda: torch.autocast(device.type, dtype=amp_dtype)) if spec.model.amp
                else contextlib.nullcontext)
    train = spec.model.bench == "train"
    opts = {**spec.options(), "bench": spec.model.bench}
    base = dict(params=None)

    with events.capture_stderr(), events.capture_warnings():
        phase("build")
        source = resolve_model(spec.model.name)
        torch.manual_seed(spec.seed)
        model = source.build(**coerce_kwargs(source.factory, dict(spec.model.kwargs)))
        c, h, w = source.input_size(spec.model.bench, spec.model.img_size, model=model)
        spec = spec.with_model(img_size=h)   # the size actually run
        base["params"] = count_params(model)
        fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
        model = model.to(device=device, dtype=dtype, memory_format=fmt).train(train)
        gen = torch.Generator().manual_seed(spec.seed + 1)
        batch = spec.model.batch_size
        x = torch.randn(batch, c, h, w, generator=gen).to(device, dtype)
        x = x.contiguous(memory_format=fmt)
        target = torch.randint(0, 1000, (batch,), generator=gen).to(device)
        # distributed: every rank uses the same seed and input, so DDP-averaged gradients equal
        # the single-process reference; eager is checked too (the wrapper is what's tested)
        dist = RankRun.from_spec(spec)
        ref = (Reference(model, spec, autocast) if spec.model.check and (spec.mode != "eager" or dist)
               else None)
        init_state = copy.deepcopy(model.state_dict()) if ref else None
        flop_model = copy.deepcopy(model) if dist else model   # sharded params cannot be counted

        mode = get_mode(spec.mode)
        ok, reason = mode.available(opts, spec.device)   # dist support: checked by precheck
        if not ok:
            return Record(spec, "unavailable", events=events.events(),
                                   error=ErrorInfo("Unavailable", reason), **base)

        mem = PeakMemory(device)
        mem.reset()
        phase("compile")
        run_model = dist.wrap(mode, model, (x,), opts, events) if dist else model
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if train else None

        def first():
            fn = mode.prepare(run_model, (x,), opts, events)
            step = Step(fn, model, x, target, train, autocast, opt)
            return step, step.run(seed=CHECK_SEED)
        compile_s, (step, first_res) = time_call(first, device)
        first_res = corr.StepResult(first_res.out.clone(), _clone(
            dist.full_grads(model) if dist and train else first_res.grads))
        first_peak = mem.peak()

        checks: list[corr.Check] = []
        tol = corr.tolerance_for(spec.dtype, spec.model.amp)
        fits64 = _fits_float64(device, first_peak)
        if ref:
            phase("check")
            r64, eager, rdt = ref.run(init_state, x, target, fits64)
            checks.append(corr.check_step("first", first_res, r64, eager, tol, rdt))
            del r64, eager

        phase("warmup")
        for _ in range(spec.warmup):
            step()
        phase("timing")
        # NVML sampling thread during the timed steps (GPU only; absent NVML -> no fields)
        with GpuTelemetry(spec.device) as telemetry:
            samples = time_steps(step, spec.steps, device)
        peak = max(mem.peak() or 0, first_peak or 0)

        if ref:
            phase("check")
            state = dist.full_state_dict(model) if dist else copy.deepcopy(model.state_dict())
            last = step.run(update=False, seed=CHECK_SEED)
            if dist and train:
                last = corr.StepResult(last.out, dist.full_grads(model))
            r64, eager, rdt = ref.run(state, x, target, fits64)
            checks.append(corr.check_step("steady", last, r64, eager, tol, rdt))
            del r64, eager, last
        mode.finish(events)

    stats = StepStats.from_samples(samples)
    if stats.median > 0 and stats.iqr / stats.median > NOISY:
        events.add("noise", "fusebench",
                   f"noisy timing: IQR/median = {stats.iqr / stats.median:.0%} (> {NOISY:.0%})")
    act = _activation_bytes(step, model) if train else None
    gflops, step_gflop = _flops(flop_model, x, target, train, autocast)
    throughput = batch / (stats.median / 1e3)
    extra = {"first_call_s": compile_s, "input_shape": [c, h, w],
             "tflops": step_gflop / (stats.median / 1e3) / 1e3 if step_gflop else None,
             "peak_mem_total_bytes": mem.total_peak(),
             **(telemetry.result(samples=batch * spec.steps) or {})}
    correctness = None
    status = "ok"
    if checks:
        passed = all(c.passed for c in checks)
        if any(c.weak for c in checks):
            events.add("weak_check", "fusebench", "correctness check is weak in this dtype: "
                       "eager itself is far from the float64 reference")
        correctness = Correctness(
            passed=passed,
            max_rel_err_out=corr.finite_or_none(max(c.err_out for c in checks)),
            max_rel_err_grad=corr.finite_or_none(max((c.err_grad for c in checks
                                                      if c.err_grad is not None), default=None)),
            checked_at=tuple(c.at for c in checks),
            detail="; ".join(c.detail for c in checks))
        status = "ok" if passed else "mismatch"
    return Record(
        spec, status, params=base["params"], gflops=gflops, throughput=throughput,
        step_ms=stats, compile_s=compile_s, peak_mem_bytes=peak, activation_bytes=act,
        events=events.events(), correctness=correctness, extra=extra)


def _activation_bytes(step: Step, model: nn.Module) -> int | None:
    """Bytes saved for backward by one forward of the prepared callable (params excluded).
    Done after timing and counters, so any retrace the hooks cause is not charged to the mode."""
    # FSDP2 parameters are DTensors: their local shards are what the process holds
    params = [getattr(p, "_local_tensor", p) for p in model.parameters()]
    counter = SavedTensorBytes(exclude=params)
    with counter.track(), warnings_silenced(), step.autocast():
        out = _first_tensor(step.fn(step.x))
    del out
    model.zero_grad(set_to_none=True)
    return counter.bytes


@contextlib.contextmanager
def warnings_silenced():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _flops(model, x, target, train, autocast) -> tuple[float | None, float | None]:
    """Forward GFLOPs per sample and GFLOP per step (fwd+bwd for train), counted on an eager
    copy (mode-independent by definition)."""
    from fusebench.measure.flops import step_flops
    m = copy.deepcopy(model)

    def forward():
        with autocast():
            out = _first_tensor(m(x))
            return _loss(out, target) if train else out
    try:
        fwd, total = step_flops(forward, (lambda loss: loss.backward()) if train else None)
    except Exception:  # flop counting is informational; a model it cannot trace still benches
        return None, None
    finally:
        del m
    return fwd / x.shape[0] / 1e9, total / 1e9
