"""The typer app. Each command lives in fusebench/commands/<name>.py as one small function;
this file only assembles them and turns UsageError into one line + exit code 2."""
from __future__ import annotations

import importlib
import sys

import typer

from fusebench.errors import UsageError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark PyTorch execution modes honestly: speed, memory, compile cost, "
                       "fallbacks and correctness.")

# Each module defines register(app). Order = order in --help.
COMMANDS = ("run", "kernel", "compare", "plot", "export", "env", "listing", "info")


def _register_all() -> None:
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"fusebench.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"fusebench.commands.{name}":
                continue  # command not built yet in this checkout
            raise
        mod.register(app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    try:
        app(args=argv, prog_name="fusebench", standalone_mode=True)
    except UsageError as e:
        print(f"fusebench: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
