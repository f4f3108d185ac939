"""The mode registry: a leaf the mode files register into (modes/__init__.py imports the mode
files, so they must not import it back)."""
from __future__ import annotations

from fusebench.modes.base import Mode
from fusebench.registry import Registry

MODES: Registry[Mode] = Registry("mode")


def register_mode(cls):
    """Class decorator: registers one instance under cls.name."""
    MODES.add(cls.name, cls())
    return cls
