"""The graph pass: match what user code computes, not the names of our classes.

  nodes.py    what an fx node computes, whatever the spelling (function, method, module)
  pattern.py  GraphPattern / Hit / Miss / Site and the PATTERNS registry
  trace.py    which modules get a graph (per submodule where tracing fails) and install()
  specialise.py  optional arguments a forward branches on: a graph per value, chosen per call
  modes.py    grad / autocast `with` blocks in a forward, kept in its graph
  stars.py    `*shape` spliced at run time, a forward's `**kwargs` passed on (traced empty)
  shims.py    torch calls that refuse a traced value (`torch.ones(T, T)`, `torch.finfo(x.dtype)`)
  leaves.py   functions and modules kept whole as one node (einops; a user's register_leaf)
  hidden.py   candidates a hooked custom module (a call in the graph) keeps from a pattern
  products.py a matrix product however written (@, matmul, bmm, an einsum that is one)
  causal.py   whether a mask node is the causal pattern (the attention site's is_causal)
  torch_modules.py  torch.nn's transformer modules, which fx keeps leaves: walked into, traced
  acts.py     the activation a node (or, via spelled.py, a written-out expression) computes
  residual.py a fused Function whose output also takes a residual add (the mlp site's)
  ln_linear_kernel.py  LayerNorm -> Linear saving x and the stats (the opt-in ln_linear)
  the patterns themselves: fusebench/fuse/fusions/fx_*.py; a plugin registers its own with
  `fusebench.fuse.fx.register_pattern` (tried after the built-in ones unless `before=`)

Why our own matcher rather than torch.fx's SubgraphMatcher / subgraph_rewriter: those compare a
pattern graph literally (the same op targets, the same constant arguments, the same argument
form), so every spelling x every argument form (`mean(1, keepdim=True)` vs `mean(dim=[1],
keepdim=True)`, `sqrt`+`div` vs `rsqrt`+`mul`, a module vs its functional form, any eps) would
need its own pattern graph, and a candidate that almost matches gives no reason why not. Here a
pattern is a short function over normalised node names that says what does not fit."""
from __future__ import annotations

from collections import Counter, defaultdict

import torch.fx as fx
import torch.nn as nn

from fusebench.fuse.fx import hidden
from fusebench.fuse.fx.leaves import register_leaf
from fusebench.fuse.fx.modes import REGION
from fusebench.fuse.fx.nodes import hooked, module, op
from fusebench.fuse.fx.pattern import PATTERNS, Attr, Hit, Miss, Scope, Site, register_pattern
from fusebench.fuse.fx.trace import graph_roots, install


def graph_pass(model: nn.Module, ctx, names: list[str]) -> Counter:
    """Run the graph patterns `names` (those for ctx.bench) over every traceable module; the
    sites per pattern. Candidates that did not fuse become `not_fused` notes, grouped by reason."""
    patterns = [p for p in PATTERNS.resolve(names) if ctx.bench in p.benches]
    if not patterns:
        return Counter()
    sites: Counter = Counter()
    misses: dict[tuple[str, str], list[str]] = defaultdict(list)
    roots = graph_roots(model, ctx.notes)
    changed: dict[int, nn.Module] = {}
    for path, m, gm in roots:
        # a module's other variants (fx/specialise.py) are fused alike but not counted twice
        counted = getattr(gm, "fusebench_variant", 0) == 0
        scope = Scope(gm, ctx, path, m)
        erased: set = set()
        inlined = _inlined_leaves(gm, m)
        for sweep in sorted({p.sweep for p in patterns}):
            tried = [p for p in patterns if p.sweep == sweep]
            if _sweep(scope, tried, erased, sites if counted else Counter(),
                      misses if counted else defaultdict(list)):
                changed[id(m)] = m
        if id(m) in changed:     # every op of theirs now inside a site: not left unfused
            ctx.covered.update(inlined.keys() - _inlined_leaves(gm, m).keys())
        for miss, where in hidden.misses(gm, scope, patterns) if counted else ():
            misses[(miss.pattern, miss.reason)].append(f"{path}.{where}" if path else where)
    for m in changed.values():
        gms = [gm for _, mm, gm in roots if mm is m]
        for gm in gms:
            gm.graph.lint()
        install(m, gms)
    for (pattern, reason), where in sorted(misses.items()):
        more = f" and {len(where) - 3} more" if len(where) > 3 else ""
        ctx.notes.append(("not_fused", f"{pattern}: {len(where)} candidate(s) not fused: "
                                       f"{reason} (at {', '.join(where[:3])}{more})"))
    return sites


