"""A forward behind decorators (functools.wraps wrappers): traced without them, run with them.

HF transformers wraps most forwards (`@can_return_tuple`, `@deprecate_kwarg`, output capture;
the `kernels` hub's `use_kernel_forward_from_hub` replaces a layer's forward), each a
`(self, *args, **kwargs)` wrapper. fx reads the parameters of the wrapped function
(inspect.unwrap) but runs the wrapper's code: tracing such a module gave the wrapper one Proxy
for `*args` ("Proxy object cannot be iterated" where it passed them on), and fixing an argument
failed in fx's code patching ("code: co_varnames is too small"). Every HF decoder layer,
attention and model that had to be traced on its own failed.

Running the decorators at trace time would not do either: what they decide from the call
(a default they fill in, `return_dict`, a context they enter) would be fixed in the graph. So
the trace runs the undecorated function (a stand-in, the torch_modules.traced_as way: a
subclass sharing the module's state whose forward is that function), and the installed
forward is the decorator chain rebuilt around the graph's code: a copy of each wrapper whose
closure cell that held the next function holds the new one. A chain that is not that shape (a
wrapper that does not keep the next function in its closure) is traced as before. Where a
module is traced as part of its parent's graph instead, its decorators run at trace time, as
fx does: the parent calls it the same way every time."""
from __future__ import annotations

import functools
import inspect
import types

import torch.nn as nn


def _chain(fn) -> list | None:
    """[outer, ..., inner] of a functools.wraps chain whose wrappers each hold the next in a
    closure cell; None for an undecorated function or a chain of another shape."""
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        nxt = chain[-1].__wrapped__
        cells = getattr(chain[-1], "__closure__", None) or ()
        if not inspect.isfunction(chain[-1]) or not any(_holds(c, nxt) for c in cells):
            return None
        chain.append(nxt)
    return chain if len(chain) > 1 and inspect.isfunction(chain[-1]) else None


def _holds(cell, fn) -> bool:
    try:
        return cell.cell_contents is fn
    except ValueError:       # an empty cell
        return False


def undecorated(m: nn.Module):
    """The function under the decorators of m's class's forward, or None (not decorated, or a
    chain rebuild_around cannot rebuild)."""
    chain = _chain(type(m).forward)
    return chain[-1] if chain else None


def stand_in(m: nn.Module) -> nn.Module:
    """m, or where its forward is decorated, a stand-in whose forward is the undecorated one."""
    inner = undecorated(m)
    if inner is None:
        return m
    cls = type(type(m).__name__, (type(m),), {"__module__": type(m).__module__})
    cls.forward = inner   # after: an __init_subclass__ may wrap a forward it is given (HF's)
    s = cls.__new__(cls)
    object.__setattr__(s, "__dict__", m.__dict__)   # the same state, not a copy
    return s


def rebuild_around(m: nn.Module, fn):
    """m's class's decorator chain with `fn` in place of the undecorated forward."""
    chain = _chain(type(m).forward)
    out = fn
    for wrapper, old in zip(reversed(chain[:-1]), reversed(chain[1:])):
        cells = tuple(types.CellType(out) if _holds(c, old) else c
                      for c in wrapper.__closure__)
        copy = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__,
                                  wrapper.__defaults__, cells)
        copy.__kwdefaults__ = wrapper.__kwdefaults__
        out = functools.update_wrapper(copy, out)
        out.__qualname__ = wrapper.__qualname__
    return out
