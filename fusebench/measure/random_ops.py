"""Which random-number ops a step calls: a live dropout (aten.bernoulli_), torch.rand in a
forward, noise injection. The correctness check runs a mode and eager after the same seed, so
their masks agree only where the mode draws from aten's generator in eager's order; inductor
draws its own (docs/measurement.md), and then the check must run a twin that does not.

Found by the ops' `nondeterministic_seeded` tag, the one torch puts on every op that reads the
generator, so a user's own random op counts as much as nn.Dropout. The attention kernels carry
the tag for their dropout: called with `dropout_p` 0 (nn.MultiheadAttention and SDPA without
dropout, in training too) they leave the generator as it was, so they do not count."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Seeded(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags and _draws(func, args, kwargs or {}):
            self.ops[f"{func.namespace}.{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _draws(func, args: tuple, kwargs: dict) -> bool:
    """False for an op with a `dropout_p` argument (the SDPA kernels) called with 0: their
    kernels read the generator only for a dropout (test_random_ops checks the generator's state
    stays as it was)."""
    names = [a.name for a in func._schema.arguments]
    if "dropout_p" not in names:
        return True
    i = names.index("dropout_p")
    p = args[i] if i < len(args) else \
        kwargs.get("dropout_p", func._schema.arguments[i].default_value)
    return p != 0


def random_ops(fn: Callable[[], object]) -> Counter:
    """{op: calls} of the seeded random ops `fn()` runs (forward and any backward inside)."""
    with _Seeded() as seen:
        fn()
    return seen.ops


def describe(ops: Counter) -> str:
    """'aten.bernoulli_ x12, aten.rand x1'."""
    return ", ".join(f"{op} x{n}" for op, n in ops.most_common())
