"""What a graph pattern is: `scan(node, ctx)` looks at one fx node (the pattern's last op) and
returns a Hit (replace that node by one call), a Miss (a candidate that does not fuse, and why)
or None (not this pattern). Registered by name, tried in fusebench.fuse.fx.PATTERN_ORDER."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from fusebench.errors import UsageError, first_line
from fusebench.registry import Registry


class Site:
    """A fused call as fx prints it: a named callable (fx's codegen needs a __name__)."""

    def __init__(self, name: str, fn: Callable):
        self.__name__ = self.__qualname__ = name
        self.__module__ = __name__
        self._fn = fn

    def __call__(self, *args):
        return self._fn(*args)


@dataclass
class Hit:
    pattern: str
    out: fx.Node                          # the node whose uses the fused call takes over
    fn: Callable | None                   # a Site; None: `mutate` does it all (module swaps)
    args: tuple = ()                      # fx Nodes, attribute paths (Attr) or constants
    nodes: tuple = ()                     # nodes the match absorbs (erased when unused)
    mutate: Callable[[], None] | None = None
    also: tuple[str, ...] = ()            # other patterns this site includes (counted too)


@dataclass(frozen=True)
class Attr:
    """An argument read from the module at call time (`self.<path>`), never copied."""
    path: str


@dataclass(frozen=True)
class Miss:
    pattern: str
    reason: str


@dataclass(frozen=True)
class GraphPattern:
    name: str
    scan: Callable[[fx.Node, object], Hit | Miss | None]
    benches: tuple[str, ...]
    description: str = ""
    before: str | None = None             # a plugin's pattern: tried before this one
    sweep: int = 0                        # 1: tried in a second sweep, on what sweep 0 left


@dataclass
class Scope:
    """One traced module during the pass: its graph, the FuseContext, its path for messages."""
    gm: fx.GraphModule
    ctx: object
    path: str
    m: object = None                      # the traced module itself (its tree, not gm's)


PATTERNS: Registry[GraphPattern] = Registry("graph pattern")


def register_pattern(name: str, benches=("train",), description: str = "",
                     before: str | None = None, sweep: int = 0):
    """Decorator: `scan(node, scope) -> Hit | Miss | None` becomes graph pattern `name`. A
    pattern outside fuse.GRAPH_ORDER (a plugin's) is tried after the built-in ones, or just
    before the pattern named `before` (at a node both would match, the first one wins).
    Patterns are tried node by node, so a pattern that must see only what every other one
    left (a single conv another site may absorb at a later node) takes `sweep=1`: a second
    walk over the graph after the first."""
    if before is not None and before not in PATTERNS:
        raise UsageError(f"graph pattern {name!r}: before={before!r} is not a graph pattern "
                         f"(known: {', '.join(PATTERNS.names())})")

    def deco(fn):
        PATTERNS.add(name, GraphPattern(name, fn, tuple(benches),
                                        description or first_line(fn.__doc__, None), before,
                                        sweep))
        return fn
    return deco
