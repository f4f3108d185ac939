"""The first lines of a run's output: what it will do and roughly how long it will take.

The estimate is rough on purpose: a cell's time is its timed part (the budget, or --steps x
the step time where that is known), plus warm-up, correctness checks (a float64 eager reference
costs ~2-3 eager steps, at the first call and again at steady state) and the first call, for
which a mode that compiles gets a per-device guess (FIRST_CALL_S)."""
from __future__ import annotations

from collections.abc import Sequence

from fusebench.spec import CellSpec

CELL_START_S = 5.0        # fork, build, FLOP count, record
CHECK_STEPS = 8           # two checks: mode step + eager + float64 eager (~2-3 steps) each
OTHER_STEPS = 3           # first call's step, activation bytes, FLOP count
# a cold compile of a mid-size CNN's train step on a 2-core CPU takes minutes; on a GPU less
FIRST_CALL_S = {("compile", "cpu"): 180.0, ("compile", "cuda"): 60.0}
WARM_FIRST_CALL = 0.25    # --repeat: processes 2..N reuse the cell's compile cache (a guess)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


def _first_call_s(spec: CellSpec) -> float:
    return FIRST_CALL_S.get((spec.mode, spec.device.split(":")[0]), 0.0)


def cell_seconds(spec: CellSpec, step_s: float | None, repeat: int = 1) -> tuple[float, bool]:
    """(estimated seconds, whether the step time was known: else steps are left out). repeat:
    worker processes per cell, each with its own start, warm-up and checks and budget / repeat
    of timed steps (run/repeat.py); only the first compiles cold."""
    first = _first_call_s(spec) * (1 + WARM_FIRST_CALL * (repeat - 1))
    base = CELL_START_S * repeat + first
    if step_s is None:
        return base + (spec.budget or 0.0), False
    if spec.budget is not None:
        from fusebench.measure.timer import calibrate_steps
        timed = repeat * step_s * calibrate_steps([step_s * 1e3], spec.budget / repeat,
                                                  max_steps=spec.steps)
    else:
        timed = repeat * spec.steps * step_s
    checks = CHECK_STEPS if spec.model is not None and spec.model.check and \
        spec.mode != "eager" else 0
    return base + timed + (repeat * (spec.warmup + OTHER_STEPS) + checks) * step_s, True


def estimate(specs: Sequence[CellSpec], step_s: Sequence[float | None] = (), repeat: int = 1
             ) -> tuple[float, bool, float]:
    """(total seconds, whether every step time was known, of which first calls). step_s: per
    spec, an eager step time in seconds where a probe measured one (else None)."""
    steps = list(step_s) or [None] * len(specs)
    total, known, first = 0.0, True, 0.0
    for s, t in zip(specs, steps):
        sec, k = cell_seconds(s, t, repeat)
        total, known = total + sec, known and k
        first += _first_call_s(s) * (1 + WARM_FIRST_CALL * (repeat - 1))
    return total, known, first


def default_sizes(specs: Sequence[CellSpec]) -> dict[tuple[str, str], int]:
    """(model, bench) -> the side length a cell with no --img-size runs at (nothing built)."""
    from fusebench.models.source import resolve_model
    from fusebench.run.probe import is_user_model
    out = {}
    for s in specs:
        m = s.model
        if m is None or m.img_size is not None or (m.name, m.bench) in out:
            continue
        if is_user_model(m.name):    # the CLI never imports user code (run/probe.py)
            continue
        try:
            src = resolve_model(m.name)
        except Exception:     # informational only; the cell reports a bad model itself
            continue
        out[(m.name, m.bench)] = src.input_size(m.bench)[1]
    return out


def short(model: str) -> str:
    return model.rsplit("/", 1)[-1]


def _amp_text(spec: CellSpec) -> str:
    """', AMP bfloat16 autocast' when the cells run under autocast (parameters stay in dtype)."""
    m = spec.model
    if m is None or not m.amp:
        return ""
    from fusebench.dtypes import amp_dtype_name
    return f", AMP {amp_dtype_name(m.amp_dtype, spec.device)} autocast"


def describe(specs: Sequence[CellSpec], picks: Sequence = (), repeat: int = 1,
             interleave: bool = True) -> list[str]:
    """The lines printed before the first cell runs. picks: per spec, the autobatch
    BatchChoice that set its batch (empty when the batch was given)."""
    specs = [s for s in specs if s.model is not None]
    if not specs:
        return []
    choices = list(dict.fromkeys(picks))
    sizes = default_sizes(specs)
    sizes.update({(c.model, c.bench): c.img_size for c in choices if c.img_size})
    s0, models = specs[0], [s.model for s in specs]
    names = ", ".join(dict.fromkeys(short(m.name) for m in models))
    modes = ", ".join(dict.fromkeys(s.mode for s in specs))
    benches = "/".join(dict.fromkeys(m.bench for m in models))
    batches = ",".join(str(b) for b in sorted({m.batch_size for m in models}))
    px = ",".join(str(x) for x in sorted({m.img_size or sizes.get((m.name, m.bench)) or 0
                                          for m in models}) if x) or "the model's"
    px = f"{px} px" + (" (--quick's, for the models that take an image)"
                       if any(m.size_preset for m in models) else "")
    why = " (CPU default: fitted to the budget; -b N to choose)" if choices else ""
    lines = [f"fusebench run: {len(specs)} cells on {s0.device}: {names} x {modes} ({benches})",
             f"  batch {batches}{why}, {px}, {s0.dtype}{_amp_text(s0)}"
             f"{', channels_last' if s0.channels_last else ''}"]
    lines += [f"    {short(c.model)}/{c.bench}: {c.why}" for c in choices]
    lines.append("  " + _steps_text(s0, repeat))
    if repeat > 1 and len(specs) > 1:
        lines.append("  " + ("processes interleaved: process k of every cell, then k+1 "
                             "(--sequential: one cell at a time; results saved after the "
                             "last round)" if interleave else
                             "processes sequential: each cell's back to back"))
    step_s = [c.est_step_ms() / 1e3 if c.est_step_ms() else None for c in picks]
    total, known, first = estimate(specs, step_s, repeat)
    unknown = "" if known else " + steps whose time is not known before the run"
    note = f", of which ~{_duration(first)} compiling" if first else ""
    lines.append(f"  estimated time: ~{_duration(total)}{note}{unknown} (rough; --timeout "
                 f"{s0.timeout:g} s per cell)")
    return lines


def _steps_text(s: CellSpec, repeat: int = 1) -> str:
    check = "; correctness vs float64 eager" if s.model.check else ""
    procs = (f"{repeat} worker processes (--repeat), each " if repeat > 1 else "")
    if s.budget is None:
        return f"per cell: {procs}{s.warmup} warm-up + {s.steps} timed steps{check}"
    share = f"~{s.budget / repeat:g} s of {s.budget:g} s" if repeat > 1 else f"~{s.budget:g} s"
    return (f"per cell: {procs}{s.warmup} warm-up steps, then {share} of timed steps (count "
            f"calibrated from the warm-up; --steps N fixes it){check}")
