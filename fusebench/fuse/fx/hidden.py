"""Candidates a hook hides. A custom module with a hook stays one call in its parent's graph
(inlining it would skip the hook), so a pattern that spans it (ConvNeXt V2's GRN module between
fc1 and fc2, timm's GELU class inside an MLP) never saw its ops: the candidate was not fused
and nothing said so. The parent is traced once more with those modules traced into (a shadow
graph, only scanned: never rewritten, installed or run); a pattern that matches there across a
hooked module's boundary becomes a candidate not fused, "a hook on <path>", as a hooked
torch.nn layer inside a match already is. A match wholly inside one hooked module is that
module's own graph's business (it is traced on its own and fused there; its hooks still run)."""
from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx
import torch.nn as nn

from fusebench.fuse.fx.nodes import hooked
from fusebench.fuse.fx.pattern import Hit, Miss, Scope

SHADOW = "fusebench_unhooked"       # on the traced gm: (shadow GraphModule, hooked paths)


def attach(gm: fx.GraphModule, m: nn.Module, trace: Callable, std_leaf: Callable) -> None:
    """Trace m again through the hooked custom modules its graph calls, if any (trace is
    graph_roots' own, taking the ids of the modules to trace into)."""
    paths = {}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            sub = m.get_submodule(n.target)
            if sub is not m and hooked(sub) and not std_leaf(sub):
                paths[n.target] = id(sub)
    if not paths:
        return
    shadow = trace(m, frozenset(paths.values()))
    if isinstance(shadow, list):            # a module that fails to trace into: nothing to say
        setattr(gm, SHADOW, (shadow[0], tuple(paths)))


def misses(gm: fx.GraphModule, scope: Scope, patterns: list) -> list[tuple[Miss, str]]:
    """(Miss, hooked module's path in scope.m) for each pattern that matches across a hook;
    the reason names the module's class, so that hooks on every block's GRN are one note."""
    shadow, paths = getattr(gm, SHADOW, (None, ()))
    if shadow is None:
        return []
    scope = Scope(shadow, scope.ctx, scope.path, scope.m)
    ordered = sorted(patterns, key=lambda p: p.sweep)       # stable: the pass's order per sweep
    out = []
    for node in list(shadow.graph.nodes):
        for p in ordered:
            res = p.scan(node, scope)
            if isinstance(res, Hit):
                across = _across(res, paths)
                if across:
                    kinds = sorted({type(scope.m.get_submodule(a)).__name__ for a in across})
                    reason = f"a hook on its {' and '.join(kinds)} module"
                    out.append((Miss(res.pattern, reason), across[0]))
            if res is not None:
                break
    return out


def _across(hit: Hit, paths: tuple[str, ...]) -> list[str]:
    """The hooked paths hit's ops are in, when they are not all in one of them."""
    owners = []
    for n in (hit.out, *hit.nodes):
        if isinstance(n, fx.Node) and n.op.startswith("call_"):
            owners.append(_owner(n, paths))
    found = sorted({o for o in owners if o is not None})
    return found if found and (None in owners or len(found) > 1) else []


def _owner(n: fx.Node, paths: tuple[str, ...]) -> str | None:
    """The hooked module whose forward node n ran in (fx's nn_module_stack), or None."""
    for path, _ in (n.meta.get("nn_module_stack") or {}).values():
        if path in paths:
            return path
    return None
