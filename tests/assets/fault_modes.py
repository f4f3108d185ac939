"""Test-only modes loaded into workers through FUSEBENCH_PLUGINS: each plants one fault."""
import os
import time

import torch

from fusebench.modes import register_mode
from fusebench.modes.base import Mode


@register_mode
class CrashMode(Mode):
    name = "test_crash"

    def prepare(self, model, example_inputs, options, events):
        os.abort()                              # SIGABRT, as a compiler segfault would


@register_mode
class HangMode(Mode):
    name = "test_hang"

    def prepare(self, model, example_inputs, options, events):
        time.sleep(3600)


@register_mode
class CorruptAfterTwo(Mode):
    """Right on calls 1 and 2, then scales one gradient by 1.5: the JIT-fuser failure shape."""
    name = "test_corrupt_after_2"

    def prepare(self, model, example_inputs, options, events):
        calls = {"n": 0}
        first = next(p for p in model.parameters() if p.requires_grad)

        def fn(x):
            calls["n"] += 1
            out = model(x)
            if calls["n"] > 2 and out.requires_grad:
                first.register_hook(lambda g: g * 1.5) if calls["n"] == 3 else None
            return out
        return fn


@register_mode
class WrongAtItsFirstWeights(Mode):
    """Scales the gradient into the model while its first Parameter holds the values it was
    prepared with, whatever the inputs: a miss at one point of the weights, which a token
    model's check (no batch to perturb) repeats at moved weights."""
    name = "test_wrong_at_first_weights"

    def prepare(self, model, example_inputs, options, events):
        first = next(p for p in model.parameters() if p.requires_grad)
        seen = first.detach().clone()

        def fn(*args):
            out = model(*args)
            if out.requires_grad and torch.equal(first, seen):
                out.register_hook(lambda g: g * 1.5)
            return out
        return fn


@register_mode
class OomAboveTwo(Mode):
    """Raises an out-of-memory error for batches above 2 (exercises the OOM retry)."""
    name = "test_oom"

    def prepare(self, model, example_inputs, options, events):
        if example_inputs[0].shape[0] > 2:
            raise MemoryError("out of memory (planted)")
        return model


@register_mode
class Unavailable(Mode):
    name = "test_unavailable"

    def available(self, options, device="cpu"):
        return False, "planted: this mode never runs"


@register_mode
class WrongOnItsFirstBatch(Mode):
    """Scales the gradient into the model on the batch it was prepared with and on no other:
    an input-specific miss, the shape of float32 rounding across an activation's kink."""
    name = "test_wrong_on_one_batch"

    def prepare(self, model, example_inputs, options, events):
        seen = example_inputs[0].clone()

        def fn(x):
            out = model(x)
            if out.requires_grad and torch.equal(x, seen):
                out.register_hook(lambda g: g * 1.5)
            return out
        return fn


class _DoubleGrad(torch.autograd.Function):
    """Identity forward, gradient times 2 in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return 2 * g


@register_mode
class WrongInputGrad(Mode):
    """Doubles the gradient that reaches the model's input and nothing else: every parameter
    gradient is right, as with ops run under no_grad at trace time only (session 31's bug).
    Runs the same plan whether the input requires grad, so the steady check asks for it."""
    name = "test_wrong_input_grad"
    same_plan_with_input_grads = True

    def prepare(self, model, example_inputs, options, events):
        def fn(x):
            return model(_DoubleGrad.apply(x))
        return fn


@register_mode
class WrongInputGradUnasked(WrongInputGrad):
    """The same fault in a mode that says it specialises on requires_grad: never asked."""
    name = "test_wrong_input_grad_unasked"
    same_plan_with_input_grads = False
