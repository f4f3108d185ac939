"""The autograd.Function each bn_act impl registers, built from its pure forward/backward pair
(the fuser composes the pair itself; this node is what `fusebench kernel bn_act` measures)."""
from __future__ import annotations

from typing import Callable

import torch


def bn_act_function(name: str, forward: Callable, backward: Callable) -> type:
    """A Function named `name` that runs forward without running statistics and saves x, the
    parameters and the (C,) mean / invstd."""
    def fwd(ctx, x, weight, bias, eps, act):
        y, mean, invstd = forward(x, weight, bias, None, None, 0.0, eps, act)
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.act = act
        return y

    @torch.autograd.function.once_differentiable
    def bwd(ctx, dy):
        x, weight, bias, mean, invstd = ctx.saved_tensors
        dx, dw, db = backward(dy, x, weight, bias, mean, invstd, ctx.act)
        return dx, dw, db, None, None

    return type(name, (torch.autograd.Function,),
                {"forward": staticmethod(fwd), "backward": staticmethod(bwd)})
