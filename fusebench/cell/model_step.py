"""One train or infer step of a model cell, and the loss it trains on.

Loss rule (any model, not only classifiers), on the first tensor of the output:
  (B, K)       cross-entropy against random class targets (image classifiers);
  (B, T, V)    cross-entropy over the last dim against random (B, T) targets in [0, V)
               (language-model logits, e.g. a GPT);
  anything else  the mean of squares (still exercises the whole backward).
Targets are fixed per cell (seeded), so a mode and its reference train on the same loss."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from fusebench.measure import correctness as corr

CHECK_SEED = 12345   # dropout masks of the checked steps: the same for a mode and its reference


def first_tensor(out) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for o in out:
            if isinstance(o, torch.Tensor):
                return o
            with contextlib.suppress(TypeError):
                return first_tensor(o)
    raise TypeError(f"model output has no tensor (got {type(out).__name__})")


@dataclass
class Loss:
    """The training loss of a cell (rule in the module docstring)."""
    batch: int
    target: torch.Tensor        # (B,) ints in [0, 1000): class targets, taken modulo K
    seed: int
    _seq: dict = field(default_factory=dict, repr=False)   # (B, T, V) -> (B, T) targets

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        if out.dim() == 2 and out.shape[0] == self.target.shape[0]:
            return nn.functional.cross_entropy(out.float(), self.target % out.shape[1])
        if out.dim() == 3 and out.shape[0] == self.batch:
            target = self._sequence_target(out)
            return nn.functional.cross_entropy(out.float().flatten(0, 1), target.flatten())
        return out.float().pow(2).mean()

    def _sequence_target(self, out: torch.Tensor) -> torch.Tensor:
        key = (tuple(out.shape), out.device)
        if key not in self._seq:   # drawn once, outside the timed steps (first call)
            gen = torch.Generator().manual_seed(self.seed)
            self._seq[key] = torch.randint(0, out.shape[2], out.shape[:2],
                                           generator=gen).to(out.device)
        return self._seq[key]

    def sub(self, n: int) -> "Loss":
        """The same loss on the first n samples (sequence targets are drawn per shape)."""
        return Loss(n, self.target[:n], self.seed)


@dataclass
class Step:
    """Callable train/infer step over a prepared callable; keeps the last output."""
    fn: Callable
    model: nn.Module
    inputs: tuple                 # positional args of fn
    loss: Loss
    train: bool
    autocast: Callable
    opt: torch.optim.Optimizer | None = None
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # Twin.scope

    def run(self, update: bool = True, seed: int | None = None,
            input_grads: bool = False) -> corr.StepResult:
        """One step. `input_grads` (train, checked steps only): the float inputs require grad
        and their gradients are kept too, so a wrong gradient on the way from the input to the
        first parameter (ops under no_grad, a parameter-free stem) shows."""
        with self.scope():
            return self._run(update, seed, input_grads)

    def _run(self, update: bool, seed: int | None, input_grads: bool) -> corr.StepResult:
        if seed is not None:   # same dropout masks for the mode and its reference
            torch.manual_seed(seed)
        if not self.train:
            with torch.inference_mode(), self.autocast():
                out = first_tensor(self.fn(*self.inputs))
            return corr.StepResult(out, None)
        self.model.zero_grad(set_to_none=True)
        leaves = _requiring_grad(self.inputs) if input_grads else {}
        # each leaf passed as a copy: a forward that scales its input in place (`x /= 255`)
        # may, as it may on the step's own inputs; autograd does not allow it on a leaf
        args = tuple(leaves[i].clone() if i in leaves else a for i, a in enumerate(self.inputs))
        with self.autocast():
            out = first_tensor(self.fn(*args))
            loss = self.loss(out)
        loss.backward()
        grads = {n: p.grad for n, p in self.model.named_parameters() if p.requires_grad}
        inputs = {f"input {i}": a.grad for i, a in leaves.items()} if input_grads else None
        result = corr.StepResult(out.detach(), grads, inputs)
        if update:
            self.opt.step()
        return result

    def __call__(self):      # a timed step: the prepared callable's, never in a twin's scope
        self._run(True, None, False)


def _requiring_grad(args: tuple) -> dict[int, torch.Tensor]:
    """{position: a leaf copy that requires grad} of each float tensor in args."""
    return {i: a.detach().clone().requires_grad_() for i, a in enumerate(args)
            if torch.is_tensor(a) and a.is_floating_point()}


def eager_step(model: nn.Module, inputs: tuple, loss: Loss, train: bool,
               autocast, input_grads: bool = False) -> corr.StepResult:
    """One checked step of plain eager `model` (no update)."""
    return Step(model, model, inputs, loss, train, autocast).run(
        update=False, seed=CHECK_SEED, input_grads=input_grads)
