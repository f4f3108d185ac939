"""The layering, read from the source (ast, no imports run): no import cycles, the kernel
registry a leaf, kernel families independent of each other, and fuse/ the one library package
that bridges models and kernels. Every `import` counts, also the lazy ones inside functions."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fusebench"
FAMILIES = ("bias_gelu", "dwconv", "ln2d", "se_gate", "silu")
SHARED = ("act", "build", "checks", "pages", "problem", "registry", "triton_support")
# A ratchet: no import cycle is known any more, so any cycle fails (never add one here).
KNOWN_MODULE_CYCLES: set[frozenset[str]] = set()
KNOWN_PACKAGE_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """fusebench modules `name` imports (names relative to fusebench; "" is fusebench itself)."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets = [_rel(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = _rel(node.module)
            # `from pkg import sub` is an edge to pkg.sub (a package's own __init__ running
            # first is implicit in every import, so it is left out everywhere)
            targets = [f"{base}.{a.name}".lstrip(".") if f"{base}.{a.name}".lstrip(".") in MODULES
                       else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if t is not None and t in MODULES)
    return out - {name}


def _rel(module: str) -> str | None:
    if module == "fusebench":
        return ""
    return module[len("fusebench."):] if module.startswith("fusebench.") else None


GRAPH = {m: _imports(m) for m in MODULES}


def _package(module: str) -> str:
    return module.split(".")[0]


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one node (iterative Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def _package_graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        g.setdefault(_package(m), set()).update(
            _package(d) for d in deps if _package(d) != _package(m))
    return g


def _imports_of_package(pkg: str) -> set[str]:
    return {d for m, deps in GRAPH.items() if _package(m) == pkg for d in deps}


def test_no_new_module_cycle():
    cycles = set(_cycles(GRAPH))
    assert cycles <= KNOWN_MODULE_CYCLES, [sorted(c) for c in cycles - KNOWN_MODULE_CYCLES]
    assert not KNOWN_MODULE_CYCLES - cycles, "a known cycle is gone: drop it from the list"


def test_no_new_package_cycle():
    cycles = set(_cycles(_package_graph()))
    new = {c for c in cycles if not any(c <= k for k in KNOWN_PACKAGE_CYCLES)}
    assert not new, [sorted(c) for c in new]


@pytest.mark.parametrize("pkg", ["fuse", "kernels", "models"])
def test_fuser_models_kernels_have_no_cycle(pkg):
    """No cycle touches the three packages of the fuser, at module or package level."""
    for c in _cycles(GRAPH) + _cycles(_package_graph()):
        assert not any(_package(m) == pkg for m in c), sorted(c)


def test_kernel_registry_is_a_leaf():
    for leaf in ("kernels.registry", "kernels.problem", "kernels.checks",
                 "kernels.triton_support", "kernels.build"):
        assert not {d for d in GRAPH[leaf] if d.startswith("kernels.")}, (leaf, GRAPH[leaf])


@pytest.mark.parametrize("shared", SHARED)
def test_shared_kernel_code_imports_no_family(shared):
    """registry, problem, checks, ... and act/ (native code the three activation families
    share) are below the families: none of them imports one."""
    deps = {d for m, ds in GRAPH.items() if m == f"kernels.{shared}"
            or m.startswith(f"kernels.{shared}.") for d in ds}
    assert not {d for d in deps if d.split(".")[1:2] and d.split(".")[0] == "kernels"
                and d.split(".")[1] in FAMILIES}, deps


@pytest.mark.parametrize("family", FAMILIES)
def test_kernel_families_do_not_import_each_other(family):
    others = {f"kernels.{f}" for f in FAMILIES if f != family}
    deps = {d for m, ds in GRAPH.items() if m.startswith(f"kernels.{family}") for d in ds}
    assert not {d for d in deps if any(d == o or d.startswith(o + ".") for o in others)}


def _packages_imported_by(pkg: str) -> set[str]:
    return {_package(d) for d in _imports_of_package(pkg)} - {pkg}


def test_fuse_is_the_only_bridge_between_models_and_kernels():
    """Kernels know no model, mode or fuser; models know no fuser; fuse/ knows both. Among the
    library packages (the app layer, commands/ cell/ results/, lists both by design) fuse/ is
    the only one importing both models and kernels."""
    assert not _packages_imported_by("kernels") & {"models", "fuse", "modes"}
    assert not _packages_imported_by("models") & {"fuse", "modes"}
    assert {"models", "kernels"} <= _packages_imported_by("fuse")
    library = ("measure", "modes", "fuse")
    assert [p for p in library if {"models", "kernels"} <= _packages_imported_by(p)] == ["fuse"]


def test_coordinator_imports_only_the_worker_entry_from_cell():
    """run/ (the coordinator) starts workers; it imports from cell/ only the entry the fork
    server runs in its child. What both sides share is in the leaf protocol.py."""
    assert {d for d in _imports_of_package("run") if _package(d) == "cell"} <= {"cell.worker"}
    assert not GRAPH["protocol"]
