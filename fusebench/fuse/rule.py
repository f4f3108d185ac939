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
from fusebench.fuse.binding import BnActImpl, Pure, bind_act, resolve_bn_act
from fusebench.registry import Registry


class FusedModule(nn.Module):
    """Marker base: a module the fuser produced. `fusion` names the fusion that made it."""
    fusion = ""


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
