"""Checking mode option values before any cell runs: a bad value is a UsageError naming the
valid choices, never a silent default.

Each Mode class declares `option_choices: dict[str, tuple | Callable[[], tuple]]`; a callable is
evaluated only when that option is actually given (e.g. the list of registered dynamo backends,
which needs `import torch._dynamo`)."""
from __future__ import annotations

import difflib
from typing import Any

from fusebench.errors import UsageError
from fusebench.modes.base import Mode


def _choices(spec) -> tuple:
    return tuple(spec() if callable(spec) else spec)


def _same(value: Any, choice: Any) -> bool:
    # bools are ints in Python: 1 must not pass for True, nor "1" for anything
    return type(value) is type(choice) and value == choice


def check_option_values(mode: Mode, options: dict[str, Any]) -> None:
    """Raise one UsageError listing every option of `mode` whose value is not a valid choice.
    Options that belong to other modes are ignored; None means "use the default"."""
    problems = []
    for key, spec in getattr(mode, "option_choices", {}).items():
        value = options.get(key)
        if value is None:
            continue
        valid = _choices(spec)
        if any(_same(value, c) for c in valid):
            continue
        shown = ", ".join(repr(c) if not isinstance(c, str) else c for c in valid)
        close = difflib.get_close_matches(str(value), [str(c) for c in valid], n=3, cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        problems.append(f"{key}={value!r}{hint}; valid: {shown}")
    if problems:
        raise UsageError(f"invalid option for mode '{mode.name}': " + "; ".join(problems))