def _inlined_leaves(gm: fx.GraphModule, root: nn.Module) -> dict[int, nn.Module]:
    """Childless modules the trace went into rather than keeping as a call (timm's GELU and
    HF's SiLUActivation classes, which call F.gelu / F.silu) that still have an op in gm's
    graph, by fx's record of the module each op ran in (the innermost of nn_module_stack)."""
    out = {}
    for n in gm.graph.nodes:
        stack = n.meta.get("nn_module_stack")
        if n.op not in ("call_function", "call_method") or not stack:
            continue
        try:
            m = root.get_submodule(next(reversed(stack.values()))[0])
        except AttributeError:
            continue
        if next(m.children(), None) is None:
            out[id(m)] = m
    return out


def _sweep(scope: Scope, patterns: list, erased: set, sites: Counter, misses: dict) -> bool:
    """One walk over scope's graph, each node tried against `patterns` in order (the first
    that answers takes it); True when the graph changed."""
    gm, changed = scope.gm, False
    for node in list(gm.graph.nodes):
        if node in erased:
            continue
        for p in patterns:
            res = p.scan(node, scope)
            if isinstance(res, Hit):
                res = _hooks(res, gm) or _regions(res) or res
            if isinstance(res, Miss):
                misses[(res.pattern, res.reason)].append(_where(scope.path, node))
            elif isinstance(res, Hit):
                changed |= _apply(gm, scope.m, res, erased, scope.ctx)
                sites.update((res.pattern, *res.also))
            if res is not None:
                break
    return changed


def _where(path: str, node: fx.Node) -> str:
    name = node.target if node.op == "call_module" else node.name
    return f"{path}.{name}" if path else str(name)


def _modules(hit: Hit, gm) -> list[tuple[str, nn.Module]]:
    return [(n.target, module(n)) for n in (hit.out, *hit.nodes)
            if isinstance(n, fx.Node) and n.op == "call_module"]


def _owners(hit: Hit, root: nn.Module) -> list[nn.Module]:
    """Leaf modules whose attributes a site reads: an inlined custom norm whose whole forward
    the site computes (its weight and bias are the site's arguments), or a module argument.
    Looked up on the traced module itself (gm holds placeholder containers, not the user's)."""
    out = []
    for a in hit.args:
        if isinstance(a, Attr):
            try:
                m = root.get_submodule(a.path)
            except AttributeError:
                m = root.get_submodule(a.path.rpartition(".")[0])
            if not list(m.children()):      # a childless root too: a norm traced on its own
                out.append(m)
    return out


def _hooks(hit: Hit, gm) -> Miss | None:
    bad = [name for name, m in _modules(hit, gm) if hooked(m)]
    return Miss(hit.pattern, f"a hook on {', '.join(bad)}") if bad else None


def _regions(hit: Hit) -> Miss | None:
    """A site is one call in one place: it cannot run part of its ops under a `with
    torch.no_grad()` / autocast block and part outside it (fx/modes.py)."""
    seen = {n.meta.get(REGION, ()) for n in (hit.out, *hit.nodes)
            if isinstance(n, fx.Node) and n.op.startswith("call_")}
    return Miss(hit.pattern, "its ops are on both sides of a `with` block that sets grad or "
                             "autocast mode") if len(seen) > 1 else None


def _apply(gm: fx.GraphModule, root: nn.Module, hit: Hit, erased: set, ctx) -> bool:
    """Replace hit.out by the fused call, erase the absorbed nodes left unused; True when the
    graph changed. The absorbed modules are marked covered (not leaves left unfused)."""
    ctx.covered.update(id(m) for _, m in _modules(hit, gm))
    ctx.covered.update(id(m) for m in _owners(hit, root))
    if hit.mutate is not None:
        hit.mutate()
    if hit.fn is None:
        return False
    g = gm.graph
    with g.inserting_before(hit.out):
        args = tuple(g.get_attr(a.path) if isinstance(a, Attr) else a for a in hit.args)
        new = g.call_function(hit.fn, args)
    hit.out.replace_all_uses_with(new)
    absorbed = {n for n in (hit.out, *hit.nodes) if isinstance(n, fx.Node)}
    todo = list(absorbed)
    while todo:        # erase what only the match used (never a BN call: it updates statistics)
        n = todo.pop()
        if n in erased or n.users or not (n in absorbed or n.op == "get_attr"
                                                     or op(n) not in (None, "batch_norm")):
            continue
        inputs = n.all_input_nodes
        if n.op == "call_module":
            ctx.covered.add(id(module(n)))
        g.erase_node(n)
        erased.add(n)
        todo.extend(inputs)
    return True


__all__ = ["PATTERNS", "Attr", "Hit", "Miss", "Site", "graph_pass", "register_leaf",
           "register_pattern"]
