"""Mode options, declared once per mode: the `run` command's flags, their --help, the checking
of their values and the cells' option records are all generated from these declarations.

A bad value is a UsageError naming the valid choices, never a silent default. `choices` may be
a callable, evaluated only when that option is actually given (e.g. the registered dynamo
backends, which need `import torch._dynamo`); `choices_help` then says in --help what it lists."""
from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fusebench.errors import UsageError

DIST_STRATEGIES = ("ddp", "fsdp1", "fsdp2")   # data-parallel wrappers a mode may not run under


@dataclass(frozen=True)
class ModeOption:
    name: str                                   # key in CellSpec.mode_options, e.g. "ts_fuser"
    type: type = str                            # str or bool
    choices: tuple | Callable[[], tuple] | None = None   # None: any str / True, False for bool
    default: Any = None                         # None: the library's own default
    help: str = ""
    choices_help: str = ""                      # --help text for callable choices

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def valid(self) -> tuple | None:
        """The accepted values, or None when any value of the type is accepted."""
        if self.type is bool:
            return (True, False)
        return None if self.choices is None else tuple(
            self.choices() if callable(self.choices) else self.choices)

    def shown_choices(self) -> str:
        """For --help: static choices listed, callable ones described (not evaluated)."""
        if callable(self.choices):
            return self.choices_help
        return ", ".join(str(c) for c in self.choices or ())

    def problem(self, value: Any) -> str | None:
        """None when `value` is acceptable, else one clause of the usage error."""
        valid = self.valid()
        if valid is None:
            ok = isinstance(value, self.type)
        else:
            ok = any(_same(value, c) for c in valid)
        if ok:
            return None
        shown = ", ".join(repr(c) if not isinstance(c, str) else c for c in valid or ())
        close = difflib.get_close_matches(str(value), [str(c) for c in valid or ()], n=3,
                                          cutoff=0.5)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        return f"{self.name}={value!r}{hint}; valid: {shown or self.type.__name__}"


def _same(value: Any, choice: Any) -> bool:
    # bools are ints in Python: 1 must not pass for True, nor "1" for anything
    return type(value) is type(choice) and value == choice


def check_values(declared: Iterable[ModeOption], options: dict[str, Any],
                 what: str = "invalid mode option") -> None:
    """Raise one UsageError listing every declared option whose given value is invalid.
    Undeclared keys are ignored (they belong to other modes); None means "use the default"."""
    problems = [p for o in declared if options.get(o.name) is not None
                for p in [o.problem(options[o.name])] if p]
    if problems:
        raise UsageError(f"{what}: " + "; ".join(problems))


def check_option_values(mode, options: dict[str, Any]) -> None:
    """check_values for one mode's declarations."""
    check_values(mode.options, options, f"invalid option for mode '{mode.name}'")


def all_options(modes: Iterable) -> dict[str, ModeOption]:
    """Every declared option by name, first declaration winning (a mode may reuse another
    mode's option, e.g. a test mode reading compile_backend)."""
    out: dict[str, ModeOption] = {}
    for mode in modes:
        for o in mode.options:
            out.setdefault(o.name, o)
    return out
