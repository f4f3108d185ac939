"""Functions and modules the tracer keeps whole, as one graph node, instead of tracing into
them: helpers that do Python on a tensor's shape, which a Proxy stops. einops is the common
one: `rearrange(t, "b n (h d) -> b h n d", h=8)` reads t.shape and parses its pattern, so a
model written with it (lucidrains' ViT, Stable Diffusion's attention) failed to trace and
kept none of its sites. As a node the call runs as written at run time, and the patterns
see its output as any tensor: the attention site takes einops-shaped q, k, v.

einops' functions (`rearrange`, `repeat`, `reduce`, `einsum`, `pack`, `unpack`, ...), called
by name or as `einops.rearrange`, and its layers (`einops.layers.torch.Rearrange`, ...) are
leaves when einops is installed; `register_leaf(obj)` adds a function of one's own (called by
the name a module imported it under, as with torch.fx.wrap) or an nn.Module class."""
from __future__ import annotations

import functools
import importlib
import inspect
import math
from types import ModuleType

import torch.nn as nn

from fusebench.errors import UsageError

_FUNCTIONS: list = []
_MODULES: list[type] = []


@functools.cache
def _einops(sub: str = "") -> ModuleType | None:
    """einops (or a submodule), or None; cached, since without einops each import would
    search the path again, and the attention pattern asks for einops.einsum at every node."""
    try:
        return importlib.import_module("einops" + sub)
    except ImportError:
        return None


def einops_function(name: str):
    """einops.<name>, or None without einops."""
    e = _einops()
    return getattr(e, name, None) if e is not None else None


def register_leaf(obj):
    """Keep `obj` (a function, or an nn.Module subclass) as one node in every traced graph.
    Returns obj, so it can decorate."""
    if inspect.isclass(obj) and issubclass(obj, nn.Module):
        _MODULES.append(obj)
    elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
        _FUNCTIONS.append(obj)
    else:
        raise UsageError(f"register_leaf: {obj!r} is neither a function nor an nn.Module class")
    return obj


def modules() -> tuple[ModuleType, ...]:
    """Modules whose public functions are leaves wherever they are called (`math.sqrt`,
    `einops.rearrange`)."""
    return (math,) + tuple(m for m in (_einops(),) if m is not None)


def functions() -> tuple:
    return tuple(_FUNCTIONS)


def module_types() -> tuple[type, ...]:
    return _einops_layers() + tuple(_MODULES)


@functools.cache
def _einops_layers() -> tuple[type, ...]:
    layers = _einops(".layers.torch")
    return tuple(v for v in vars(layers).values() if inspect.isclass(v)
                 and issubclass(v, nn.Module) and v.__module__.startswith("einops")) \
        if layers is not None else ()
