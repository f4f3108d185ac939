"""Keep the ops TorchScript knows by id() alive, so a freed op's id cannot be reused.

torch.jit resolves a Python object to a builtin op through a table keyed by id(obj)
(torch/jit/_builtins.py). Every `torch.ops.ns.op` packet registers its op there. When a library
adds an overload to an existing op, torch refreshes the packet (torch._ops._refresh_packet) and
the old op object is freed; when a Library is destroyed, its packets are dropped
(torch.library._clear_torch_ops_cache). The ids stay in the table. A later object that CPython
places at the same address is then taken for that op by the script frontend: scripting fails at
random with "builtin cannot be used as a value" (seen in our test suite, where compile/aot tests
refresh `quantized_decomposed::quantize_per_tensor` before a torchscript test scripts Conv2d).

`install()` holds a reference to every op registered from then on and to every op a refresh or
a Library teardown would free. The cost is a few dozen small objects per process. If torch's
private names change, nothing is patched and `install()` returns False.
"""
from __future__ import annotations

import functools

import torch

_KEPT: list = []           # ops whose ids torch.jit remembers; never freed


def _keep(op) -> None:
    if op is not None:
        _KEPT.append(op)


def _wrap_register(fn):
    @functools.wraps(fn)
    def register_builtin(op, qualname):
        _keep(op)
        return fn(op, qualname)
    return register_builtin


def _wrap_refresh(fn):
    @functools.wraps(fn)
    def refresh_packet(packet):
        _keep(getattr(packet, "_op", None))      # the op the refresh replaces
        return fn(packet)
    return refresh_packet


def _keep_packets(op_defs) -> None:
    for qualname in op_defs:                         # "ns::name.overload"
        ns, _, rest = qualname.partition("::")
        namespace = torch.ops.__dict__.get(ns)
        packet = namespace.__dict__.get(rest.split(".")[0]) if namespace else None
        _keep(getattr(packet, "_op", None))


def _wrap_clear(fn):
    @functools.wraps(fn)
    def clear_torch_ops_cache(op_defs):
        _keep_packets(op_defs)
        return fn(op_defs)
    return clear_torch_ops_cache


def _wrap_destroy(fn):
    @functools.wraps(fn)
    def _destroy(self):
        _keep_packets(self._op_defs)
        return fn(self)
    return _destroy


# Each hook: its places in torch, newest first (module, attribute path, wrapper); the first
# one present is patched, at most once per process. Teardown drops packets in
# `_clear_torch_ops_cache` (also on a Library's garbage collection) where torch has it, and
# inline in `Library._destroy` before that (torch 2.4).
_HOOKS = (
    (("torch.jit._builtins", "_register_builtin", _wrap_register),),
    (("torch._ops", "_refresh_packet", _wrap_refresh),),
    (("torch.library", "_clear_torch_ops_cache", _wrap_clear),
     ("torch.library", "Library._destroy", _wrap_destroy)),
)


def _place(module: str, path: str):
    """(the object holding the attribute, its name, the callable there) or None."""
    import importlib
    owner = importlib.import_module(module)
    *outer, attr = path.split(".")
    for name in outer:
        owner = getattr(owner, name, None)
    fn = getattr(owner, attr, None)
    return (owner, attr, fn) if callable(fn) else None


@functools.cache
def install() -> bool:
    targets = []
    for places in _HOOKS:
        found = next(((p, wrap) for *where, wrap in places
                      if (p := _place(*where)) is not None), None)
        if found is None:
            return False
        (owner, attr, fn), wrap = found
        targets.append((owner, attr, wrap(fn)))
    for owner, attr, wrapped in targets:
        setattr(owner, attr, wrapped)
    return True
