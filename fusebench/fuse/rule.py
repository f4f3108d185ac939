"""What a fusion is: a pure rewrite of one module, registered by name, and the context one
fuse() call shares between its fusions (the kernels bound once, the notes for the events).

A fusion looks at one module and returns its replacement, or None when the pattern does not
match. Replacements are FusedModules that hold no state of their own: they keep the original
submodules / Parameters under the same names, so optimizers, state dicts and FSDP see the very
same Parameters."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch.nn as nn

from fusebench.errors import first_line
from fusebench.fuse.binding import BnActImpl, GnActImpl, Pure, bind_act, resolve_bn_act
from fusebench.registry import Registry


class FusedModule(nn.Module):
    """Marker base: a module the fuser produced. `fusion` names the fusion that made it."""
    fusion = ""


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.ParameterList,
               nn.ParameterDict)


def _torch_layer(cls: type) -> bool:
    return cls.__module__.startswith("torch.nn") and cls is not nn.Module \
        and not issubclass(cls, _CONTAINERS)


def computes_as(m: nn.Module, cls: type) -> bool:
    """m is a cls, or a subclass of the torch.nn layer cls that keeps cls's forward (and
    _conv_forward): one that only sets other defaults, as HF transformers'
    EfficientNetDepthwiseConv2d is an nn.Conv2d, computes what cls computes. A subclass with
    a forward of its own may compute anything: not matched as cls."""
    t = type(m)
    if t is cls:
        return True
    return isinstance(m, cls) and _torch_layer(cls) and all(
        getattr(t, f, None) is getattr(cls, f, None) for f in ("forward", "_conv_forward"))


def torch_layer_of(m: nn.Module) -> type | None:
    """The torch.nn layer class m computes as (computes_as), or None."""
    return next((c for c in type(m).__mro__ if _torch_layer(c) and computes_as(m, c)), None)


@dataclass(frozen=True)
class Fusion:
    name: str
    matches: tuple[type, ...]
    rewrite: Callable[[nn.Module, "FuseContext"], nn.Module | None]
    benches: tuple[str, ...]
    description: str = ""


@dataclass
class FuseContext:
    bench: str
    device: str
    ln2d: tuple[str, Callable] | None = None      # (impl name, fn), resolved once
    rms_norm: tuple | None = None                 # (impl name, fn, dtypes), resolved once
    gn_act: GnActImpl | None = None               # resolved once (binding.resolve_gn_act)
    dwconv: bool | None = None                    # the dwconv kernel built here, checked once
    covered: set[int] = field(default_factory=set)    # ids of modules a graph site absorbed
    notes: list[tuple[str, str]] = field(default_factory=list)   # (event category, message)
    impls: dict[str, str] = field(default_factory=dict)          # family -> impl override
    bound: dict[str, Pure] = field(default_factory=dict)         # family -> pair, once
    opt_in: frozenset[str] = frozenset()      # fusions off by default that were asked for
    bn_act_impl: tuple[BnActImpl | None] | None = None           # (kernel | None=aten,), once

    def act(self, family: str) -> Pure:
        """The act family's kernels for this fuse(): resolved on first use, then reused."""
        if family not in self.bound:
            self.bound[family] = bind_act(family, self.device, self.notes,
                                          self.impls.get(family))
        return self.bound[family]

    def bn_act(self) -> BnActImpl | None:
        """The BN(train) + act kernel for this fuse() (None: aten's sequence), resolved once."""
        if self.bn_act_impl is None:
            self.bn_act_impl = (resolve_bn_act(self.device, self.notes,
                                               self.impls.get("bn_act")),)
        return self.bn_act_impl[0]


FUSIONS: Registry[Fusion] = Registry("fusion")


def register_fusion(name: str, matches, benches=("train", "infer"), description: str = ""):
    """Decorator: `rewrite(module, ctx) -> new module | None` becomes fusion `name`. The order
    fusions are tried in is fusebench.fuse.ORDER, not registration order."""
    def deco(fn):
        types = matches if isinstance(matches, tuple) else (matches,)
        FUSIONS.add(name, Fusion(name, types, fn, tuple(benches),
                                 description or first_line(fn.__doc__, None)))
        return fn
    return deco
