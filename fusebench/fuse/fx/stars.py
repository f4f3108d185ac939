"""A traced value unpacked: `*value` into a tuple, a list or a call, and a forward's own
`**kwargs` passed on.

`*value`: HF transformers' current attention shapes its heads with `hidden_shape =
(*input_shape, -1, head_dim)` and ends with `.reshape(*input_shape, -1)`, where
`input_shape = x.shape[:-1]`. Unpacking iterates the Proxy, which fx refuses (its length is
unknown until run time), so every such attention, and the decoder layer around it, was an
`fx_fallback`.

While tracing, the unpacked value stands as one marker element (`star`); after the trace each
tuple or list holding a marker becomes one `spliced` node that builds it at run time, and a
call given `*value` takes the spliced tuple as its one shape argument, where it is a Tensor
method that takes either form (`view(*s)` is `view(s)`; any other call fails the trace, with
a reason). Only where the interpreter is unpacking into a display or a call (LIST_EXTEND,
CALL_FUNCTION_EX): a `for` over a traced value still fails as before.

`**kwargs`: HF's attention and decoder-layer forwards take `**kwargs` and pass them on
(`self.self_attn(..., **kwargs)`); fx makes the dict one placeholder, and passing it on
iterates its keys. It is traced as the empty dict it is in a plain call, and the installed
forward runs the module's own code for a call that does give extra keywords
(fx/trace.py: install), so none is dropped."""
from __future__ import annotations

import bisect
import dis
import inspect

import torch.fx as fx

# Tensor methods whose sizes may come as varargs or as one sequence
SHAPE_METHODS = frozenset({"view", "reshape", "expand", "repeat", "permute", "tile",
                           "new_zeros", "new_ones", "new_empty"})
UNPACKING = frozenset({"LIST_EXTEND", "CALL_FUNCTION_EX"})
DROPPED = "fusebench_kwargs_dropped"   # graph attribute: its **kwargs was traced as empty


def star(value):
    """The marker of `*value` while tracing; no graph keeps one (resolve replaces it)."""
    raise RuntimeError("fusebench: an unresolved star marker ran")


def spliced(stars: tuple[bool, ...], *items) -> tuple:
    out: list = []
    for unpack, item in zip(stars, items):
        if unpack:
            out.extend(item)
        else:
            out.append(item)
    return tuple(out)


def _at(frame) -> str:
    code = list(dis.get_instructions(frame.f_code))
    i = bisect.bisect_left(code, frame.f_lasti, key=lambda ins: ins.offset)
    return code[i].opname if i < len(code) else ""


def unpacking(frame) -> bool:
    """The instruction the frame is at unpacks a value into a display or a call's arguments."""
    return _at(frame) in UNPACKING


def passing_kwargs(node: fx.Node, frame) -> bool:
    """node is the keys of the forward's own **kwargs, asked to pass them on (`f(**kwargs)`)."""
    return (node.op == "call_method" and node.target == "keys"
            and node.args[0].op == "placeholder" and node.args[0].target.startswith("**")
            and _at(frame) == "DICT_MERGE")


class _LengthUnknown:
    """A Proxy whose length, asked while unpacking into a display, is "unknown" (a TypeError
    the interpreter's length hint takes as such) rather than fx's RuntimeError."""

    def __len__(self):
        if unpacking(inspect.currentframe().f_back):
            raise TypeError("a traced value's length is known at run time only")
        return super().__len__()


class Attribute(_LengthUnknown, fx.proxy.Attribute):
    """`x.shape` and other attributes (fx makes them Attributes, not through the tracer)."""


class Proxy(_LengthUnknown, fx.Proxy):
    def __getattr__(self, k: str) -> Attribute:
        return Attribute(self, k)


def _is_star(a) -> bool:
    return isinstance(a, fx.Node) and a.op == "call_function" and a.target is star


def _splice(graph: fx.Graph, items) -> fx.Node:
    return graph.call_function(spliced, (tuple(_is_star(i) for i in items),
                                         *(i.args[0] if _is_star(i) else i for i in items)))


def _inner(graph: fx.Graph, a):
    """a with every tuple / list holding a marker built by a spliced node (list: list())."""
    if isinstance(a, (tuple, list)):
        items = [_inner(graph, i) for i in a]
        if any(_is_star(i) for i in items):
            node = _splice(graph, items)
            return node if isinstance(a, tuple) else graph.call_function(list, (node,))
        return type(a)(items)
    if isinstance(a, dict):
        return {k: _inner(graph, v) for k, v in a.items()}
    return a


def _call(graph: fx.Graph, n: fx.Node, args: tuple) -> None:
    """Call n, made with `*value` among its positional args, takes them as one shape."""
    if n.op == "call_method" and n.target in SHAPE_METHODS and not _is_star(args[0]):
        n.args = (args[0], _splice(graph, args[1:]))
        return
    raise fx.proxy.TraceError(f"a traced value is unpacked into the arguments of {n.target}, "
                              f"which takes no one-sequence form")


def resolve(graph: fx.Graph) -> None:
    """Replace every marker the trace left (see the module docstring)."""
    for n in [n for n in graph.nodes if n.op == "call_method" and n.target == "keys"
              and not n.users and n.args[0].op == "placeholder"]:
        graph.erase_node(n)                  # the keys of a **kwargs traced as empty
    marks = [n for n in graph.nodes if _is_star(n)]
    if not marks:
        return
    for n in list(graph.nodes):
        if _is_star(n):
            continue
        with graph.inserting_before(n):
            args = tuple(_inner(graph, a) for a in n.args)
            n.kwargs = {k: _inner(graph, v) for k, v in n.kwargs.items()}
            if n.op != "output" and any(_is_star(a) for a in args):
                _call(graph, n, args)
            else:
                n.args = args
    for m in marks:
        if m.users:                          # a marker used as a value, not unpacked
            raise fx.proxy.TraceError("a traced value is unpacked where it cannot be spliced")
        graph.erase_node(m)


