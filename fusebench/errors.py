"""Errors that carry a meaning for the CLI: a UsageError becomes one line and exit code 2."""
from __future__ import annotations

import difflib
from collections.abc import Iterable


def first_line(text: object, limit: int | None = 300) -> str:
    """The first non-empty-stripped line of `text` (a message, an exception, a docstring),
    cut to `limit` characters (None: uncut)."""
    lines = str(text or "").strip().splitlines()
    return (lines[0] if lines else "")[:limit]


def describe(e: BaseException, limit: int | None = None) -> str:
    """'Type: first line of the message', or just 'Type' for an empty message."""
    line = first_line(e, limit)
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


class UsageError(ValueError):
    """Bad input from the user: reported as one clear line, exit code 2, nothing written."""


def unknown_name(what: str, names: Iterable[str], valid: Iterable[str]) -> UsageError:
    """One error for all unknown names at once, with close matches and the valid choices."""
    valid = sorted(valid)
    parts = []
    for name in names:
        close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        parts.append(f"'{name}'{hint}")
    shown = ", ".join(valid) if len(valid) <= 30 else ", ".join(valid[:30]) + ", ..."
    return UsageError(f"unknown {what} {'; '.join(parts)}; valid: {shown}")
