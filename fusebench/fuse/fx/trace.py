"""Tracing for the graph pass: which modules get an fx graph, and how a rewritten graph runs.

The whole model is traced first (a failed trace is tried once more with buffers as graph
values rather than real tensors; optional arguments a forward branches on are fixed to their
defaults, and the calls that pass them get a graph of their own: fx/specialise.py). Where
symbolic tracing fails (data-dependent control flow, iterating a Proxy, ...) each child is
traced on its own, then the parent is tried again with the children that failed kept as
opaque leaves; a module that still fails is a `fx_fallback` note and only its submodules (and
the module-level rules) are matched. Standard torch.nn modules, the fuser's own FusedModules,
modules with hooks (inlining one would skip its hooks) and fx/leaves.py's are leaves. Beyond
what fx traces by itself: grad / autocast `with` blocks (fx/modes.py), `*shape` and a
forward's `**kwargs` passed on (fx/stars.py), `torch.ones(T, T)` and `torch.finfo(x.dtype)`
of traced values (fx/shims.py), an `if` on a Parameter's dtype or device (fx/static.py), a
forward behind decorators (traced without them, run with them: fx/wrapped.py), a chunk
iterated, an `assert` (below). `isinstance` of a traced value is answered only where the
answer is sure (fx/typecheck.py).

A rewritten graph never replaces a module: the module keeps its class, children, Parameters and
names, and only its `forward` becomes the generated code (reading `self.<path>` at call time,
as FSDP needs). While the module's training flag differs from the one it was traced with (fx
specialises `self.training` branches), the class's own forward runs instead."""
from __future__ import annotations

import bisect
import contextlib
import dis
import inspect
import re
import types

import torch
import torch.fx as fx
import torch.nn as nn

from fusebench.errors import first_line
from fusebench.fuse.fx import (hidden, leaves, modes, shims, specialise, stars, static,
                               torch_modules, typecheck, wrapped)
from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.nodes import hooked
from fusebench.fuse.rule import FusedModule, torch_layer_of

CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


class _Tracer(fx.Tracer):
    def __init__(self, opaque: set[int], buffers: bool = False,
                 see_through: frozenset[int] = frozenset()):
        # shape helpers (einops, a user's registered ones) become one node each: fx/leaves.py
        super().__init__(autowrap_modules=leaves.modules(), autowrap_functions=leaves.functions())
        self.opaque = opaque
        self.see_through = see_through     # hooked modules traced into anyway (fx/hidden.py)
        self.proxy_buffer_attributes = buffers
        self.modes: modes.Recorder | None = None
        self.kwargs_dropped = False
        self.static_reads: dict = {}       # fx/static.py: Parameter dtypes an `if` read

    def trace(self, root, concrete_args=None):
        """fx's trace, with the grad / autocast `with` blocks it runs through kept in the
        graph (fx/modes.py), and values star-unpacked spliced in (fx/stars.py)."""
        self.modes = modes.Recorder(self._node)
        with self.modes.patched(), shims.installed(), typecheck.installed():
            graph = super().trace(root, concrete_args)
        stars.resolve(graph)
        _format_at_run_time(graph)
        setattr(graph, stars.DROPPED, self.kwargs_dropped)
        setattr(graph, static.READS, self.static_reads)
        return graph

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return stars.Proxy(node, self)

    def create_node(self, *args, **kwargs) -> fx.Node:
        if self.modes is not None:
            self.modes.check()
        return self._node(*args, **kwargs)

    def _node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        if self.modes is not None:
            node.meta[modes.REGION] = self.modes.region()
        return node

    def call_module(self, m: nn.Module, forward, args, kwargs):
        """A module called that is not one of the root's submodules has no path for a graph
        node (fx raised "module is not installed as a submodule"): HF's hub-kernel functions
        call a per-model wrapper module kept in a dict. One without state is traced through
        as the function it is; one with Parameters or buffers still stops the trace."""
        try:
            self.path_of_module(m)
        except NameError:
            if next(m.parameters(), None) is None and next(m.buffers(), None) is None:
                return forward(*args, **kwargs)
            raise
        if id(m) in self.see_through:    # its forward only: a user's hook never sees a Proxy
            forward = m.forward
        return super().call_module(m, forward, args, kwargs)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return (isinstance(m, FusedModule) or id(m) in self.opaque
                or (hooked(m) and id(m) not in self.see_through)
                or super().is_leaf_module(m, qualname) or _std_leaf(m))

    def to_bool(self, obj: fx.Proxy) -> bool:
        """`assert L == H * W` on traced values (Swin's blocks, MAE's patchify, research code
        generally) stopped the trace: a Proxy has no truth value. Where the truth value is
        asked by an assert, the graph checks it at run time (torch._assert raises the same
        AssertionError eager would) and tracing goes on past it. fx's own trace_asserts reads
        the bytecode of Python <= 3.10 only. An `if` on a Parameter's dtype or device is
        decided now and guarded at call time (fx/static.py); on other traced values it still
        fails."""
        known = static.truth(obj.node, self.root, self.static_reads)
        if known is not None:
            return known
        user = inspect.currentframe().f_back.f_back          # to_bool <- Proxy.__bool__ <- code
        if user is not None and _asserts(user):
            where = f"{user.f_code.co_filename.rsplit('/', 1)[-1]}:{user.f_lineno}"
            self.create_proxy("call_function", torch._assert,
                              (obj, f"assertion failed at {where} (checked in the fused graph)"),
                              {})
            return True
        return super().to_bool(obj)

    def iter(self, obj: fx.Proxy):
        """fx unpacks a Proxy only as `a, b, c = p`; `map(f, x.chunk(3, -1))` (lucidrains'
        q, k, v), `*parts` and `for t in parts` iterate it. A chunk into a constant count, or
        a split into listed sizes, has that many parts: iterate those, with a check at run
        time (chunk makes fewer where the size does not divide: 4 into 3 gives 2)."""
        count = _parts(obj.node)
        if count is None:
            user = inspect.currentframe().f_back.f_back      # <- Proxy.__iter__ <- code
            if stars.unpacking(user):                        # `*value`: fx/stars.py
                return iter([self.create_proxy("call_function", stars.star, (obj,), {})])
            if stars.passing_kwargs(obj.node, user):         # `**kwargs` passed on: empty
                self.kwargs_dropped = True
                return iter(())
            return super().iter(obj)
        self.create_proxy("call_function", has_parts, (obj, count), {})
        return iter([obj[i] for i in range(count)])


