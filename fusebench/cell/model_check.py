"""Correctness of a model cell: eager reference copies and what the record says about them.

The mode's step is compared with eager on the same weights and inputs. Where a float64 copy fits,
the reference is float64 eager and the tolerance SLACK x eager's own error against it. Where it
does not, the reference is eager in the run dtype, and eager's own error is still measured
against float64, on the largest sub-batch whose float64 copy fits: the same "k x eager's error"
rule, never a bare tolerance. A model that cannot run in float64 at all (its own code casts to
float32 next to float64 parameters: guided-diffusion's and Stable Diffusion's GroupNorm32) is
checked against eager in the run dtype at the bare tolerance, and the check says why.
`extra["correctness_reference"]` says which was used."""
from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections import Counter

import psutil
import torch
import torch.nn as nn

from fusebench.cell.model_step import Loss, Step, eager_step
from fusebench.errors import first_line
from fusebench.measure import correctness as corr
from fusebench.measure.events import EventLog
from fusebench.measure.random_ops import describe, random_ops
from fusebench.models.inputs import ModelInputs
from fusebench.spec import CellSpec, Correctness


def _float64_room(device: torch.device) -> float:
    """Bytes a float64 copy may use: most of what is free now."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return 0.8 * free
    return 0.6 * psutil.virtual_memory().available


def float64_batch(device: torch.device, working_set: int | None, batch: int) -> int:
    """The largest batch (batch, batch/2, ..., 2) whose float64 run fits (~2x the run's working
    set, which scales with the batch); 0 when none does."""
    room, need = _float64_room(device), 2 * (working_set or 0)
    n = batch
    while n >= 2 or n == batch:
        if need * n / batch < room:
            return n
        n //= 2
    return 0


def _sub_args(args: tuple, batch: int, n: int) -> tuple:
    return tuple(a[:n] if torch.is_tensor(a) and a.dim() and a.shape[0] == batch else a
                 for a in args)


def _clone(r: corr.StepResult) -> corr.StepResult:
    def each(d):
        return None if d is None else {k: (v.clone() if v is not None else None)
                                       for k, v in d.items()}
    return corr.StepResult(r.out.clone(), each(r.grads), each(r.inputs))


class ReferenceRunner:
    """Eager copies of the model for correctness: float64 where it fits, and the run dtype."""

    def __init__(self, model: nn.Module, spec: CellSpec, autocast, inputs: ModelInputs,
                 loss: Loss):
        self.model = copy.deepcopy(model)
        self.init_state = copy.deepcopy(model.state_dict())
        self.spec, self.autocast, self.inputs, self.loss = spec, autocast, inputs, loss
        self.train = spec.model.bench == "train"
        self.tol = corr.tolerance_for(spec.dtype, spec.model.amp)
        self.no_float64: str | None = None   # why the model fails in float64, once it did
        self._random: Counter | None = None

    def random_ops(self) -> Counter:
        """{op: calls} of the random ops eager's step draws from torch's generator (a live
        dropout), found once, on the run-dtype copy at the initial weights."""
        if self._random is None:
            self.model.load_state_dict(self.init_state)
            self._random = random_ops(lambda: self._eager(self.inputs.args, self.loss, False))
        return self._random

    def check(self, at: str, got: corr.StepResult, state: dict,
              working_set: int | None, inputs: ModelInputs | None = None) -> corr.Check:
        """got (the mode's step on `inputs`, default the cell's) against eager at `state`."""
        inputs = inputs or self.inputs
        asked = got.inputs is not None      # input gradients: the reference answers the same
        batch = self.spec.model.batch_size
        n = float64_batch(torch.device(self.spec.device), working_set, batch)
        self.model.load_state_dict(state)
        eager = _clone(self._eager(inputs.args, self.loss, asked))
        if n == batch and self.no_float64 is None:
            ref = self._float64_or_none(inputs.reference(), self.loss, asked)
            if ref is not None:
                return corr.check_step(at, got, ref, eager, self.tol, "float64")
        err, note = None, "(no float64 copy fits: bare tolerance)"
        if n and n < batch and self.no_float64 is None:
            self.model.load_state_dict(state)
            args, loss = _sub_args(inputs.args, batch, n), self.loss.sub(n)
            sub_eager = _clone(self._eager(args, loss, asked))
            sub_ref = self._float64_or_none(ModelInputs(args).reference(), loss, asked)
            if sub_ref is not None:
                err = corr.eager_error(sub_eager, sub_ref, self.tol)
                note = f"(eager's own error from float64 on a sub-batch of {n})"
        if self.no_float64 is not None:
            note = f"(the model fails in float64: {self.no_float64}; bare tolerance)"
        return corr.check_step(at, got, eager, eager, self.tol, self.spec.dtype, err, note)

    def _eager(self, args: tuple, loss: Loss, input_grads: bool) -> corr.StepResult:
        try:
            return eager_step(self.model, args, loss, self.train, self.autocast, input_grads)
        finally:   # the caller clones what it keeps: no reference grads live through timing
            self.model.zero_grad(set_to_none=True)

    def _float64_or_none(self, args: tuple, loss: Loss,
                         input_grads: bool) -> corr.StepResult | None:
        """The float64 step, or None (and why, kept: later checks skip it) where the model's
        own code fails in float64: an error there is the model's, not the mode's under test."""
        try:
            return self._float64(args, loss, input_grads)
        except (RuntimeError, TypeError, ValueError) as e:
            self.no_float64 = first_line(str(e))
            return None

    def _float64(self, args: tuple, loss: Loss, input_grads: bool) -> corr.StepResult:
        m64 = copy.deepcopy(self.model).double()
        try:
            return eager_step(m64, args, loss, self.train, contextlib.nullcontext, input_grads)
        finally:
            del m64


def checked_step(step: Step, mode, ref: ReferenceRunner, events: EventLog) -> tuple[Step, str]:
    """(the step the checks run, a note for their details): the timed step, or where eager's
    step draws random numbers and the mode draws its own (Mode.check_twin: compile's inductor),
    its twin's, which draws them as the reference does. Compared as it is, a live dropout's
    masks differ and even a right compiler fails (HF BERT, GPT-2: 0.4-1.0 relative error)."""
    twin = mode.check_twin()
    if twin is None or not (drawn := ref.random_ops()):
        return step, ""
    events.add("info", "fusebench", f"the model draws random numbers ({describe(drawn)}): the "
                                    f"correctness checks ran a twin, {twin.why}")
    return dataclasses.replace(step, fn=twin.fn, scope=twin.scope), "(through a twin)"


def record_correctness(checks: list[corr.Check], events: EventLog,
                       extra: dict) -> tuple[Correctness | None, str]:
    """(Correctness, status) of the checks; the reference and tolerances go to `extra`."""
    if not checks:
        return None, "ok"
    passed = all(c.passed for c in checks)
    if any(c.weak for c in checks):
        events.add("weak_check", "fusebench", "correctness check is weak in this dtype: "
                   "eager itself is far from the float64 reference")
    extra["correctness_reference"] = [
        {"at": c.at, "reference": c.reference, "tol_out": c.tol_out, "tol_grad": c.tol_grad,
         "input_grads": c.input_grads} for c in checks]
    correctness = Correctness(
        passed=passed,
        max_rel_err_out=corr.finite_or_none(max(c.err_out for c in checks)),
        max_rel_err_grad=corr.finite_or_none(max((c.err_grad for c in checks
                                                  if c.err_grad is not None), default=None)),
        checked_at=tuple(c.at for c in checks),
        detail="; ".join(c.detail for c in checks))
    return correctness, ("ok" if passed else "mismatch")
