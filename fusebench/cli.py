"""The typer app. Each command lives in fusebench/commands/<name>.py as one small function;
this file only assembles them (loading each on first use) and turns UsageError into one line +
exit code 2."""
from __future__ import annotations

import functools
import importlib
import sys

import typer

from fusebench.commands import Group
from fusebench.errors import UsageError

# CLI name -> module in fusebench/commands (each defines register(app)). Order = order in --help.
COMMANDS = {"run": "run", "kernel": "kernel", "compare": "compare", "plot": "plot",
            "export": "export", "env": "env", "list": "listing", "info": "info"}


class LazyGroup(Group):
    """Imports a command's module only when that command is run or listed: each builds its
    option choices from registries that import torch, scipy or matplotlib."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        return _command(name) if name in COMMANDS else None


@functools.cache
def _command(name: str):
    one = typer.Typer()
    importlib.import_module(f"fusebench.commands.{COMMANDS[name]}").register(one)
    return typer.main.get_group(one).commands[name]


app = typer.Typer(cls=LazyGroup, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False)


@app.callback()
def _fusebench() -> None:
    """Benchmark PyTorch execution modes honestly: speed, memory, compile cost, fallbacks and
    correctness."""


# typer < 0.29 raises click's exceptions (click is then typer's own dependency); typer >= 0.29
# vendors click as typer._click and no longer installs it. We import neither directly: the
# usage-error class is found on typer.BadParameter's MRO, which is the right one either way.
_CLICK_USAGE = tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_ABORT = (typer.Abort,)   # click's Abort itself on typer < 0.29, typer's own class after
_EXIT = (typer.Exit,)


def _line(text: str) -> str:
    return " ".join(str(text).split())      # one line, whatever the message held


def main(argv: list[str] | None = None) -> int:
    # standalone_mode=False so click's usage errors come back to us and print as one line
    # (typer would otherwise draw a multi-line panel).
    try:
        rv = app(args=argv, prog_name="fusebench", standalone_mode=False)
    except UsageError as e:
        print(f"fusebench: error: {_line(e)}", file=sys.stderr)
        return 2
    except _CLICK_USAGE as e:
        print(f"fusebench: error: {_line(e.format_message())}", file=sys.stderr)
        return 2
    except _ABORT:
        print("fusebench: interrupted", file=sys.stderr)
        return 130
    except _EXIT as e:
        return e.exit_code
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
