"""torch calls that refuse a traced value before fx sees them, made to take one while tracing.

- Sizes as separate arguments: `torch.ones(T, T)` with a traced T fails in torch's argument
  parser (`ones() takes 1 positional argument but 2 were given`; the one-tuple form
  `torch.ones((T, T))` reaches fx): the factories that take sizes either way pass a traced
  size list on as one tuple, which is what the graph then calls.
- A traced dtype's limits: `torch.finfo(scores.dtype).min` (BERT-style extended masks written
  with the hidden states' dtype, Stable Diffusion's `-torch.finfo(sim.dtype).max`) fails
  ("a traced dtype is no dtype"): `torch.finfo(proxy)` gives an object whose `.min`, `.max`,
  `.eps`, `.tiny`, ... are graph nodes that read them from the dtype at run time.
- A traced value inside a size tuple or as a keyword: `torch.full((T, T), -inf,
  device=x.device)` (HF's causal masks). Newer torch hands such a call to fx itself; torch 2.4's
  argument parser looks only at top-level positional arguments and refuses it ("full() received
  an invalid combination of arguments"), so the factories record the call themselves, the node
  fx would record.
Each shim acts only on a Proxy argument; any other call is torch's own."""
from __future__ import annotations

import contextlib
import functools
import operator

import torch
import torch.fx as fx

# torch factories whose sizes may come as varargs or as one sequence
SIZE_FACTORIES = ("ones", "zeros", "empty", "rand", "randn")
# and those that take a size (or bounds) one way, whose device/dtype keywords may be traced
OTHER_FACTORIES = ("full", "arange", "eye")


def finfo_of(dtype, name: str):
    """torch.finfo(dtype).<name>, at run time."""
    return getattr(torch.finfo(dtype), name)


def reads_lowest(n) -> bool:
    """n is the code's `torch.finfo(dtype).min` or `-torch.finfo(dtype).max` of a traced dtype
    (the same value: a mask fill that masks as -inf does)."""
    if isinstance(n, fx.Node) and n.op == "call_function" and n.target is operator.neg:
        return _reads(n.args[0], "max")
    return _reads(n, "min")


def _reads(n, name: str) -> bool:
    return (isinstance(n, fx.Node) and n.op == "call_function" and n.target is finfo_of
            and n.args[1] == name)


class _TracedFinfo:
    def __init__(self, dtype: fx.Proxy):
        self._dtype = dtype

    def __getattr__(self, name: str) -> fx.Proxy:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._dtype.tracer.create_proxy("call_function", finfo_of, (self._dtype, name), {})


def _proxy_in(value) -> fx.Proxy | None:
    """The first Proxy in value, looking inside tuples, lists and dicts."""
    if isinstance(value, fx.Proxy):
        return value
    items = value.values() if isinstance(value, dict) else value
    if isinstance(value, (tuple, list, dict)):
        for item in items:
            found = _proxy_in(item)
            if found is not None:
                return found
    return None


def _recording(fn, packs_sizes: bool):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if packs_sizes and len(args) > 1 and any(isinstance(s, fx.Proxy) for s in args):
            args = (args,)
        proxy = _proxy_in((args, kwargs))
        if proxy is None:
            return fn(*args, **kwargs)
        return proxy.tracer.create_proxy("call_function", fn, args, kwargs)
    return call


def _finfo(real):
    def finfo(*args, **kwargs):
        if args and isinstance(args[0], fx.Proxy):
            return _TracedFinfo(args[0])
        return real(*args, **kwargs)
    return finfo


@contextlib.contextmanager
def installed():
    """For a trace: the shims above in place of torch's functions, torch's own after."""
    kept = {name: getattr(torch, name) for name in (*SIZE_FACTORIES, *OTHER_FACTORIES, "finfo")}
    try:
        for name in (*SIZE_FACTORIES, *OTHER_FACTORIES):
            setattr(torch, name, _recording(kept[name], name in SIZE_FACTORIES))
        torch.finfo = _finfo(kept["finfo"])
        yield
    finally:
        for name, fn in kept.items():
            setattr(torch, name, fn)
