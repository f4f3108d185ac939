"""An autograd.Function class from a forward(ctx, ...) and a backward(ctx, ...), as every
family's `*_function` builders make one per impl (the torch pair, the C++ and Triton ones)."""
from __future__ import annotations

from collections.abc import Callable

import torch


def function_class(name: str, forward: Callable, backward: Callable,
                   once: bool = False) -> type:
    """A torch.autograd.Function subclass called `name`. once: the backward runs native code,
    so a double backward must fail rather than return zeros (once_differentiable)."""
    if once:
        backward = torch.autograd.function.once_differentiable(backward)
    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})
