"""A small string-keyed registry shared by models, modes and kernel implementations."""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Generic, TypeVar

from fusebench.errors import UsageError, unknown_name

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.what} '{name}' registered twice")
        self._items[name] = item
        return item

    def discard(self, name: str) -> None:
        """Remove `name` if present (the CLI's stand-ins for plugin entries, run/probe.py)."""
        self._items.pop(name, None)

    def names(self, pattern: str = "*") -> list[str]:
        return sorted(n for n in self._items if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __getitem__(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise unknown_name(self.what, [name], self._items) from None

    def resolve(self, names: Iterable[str]) -> list[T]:
        """Look up many names; every unknown one is reported in a single UsageError."""
        names = list(names)
        missing = [n for n in names if n not in self._items]
        if missing:
            raise unknown_name(self.what, missing, self._items)
        return [self._items[n] for n in names]

    def items(self):
        return sorted(self._items.items())


def parse_list(text: str, what: str) -> list[str]:
    """'a, b,c' -> ['a','b','c']; an empty element is a usage error, not silently dropped."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(p == "" for p in parts):
        raise UsageError(f"malformed {what} list '{text}': expected comma-separated names")
    return parts


def parse_int_list(text: str, what: str, *, minimum: int = 1, maximum: int = 1 << 20) -> list[int]:
    out = []
    for p in parse_list(text, what):
        try:
            v = int(p)
        except ValueError:
            raise UsageError(f"malformed {what} '{text}': '{p}' is not an integer") from None
        if v < minimum:
            raise UsageError(f"{what} must be >= {minimum}, got {v}")
        if v > maximum:
            raise UsageError(f"{what} must be <= {maximum}, got {v}")
        out.append(v)
    return out
