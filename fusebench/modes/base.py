"""What every execution mode provides. One small class per mode, one file each."""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from fusebench.measure.events import EventLog
from fusebench.modes.options import ModeOption


@dataclass(frozen=True)
class Twin:
    """What the correctness check runs in place of a mode's prepared callable when the model
    draws random numbers and the mode draws its own (Mode.check_twin): `fn` computes what the
    prepared callable does with aten's random numbers, `scope()` is entered around each whole
    step of it (forward and backward: a compiler may build the backward lazily), and `why` says
    for the record what differs from the timed plan."""
    fn: Callable
    scope: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    why: str = ""


class Mode:
    name: str = ""
    description: str = ""
    # the options this mode reads from CellSpec.mode_options (e.g. ts_fuser): the one
    # declaration the CLI flags, their checking and the records are generated from
    options: tuple[ModeOption, ...] = ()
    # data-parallel wrappers (ddp, fsdp1, fsdp2) this mode cannot run under -> why not; the
    # coordinator turns such a cell into an `unavailable` record without launching it
    dist_unsupported: dict[str, str] = {}
    # device types the mode can run on (empty: any). `-m all` leaves a mode out on other
    # devices (and says so); naming it still gives an `unavailable` record with the reason
    device_types: tuple[str, ...] = ()
    # whether the prepared callable runs the same plan when an input requires grad: then the
    # steady check (after timing) also compares the inputs' gradients. False where the mode
    # specialises on requires_grad (dynamo's guards, TorchScript's profiles): asking would
    # recompile, and the check would test another plan than the one timed.
    same_plan_with_input_grads: bool = False

    @property
    def option_defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}

    def runs_on(self, device: str) -> bool:
        return not self.device_types or device.split(":")[0] in self.device_types

    def available(self, options: dict[str, Any], device: str = "cpu") -> tuple[bool, str]:
        """(True, "") or (False, reason). Must be cheap and must not change global state."""
        return True, ""

    def prepare(self, model: nn.Module, example_inputs: tuple, options: dict[str, Any],
                events: EventLog) -> Callable:
        """Return the callable to run (same call signature as model). May record events."""
        raise NotImplementedError

    def check_twin(self) -> Twin | None:
        """After prepare: for checking a model whose step draws random numbers (a live
        dropout), a Twin that draws them from aten's generator in eager's order, as the float64
        reference does; None where the prepared callable already does (modes that run aten's
        ops). Cheap: nothing may compile before the twin is first called."""
        return None

    def finish(self, events: EventLog) -> None:
        """Called after the timed steps: record counters (graph breaks, recompiles, fusion
        groups, ...) that are only known after running."""

    def opts(self, options: dict[str, Any]) -> dict[str, Any]:
        defaults = self.option_defaults
        return {**defaults, **{k: v for k, v in options.items()
                               if k in defaults and v is not None}}

    def supports_dist(self, strategy: str) -> tuple[bool, str]:
        reason = self.dist_unsupported.get(strategy)
        return (False, f"{self.name} under {strategy}: {reason}") if reason else (True, "")


def device_of(model: nn.Module, example_inputs) -> str:
    """The device a model runs on ('cpu', 'cuda:0'): its first parameter's, else its first
    tensor input's, else cpu."""
    import torch
    for t in [*model.parameters(), *(x for x in example_inputs if torch.is_tensor(x))]:
        return str(t.device)
    return "cpu"
