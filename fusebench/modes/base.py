"""What every execution mode provides. One small class per mode, one file each."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn

from fusebench.measure.events import EventLog


class Mode:
    name: str = ""
    description: str = ""
    # option names this mode reads from CellSpec.mode_options (e.g. "ts_fuser"), with defaults
    option_defaults: dict[str, Any] = {}

    def available(self, options: dict[str, Any], device: str = "cpu") -> tuple[bool, str]:
        """(True, "") or (False, reason). Must be cheap and must not change global state."""
        return True, ""

    def prepare(self, model: nn.Module, example_inputs: tuple, options: dict[str, Any],
                events: EventLog) -> Callable:
        """Return the callable to run (same call signature as model). May record events."""
        raise NotImplementedError

    def finish(self, events: EventLog) -> None:
        """Called after the timed steps: record counters (graph breaks, recompiles, fusion
        groups, ...) that are only known after running."""

    def opts(self, options: dict[str, Any]) -> dict[str, Any]:
        return {**self.option_defaults, **{k: v for k, v in options.items()
                                           if k in self.option_defaults and v is not None}}
