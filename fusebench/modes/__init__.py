"""Execution modes, keyed by name: MODES["compile"]. Adding a mode: one file here (a Mode
subclass declaring its options and dist support) plus its name in _load_all."""
from __future__ import annotations

from fusebench.modes.base import Mode
from fusebench.modes.registry import MODES, register_mode


def _load_all() -> None:
    # one file per mode; importing registers it
    from fusebench.modes import aot, compile, cudagraphs, eager, fused, torchscript  # noqa: F401


def list_modes(pattern: str = "*") -> list[str]:
    _load_all()
    return MODES.names(pattern)


def get_mode(name: str) -> Mode:
    _load_all()
    return MODES[name]


__all__ = ["MODES", "Mode", "register_mode", "list_modes", "get_mode"]
