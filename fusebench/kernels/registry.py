"""Kernel implementations by family: @register_impl("ln2d", "permute").

A leaf: it imports no family. The families register themselves when imported, which
fusebench.kernels (the package's __init__) does."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fusebench.errors import first_line, unknown_name
from fusebench.loading import is_file_ref, load_ref
from fusebench.registry import Registry


def _always(device: str = "cpu") -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class KernelImpl:
    family: str
    name: str
    fn: Callable                                   # family signature, e.g. ln2d: fn(x, w, b, eps)
    available: Callable[..., tuple[bool, str]] = _always   # (device) -> (ok, reason)
    description: str = ""
    dtypes: tuple[str, ...] | None = None   # the input dtypes it takes; None: any

    def takes(self, dtype: str) -> tuple[bool, str]:
        """(ok, reason): a dtype outside `dtypes` makes the cell `unavailable`, not `error`."""
        if self.dtypes is None or dtype in self.dtypes:
            return True, ""
        return False, f"{self.family} '{self.name}' takes {', '.join(self.dtypes)}, not {dtype}"


_FAMILIES: dict[str, Registry[KernelImpl]] = {}


def register_impl(family: str, name: str, *, available=None, description: str = "",
                  dtypes: tuple[str, ...] | None = None):
    """Decorator: registers fn as implementation `name` of kernel `family`."""
    def deco(fn):
        add_impl(KernelImpl(family, name, fn, available or _always,
                            description or first_line(fn.__doc__, None), dtypes))
        return fn
    return deco


def add_impl(impl: KernelImpl) -> None:
    _FAMILIES.setdefault(impl.family, Registry(f"{impl.family} impl")).add(impl.name, impl)


def discard_impl(family_name: str, name: str) -> None:
    """Remove one impl (a family left empty goes too): the CLI's plugin stand-ins."""
    reg = _FAMILIES.get(family_name)
    if reg is not None:
        reg.discard(name)
        if not reg.names():
            del _FAMILIES[family_name]


def families() -> list[str]:
    return sorted(_FAMILIES)


def family(name: str) -> Registry[KernelImpl]:
    if name not in _FAMILIES:
        raise unknown_name("kernel family", [name], _FAMILIES)
    return _FAMILIES[name]


def get_impl(family_name: str, name: str) -> KernelImpl:
    return family(family_name)[name]


def list_impls(family_name: str, pattern: str = "*") -> list[str]:
    return family(family_name).names(pattern)


def is_user_impl(name: str) -> bool:
    """An impl given as 'path/to/file.py:fn' rather than a registered name."""
    return is_file_ref(name)


def load_user_impl(ref: str) -> Callable:
    """'path/to/file.py:fn' -> fn: the planner checks it, the cell runs it, the same way."""
    return load_ref(ref, "user impl", "function")
