"""One module per CLI command; each exposes register(app) and wraps its function in @guarded.
Option choices come from the registries and tables (`choices`), never re-listed by hand."""
from __future__ import annotations

import functools
import sys
from collections.abc import Iterable
from enum import Enum

import typer
from typer.core import TyperCommand, TyperGroup

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


def choices(name: str, keys: Iterable[str]) -> type[Enum]:
    """A str Enum of a registry's or table's keys: typer takes an option's choices as an Enum."""
    return Enum(name, [(k, k) for k in keys], type=str)


def _flags_take_no_value(params) -> None:
    # typer 0.29's rich help shows every bool flag with a `<bool>` type, as if it took a value;
    # an empty metavar leaves the type column blank
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""


class Command(TyperCommand):
    def get_params(self, ctx):
        params = super().get_params(ctx)
        _flags_take_no_value(params)
        return params


class Group(TyperGroup):
    def get_params(self, ctx):
        params = super().get_params(ctx)
        _flags_take_no_value(params)
        return params


def add_command(app: typer.Typer, name: str, fn) -> None:
    app.command(name, cls=Command)(fn)