_PROXY_TEXT = re.compile(r"Proxy\((\w+)\)")


def _format_at_run_time(graph: fx.Graph) -> None:
    """An assert whose message the code formatted at trace time (timm's patch embedding:
    `_assert(H == size, f"Input height ({H}) doesn't match model ({size}).")`) said "Input
    height (Proxy(getitem_2))" when it fired in the graph. Such a message is formatted
    again from those values at run time, as eager formats it."""
    nodes = {n.name: n for n in graph.nodes}
    for n in list(graph.nodes):
        if not (n.op == "call_function" and n.target is torch._assert and len(n.args) > 1
                and isinstance(n.args[1], str)):
            continue
        parts = _PROXY_TEXT.split(n.args[1])
        names = parts[1::2]
        if names and all(name in nodes for name in names):
            with graph.inserting_before(n):
                text = graph.call_function(message, (tuple(parts[0::2]),
                                                     *(nodes[name] for name in names)))
            n.args = (n.args[0], text, *n.args[2:])


def message(texts: tuple, *values) -> str:
    """texts[0] + str(values[0]) + texts[1] + ...: a trace-time f-string, at run time."""
    out = [texts[0]]
    for value, text in zip(values, texts[1:]):
        out += [str(value), text]
    return "".join(out)


def _asserts(frame) -> bool:
    """The instruction frame is at jumps when true over code that raises AssertionError: an
    `assert`. (Python 3.13 asks the truth value in COMPARE_OP / TO_BOOL, just before.)"""
    code = list(dis.get_instructions(frame.f_code))
    i = bisect.bisect_left(code, frame.f_lasti, key=lambda ins: ins.offset)
    if i < len(code) and code[i].opname in ("COMPARE_OP", "TO_BOOL"):
        i += 1
    if i + 1 >= len(code) or not (code[i].opname.startswith("POP_JUMP")
                                  and code[i].opname.endswith("IF_TRUE")):
        return False
    nxt = code[i + 1]
    return nxt.opname == "LOAD_ASSERTION_ERROR" or (
        nxt.opname == "LOAD_GLOBAL" and nxt.argval == "AssertionError")


def _parts(n: fx.Node) -> int | None:
    """How many tensors a chunk / split node returns, where the code fixes it."""
    if N.op(n) == "chunk":
        count = N.arg(n, 1, "chunks")
        return count if type(count) is int else None
    if N.op(n) == "split":
        sizes = N.arg(n, 1, "split_size_or_sections", n.kwargs.get("split_size"))
        return len(sizes) if isinstance(sizes, (list, tuple)) else None
    return None


