"""The model walk: apply fusions, in a given order, to a model's submodules, and count what no
fusion covered."""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import torch.nn as nn

from fusebench.fuse.fx import graph_pass
from fusebench.fuse.rule import FUSIONS, FuseContext, FusedModule, Fusion, computes_as


@dataclass
class FuseResult:
    model: nn.Module
    sites: Counter                   # fusion name -> modules rewritten
    unfused: Counter                 # leaf module type -> count, outside every fused module
    notes: list[tuple[str, str]]


@dataclass(frozen=True)
class GraphPass:
    """A place in the fusion order where the fx graph patterns `names` run (fusebench.fuse.fx)."""
    names: tuple[str, ...]


def fuse_in_order(model: nn.Module, order: list, bench: str = "train", device: str = "cpu",
                  impls: dict[str, str] | None = None, opt_in=()) -> FuseResult:
    """Apply the fusions named in `order` (those for `bench`), in that order; a GraphPass item
    runs the graph patterns there. Train: submodules are swapped in place (same Parameters, same
    names; the root is never replaced; a graph site changes a module's forward only). Infer: a
    fused deep copy. A module a fusion replaced or a graph site absorbed is not visited again.
    `opt_in`: fusions that are off unless asked for (fuse.OPT_IN)."""
    if bench == "infer":
        model = copy.deepcopy(model)
    ctx = FuseContext(bench, str(device), impls=dict(impls or {}), opt_in=frozenset(opt_in))
    sites: Counter = Counter()
    for item in order:
        if isinstance(item, GraphPass):
            sites.update(graph_pass(model, ctx, list(item.names)))
            continue
        fusion = FUSIONS[item]
        if bench not in fusion.benches:
            continue
        root = (fusion.rewrite(model, ctx) if bench == "infer" and type(model) in fusion.matches
                else None)      # the root is replaced only on the inference copy
        if root is not None:
            model, sites[fusion.name] = root.train(model.training), sites[fusion.name] + 1
        sites[fusion.name] += _apply(model, fusion, ctx)
    return FuseResult(model, +sites, unfused_leaves(model, ctx.covered), ctx.notes)


def _apply(mod: nn.Module, fusion: Fusion, ctx: FuseContext) -> int:
    """Rewrite matching children of `mod` (recursively, outside fused modules); returns how
    many were replaced. The exact type, or a torch.nn layer's subclass that keeps its forward
    (rule.computes_as): any other subclass may change forward."""
    n = 0
    for name, child in list(mod.named_children()):
        if isinstance(child, FusedModule) or id(child) in ctx.covered:
            continue
        new = fusion.rewrite(child, ctx) \
            if any(computes_as(child, t) for t in fusion.matches) else None
        if new is not None:
            new.train(child.training)
            setattr(mod, name, new)
            n += 1
        else:
            n += _apply(child, fusion, ctx)
    return n


def unfused_leaves(model: nn.Module, covered: set[int] = frozenset()) -> Counter:
    """Leaf module types outside every fused module and not absorbed by a graph site, less
    those that compute nothing in this step: nn.Identity, and a dropout or stochastic depth
    with probability 0 or in eval (it returns its input), which timm and HF models keep by the
    dozen."""
    out: Counter = Counter()

    def walk(mod: nn.Module):
        if isinstance(mod, FusedModule) or id(mod) in covered:
            return
        children = list(mod.children())
        if not children and mod is not model and not _computes_nothing(mod):
            out[type(mod).__name__] += 1
        for c in children:
            walk(c)
    walk(model)
    return out


# stochastic depth, by the class names its libraries give it and where each keeps the drop
# probability: timm's DropPath (and our zoo's), torchvision's StochasticDepth. At probability 0,
# or in eval, each returns its input.
STOCHASTIC_DEPTH = {"DropPath": "drop_prob", "StochasticDepth": "p"}


def _computes_nothing(mod: nn.Module) -> bool:
    if type(mod) is nn.Identity:
        return True
    if isinstance(mod, nn.modules.dropout._DropoutNd):
        p = mod.p
    else:
        p = getattr(mod, STOCHASTIC_DEPTH.get(type(mod).__name__, ""), None)
        if isinstance(p, bool) or not isinstance(p, (int, float)):
            return False
    return p == 0 or not mod.training
