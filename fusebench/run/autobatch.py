"""The batch of a CPU run with no --batch-size: one that makes a step fit the budget.

A model's standard batch (32) makes a CPU step take seconds (efficientnet_b3 at 288 px: ~8 s
eager on 2 cores), so a cell's warm-up, timed steps and checks take many minutes. Before the
cells run, one short probe cell per model config (eager, batch PROBE_BATCH, 1 warm-up + 3
timed steps, no check) measures the eager cost per sample (its fastest step: the one least
disturbed by other work on the machine); the batch is the largest of the
usual batch sizes whose eager step takes at most budget / STEPS_PER_BUDGET. Every mode of a
model gets the same batch, so speed ratios compare like with like. A measured cost rather than
FLOPs: FLOP rates differ several-fold between models on a CPU (depthwise convs, memory-bound
ops), and the probe's time already includes them."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from fusebench.spec import CellSpec, Record

PROBE_BATCH = 2
PROBE_TIMEOUT_S = 300.0
STEPS_PER_BUDGET = 15     # an eager step of the chosen batch takes about budget / this
LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class BatchChoice:
    """The batch picked for one model config, and what it was picked from."""
    model: str
    bench: str
    img_size: int | None
    batch: int
    standard: int                  # the batch the run would have used (the model's standard)
    probe_ms: float | None = None  # fastest eager step at probe_batch
    probe_batch: int = PROBE_BATCH
    target_ms: float | None = None
    why: str = ""

    @property
    def ms_per_sample(self) -> float | None:
        return self.probe_ms / self.probe_batch if self.probe_ms else None

    def est_step_ms(self) -> float | None:
        """The eager step time expected at the chosen batch (linear in the batch)."""
        return self.ms_per_sample * self.batch if self.ms_per_sample else None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def pick(ms_per_sample: float, target_ms: float, standard: int) -> int:
    """The largest ladder batch <= target / cost per sample, within [1, standard]."""
    fits = target_ms / max(ms_per_sample, 1e-9)
    return max([b for b in LADDER if b <= min(fits, standard)], default=1)


def _group(spec: CellSpec) -> tuple:
    """Cells that share one batch: the same model config in every mode."""
    m = spec.model
    return (m.name, m.bench, m.img_size, m.amp, m.amp_dtype, m.kwargs, spec.channels_last,
            spec.dtype, spec.threads)


def probe_spec(spec: CellSpec) -> CellSpec:
    model = dataclasses.replace(spec.model, batch_size=min(PROBE_BATCH, spec.model.batch_size),
                                check=False)
    return dataclasses.replace(spec, mode="eager", mode_options=(), model=model, dist=None,
                               warmup=1, steps=3, budget=None,
                               timeout=min(spec.timeout, PROBE_TIMEOUT_S))


def choose(spec: CellSpec, budget_s: float, probe: Callable[[CellSpec], Record]) -> BatchChoice:
    """Probe one config and pick its batch; a probe that fails keeps the standard batch (the
    cells then report the failure themselves)."""
    ps = probe_spec(spec)
    rec = probe(ps)
    target = budget_s * 1e3 / STEPS_PER_BUDGET
    m, probe_batch = spec.model, ps.model.batch_size
    ran = rec.spec.model.img_size if rec.spec.model is not None else None
    base = dict(model=m.name, bench=m.bench, img_size=ran or m.img_size,
                standard=m.batch_size, probe_batch=probe_batch, target_ms=target)
    if rec.status != "ok" or not rec.step_ms:
        return BatchChoice(batch=m.batch_size, why=f"probe {rec.status}: standard batch",
                           **base)
    fastest = min(rec.step_ms.samples or (rec.step_ms.median,))
    per_sample = fastest / probe_batch
    batch = pick(per_sample, target, m.batch_size)
    why = (f"eager {per_sample:.3g} ms/sample at batch {probe_batch} -> batch {batch}, "
           f"~{per_sample * batch / 1e3:.2g} s steps (budget {budget_s:g} s / "
           f"{STEPS_PER_BUDGET})")
    return BatchChoice(batch=batch, probe_ms=fastest, why=why, **base)


def fit_batches(specs: list[CellSpec], budget_s: float,
                probe: Callable[[CellSpec], Record] | None = None,
                on_probe: Callable[[CellSpec], None] = lambda s: None
                ) -> tuple[list[CellSpec], list[BatchChoice]]:
    """Each spec with the batch chosen for its config (one probe per config), and for each
    spec the choice that set it (its `why` goes into the record: see commands/run.py)."""
    if probe is None:
        from fusebench.run.runner import RunOptions, run_one
        probe = lambda s: run_one(s, RunOptions(retry_oom=False))   # noqa: E731
    chosen: dict[tuple, BatchChoice] = {}
    for spec in specs:
        key = _group(spec)
        if key not in chosen:
            on_probe(spec)
            chosen[key] = choose(spec, budget_s, probe)
    picks = [chosen[_group(s)] for s in specs]
    return [s.with_model(batch_size=c.batch) for s, c in zip(specs, picks)], picks
