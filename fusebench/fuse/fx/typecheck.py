"""`isinstance(value, cls)` in a forward, on a value the trace only has as a Proxy.

fx answers with the Proxy's own class, False, and the graph keeps whichever branch that
chose without a word: HF's T5 attention reads `isinstance(past_key_values,
EncoderDecoderCache)`, took the other branch in the trace, and the fused model then failed on
every call that passed a cache ("'EncoderDecoderCache' object has no attribute ..."); a
`if isinstance(x, torch.Tensor): x = x.to(...)` would drop the cast silently. While tracing:
- a Parameter or buffer read from the module (a get_attr) is answered from the real tensor:
  its class is not data (T5's `isinstance(self.wo.weight, torch.Tensor)`);
- builtin classes only (str, int, tuple, list, dict, ...) keep fx's False: a tensor is none of
  them, and HF's `isinstance(x.device.type, str)` is traced this way (fx/modes.py);
- any other class (torch.Tensor, a library's or the user's class) stops the trace with a
  reason: the answer depends on what a call passes, so the module is matched by its parts.
The code of torch and of fusebench itself asks about Proxies all the time and is answered as
Python would."""
from __future__ import annotations

import builtins
import contextlib
import sys
import types
import typing

import torch.fx as fx

from fusebench.fuse.fx import static

_real = builtins.isinstance
# callers answered as Python would: torch's, fusebench's and the standard library's code
_PYTHON = {"torch", "fusebench", *sys.stdlib_module_names}


def _classes(cls) -> tuple:
    """The classes `isinstance` tests: a tuple's or a union's (`int | None`) members."""
    if _real(cls, (tuple, types.UnionType)):
        return tuple(c for part in typing.get_args(cls) or cls for c in _classes(part))
    return (cls,)


def _checked(obj, cls) -> bool:
    if not _real(obj, fx.Proxy):
        return _real(obj, cls)
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if caller.partition(".")[0] in _PYTHON:
        return _real(obj, cls)
    node = obj.node
    if node.op == "get_attr":
        try:
            return _real(static._tensor(obj.tracer.root, node.target), cls)
        except static.NotStatic:
            pass
    classes = _classes(cls)
    if _real(obj, cls) or all(getattr(c, "__module__", "") == "builtins" for c in classes):
        return _real(obj, cls)
    names = ", ".join(c.__name__ for c in classes)
    raise fx.proxy.TraceError(f"isinstance of a traced value ({node.name}) against {names} is "
                              f"decided at run time; fx would answer False")


@contextlib.contextmanager
def installed():
    builtins.isinstance = _checked
    try:
        yield
    finally:
        builtins.isinstance = _real