def has_parts(parts, count: int) -> None:
    if len(parts) != count:
        raise RuntimeError(f"fused graph traced for {count} chunks; this input gives "
                           f"{len(parts)} (chunk makes fewer where the size does not divide)")


def _std_leaf(m: nn.Module) -> bool:
    """A FusedModule, a leaf by fx/leaves.py, a torch.nn layer, or a subclass of one that
    keeps its forward (a leaf like the layer, so that its node is the layer's: fx/nodes.op);
    not the torch.nn transformers, which stay leaves in a parent's trace but are walked into
    (torch_modules)."""
    if isinstance(m, (FusedModule, *leaves.module_types())):
        return True
    if torch_modules.seen_into(m):
        return False
    return (m.__module__.startswith("torch.nn") and not isinstance(m, (nn.Sequential, *CONTAINERS))
            ) or torch_layer_of(m) is not None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


@contextlib.contextmanager
def _buffers_kept(model: nn.Module):
    """Tracing runs a forward whose ops on real buffers happen for real (BatchNorm2d subclasses
    such as timm's BatchNormAct2d add 1 to num_batches_tracked, once per attempt): put every
    buffer back as it was, so that fusing leaves the model's state as it found it."""
    kept = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, v in kept:
                b.copy_(v)


_GONE = object()
FX_CONSTANT = "_tensor_constant"    # fx stores a tensor the code made at trace time on the root


@contextlib.contextmanager
def _attributes_kept(m: nn.Module):
    """Tracing runs m's forward: an assignment in it (`self.attn = p_attn`, the Annotated
    Transformer's; `self.mask = ...` caching) stores a Proxy on the module, and the traced
    graph never makes that assignment. Every attribute, buffer and parameter slot of m's
    modules is put back as it was; yields the list of `path.name`s the forward assigned."""
    kept = [(path, sub, {k: dict(d) for k, d in _slots(sub)}) for path, sub in m.named_modules()]
    assigned: list[str] = []
    try:
        yield assigned
    finally:
        for path, sub, before in kept:
            for key, store in _slots(sub):
                old = before[key]
                for k in set(store) | set(old):
                    if sub is m and key == "dict" and k.startswith(FX_CONSTANT):
                        continue                 # fx's own: the graph reads it (get_attr)
                    if store.get(k, _GONE) is not old.get(k, _GONE):
                        assigned.append(_join(path, k))
                        if k in old:
                            store[k] = old[k]
                        else:
                            del store[k]


def _slots(m: nn.Module):
    return (("dict", vars(m)), ("buffers", m._buffers), ("parameters", m._parameters))


def graph_roots(model: nn.Module, notes: list) -> list[tuple[str, nn.Module, fx.GraphModule]]:
    """(path, module, traced graph) for the topmost modules that trace, outermost first."""
    opaque: set[int] = set()
    memo: dict[int, list] = {}
    failed: dict[tuple[str, str], list[str]] = {}      # (class, reason) -> paths
    kept: dict[tuple[str, str], list[str]] = {}        # (class, reason) -> paths

    def trace(m, see_through=frozenset()):
        if isinstance(m, CONTAINERS) or torch_modules.walked_only(m):
            return None
        first, root = None, wrapped.stand_in(torch_modules.traced_as(m))
        # buffers as real tensors first (as fx does); then as graph values, for code that
        # slices one by a traced length (nanoGPT's causal mask, RoPE tables: `buf[:t]`)
        for buffers in (False, True):
            def attempt(concrete):
                with _attributes_kept(m) as assigned:
                    graph = _Tracer(opaque, buffers, see_through).trace(
                        root, concrete_args=concrete)
                if assigned:
                    raise RuntimeError(f"its forward assigns {', '.join(sorted(assigned))}, "
                                       f"which a traced graph would not do")
                return graph
            try:
                variants = specialise.traced(attempt, root.forward)
            except Exception as e:                   # noqa: BLE001 - any trace failure
                first = first or e
                continue
            gms = [fx.GraphModule(m, graph) for graph, _ in variants]
            for i, (gm, (graph, key)) in enumerate(zip(gms, variants)):
                gm.fusebench_fixed = (inspect.signature(root.forward), key)
                gm.fusebench_variant = i
                gm.fusebench_kwargs_dropped = getattr(graph, stars.DROPPED, False)
                setattr(gm, static.READS, getattr(graph, static.READS, {}))
            return gms
        return first

    def below(path, m):
        out = []
        for name, c in m.named_children():
            if isinstance(c, CONTAINERS):
                out += below(_join(path, name), c)
            elif not _std_leaf(c):
                out += resolve(_join(path, name), c)
        return out

    def resolve(path, m):
        if id(m) in memo:
            return memo[id(m)]
        why = torch_modules.left_to_torch(m)
        if why:
            kept.setdefault((type(m).__name__, why), []).append(path or "the model")
            memo[id(m)] = []
            return []
        gms = trace(m)
        if not isinstance(gms, list):
            roots = below(path, m)                   # marks untraceable children opaque
            retry = trace(m)
            if not isinstance(retry, list):
                opaque.add(id(m))
                if gms is not None:
                    key = (type(m).__name__, first_line(gms, 200))
                    failed.setdefault(key, []).append(path or "the model")
                memo[id(m)] = roots
                return roots
            gms = retry
        out = [(path, m, gm) for gm in gms]
        for n in (n for gm in gms for n in gm.graph.nodes):   # custom leaves: opaque, hooked
            if n.op == "call_module":
                sub = m.get_submodule(n.target)
                if not _std_leaf(sub) and sub is not m:
                    out += [r for r in resolve(_join(path, n.target), sub) if r not in out]
        memo[id(m)] = out
        return out
    with _buffers_kept(model):
        roots = resolve("", model)
        for _, m, gm in roots:       # where a hook keeps a custom module a call: fx/hidden.py
            if getattr(gm, "fusebench_variant", 0) == 0:
                hidden.attach(gm, m, trace, _std_leaf)
    for (cls, reason), paths in failed.items():     # one note per class and reason
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        notes.append(("fx_fallback", f"fx trace of {', '.join(paths[:3])}{more} ({cls}) "
                                     f"failed: {reason}; its submodules are matched on their own"))
    for (cls, reason), paths in kept.items():
        more = f" and {len(paths) - 3} more" if len(paths) > 3 else ""
        notes.append(("not_fused", f"{cls}: {len(paths)} module(s) {reason} "
                                   f"(at {', '.join(paths[:3])}{more})"))
    return roots


