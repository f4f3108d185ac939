"""One module per CLI command; each exposes register(app) and wraps its function in @guarded."""
from __future__ import annotations

import functools
import sys

import typer

from fusebench.errors import UsageError


def usage_exit(err: Exception) -> typer.Exit:
    """Print the one-line usage error and return the Exit(2) to raise."""
    print(f"fusebench: error: {err}", file=sys.stderr)
    return typer.Exit(2)


def guarded(fn):
    """Bad input anywhere below a command becomes one line on stderr and exit code 2."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UsageError as e:
            raise usage_exit(e) from None
    return wrapper
