"""Recompute instead of save, across fused modules: a fused producer whose output its consumer
would save (bn_act's output feeding a depthwise conv) tags that output with a Recompute, the
recipe that rebuilds it from tensors the producer saves anyway (the BN input, the (C,)
statistics). A consumer that honours recipes saves those tensors instead of its input (the
same storages: no new activation bytes) and rebuilds its input in backward, one elementwise
pass. The tag is a Python attribute on the output tensor, checked against the tensor's version
counter: an output modified in place after tagging is saved as usual."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

ATTR = "_fusebench_recompute"
PRODUCERS = frozenset({"bn_act", "bn_silu", "bn_train", "bn_add_act"})   # tagged outputs
ALL = "*"
_state: dict[str, frozenset] = {"off": frozenset()}   # consumers that save their input instead


@contextlib.contextmanager
def disabled(consumers: tuple[str, ...] = (ALL,)):
    """Inside, the named consumers ("se_gate", "dwconv") save their inputs as usual; with the
    default, producers tag nothing at all. The A/B baselines of benchmarks/mbconv_recompute.py."""
    old = _state["off"]
    _state["off"] = old | frozenset(consumers)
    try:
        yield
    finally:
        _state["off"] = old


@dataclass(frozen=True)
class Saving:
    """fn(*args) with every producer's tag off, so consumers save their inputs: fused mode's
    `fused_recompute=False`. The choice is made in forward (tag, recipe_of), so wrapping the
    call covers its backward too. Saving was 5-9% faster per EfficientNet step than the
    rebuilds, at 0.63-0.64x eager's activation bytes instead of 0.35-0.37x (docs/fused.md,
    fourteenth session)."""
    fn: Callable

    def __call__(self, *args, **kwargs):
        with disabled():
            return self.fn(*args, **kwargs)


@dataclass(frozen=True, eq=False)
class Recompute:
    """rebuild(*tensors) gives the tagged tensor's values; tensors are detached (they share
    storage and version counter with what the producer saved)."""
    name: str
    tensors: tuple[torch.Tensor, ...]
    rebuild: Callable[..., torch.Tensor]
    version: int

    def __call__(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.rebuild(*tensors)


def tag(y: torch.Tensor, name: str, tensors, rebuild: Callable) -> torch.Tensor:
    """Attach the recipe to y (only where autograd will need it); returns y."""
    if ALL not in _state["off"] and y.requires_grad and torch.is_grad_enabled():
        setattr(y, ATTR, Recompute(name, tuple(t.detach() for t in tensors), rebuild,
                                   y._version))
    return y


def recipe_of(x: torch.Tensor, consumer: str) -> Recompute | None:
    """x's recipe, or None (untagged, changed in place since it was tagged, or `consumer`
    told to save its input: `disabled`)."""
    if consumer in _state["off"]:
        return None
    r = getattr(x, ATTR, None)       # (inside an autograd.Function's forward grad is off)
    return r if r is not None and r.version == x._version else None


def saved(x: torch.Tensor, consumer: str):
    """What `consumer` saves for x: its recipe where it has one, else x."""
    r = recipe_of(x, consumer)
    return x if r is None else r