def install(m: nn.Module, gms: list[fx.GraphModule]) -> None:
    """Run the code of m's traced graphs (one per variant: fx/specialise.py) as m's forward
    (m's own attributes; see the module docstring)."""
    variants = []
    for gm in sorted(gms, key=lambda g: getattr(g, "fusebench_variant", 0)):
        gm.recompile()
        for n in gm.graph.nodes:     # tensor constants fx lifted out of the code live on gm
            if n.op == "get_attr" and "." not in n.target and not hasattr(m, n.target):
                object.__setattr__(m, n.target, getattr(gm, n.target))
        variants.append((getattr(gm, "fusebench_fixed", (None, {})), type(gm).forward))
    (signature, key), code = variants[0]
    traced_training = m.training
    # what runs where the graph does not: the class's forward, or under its decorators (which
    # run at call time around either) the function they wrap (fx/wrapped.py)
    inner = wrapped.undecorated(m)
    own = inner or type(m).forward
    if key:                          # optional arguments the trace fixed (fx/specialise.py)
        code = specialise.guarded([(k, c) for (_, k), c in variants], signature, own)

    if any(modes.has_modes(gm.graph) for gm in gms):
        code = _unwinding(code)
    if any(getattr(gm, "fusebench_kwargs_dropped", False) for gm in gms):
        code = _no_extra_kwargs(code, signature, own)
    reads = {k: v for gm in gms for k, v in getattr(gm, static.READS, {}).items()}
    if reads:
        code = _static_guarded(code, reads, own)

    def forward(self, *args, **kwargs):
        if self.training != traced_training:
            return own(self, *args, **kwargs)
        return code(self, *args, **kwargs)
    m.forward = types.MethodType(wrapped.rebuild_around(m, forward) if inner else forward, m)


def _no_extra_kwargs(code, signature: inspect.Signature, own):
    """The graph passed on an empty **kwargs (fx/stars.py): a call that gives keywords the
    signature does not name runs the class's own forward, which passes them on."""
    named = {p.name for p in signature.parameters.values()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}

    def run(self, *args, **kwargs):
        if kwargs.keys() - named:
            return own(self, *args, **kwargs)
        return code(self, *args, **kwargs)
    return run


def _static_guarded(code, reads: dict, own):
    """The graph decided `if`s on these tensors' dtype / device (fx/static.py): once one has
    changed (`model.half()` after fusing), the class's own forward runs, and says so once."""
    def run(self, *args, **kwargs):
        why = static.changed(self, reads)
        if why is not None:
            static.warn_once(type(self).__name__, why)
            return own(self, *args, **kwargs)
        return code(self, *args, **kwargs)
    return run


def _unwinding(code):
    def run(self, *args, **kwargs):
        with modes.unwound():
            return code(self, *args, **kwargs)
    return run
