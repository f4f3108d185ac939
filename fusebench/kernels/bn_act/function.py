"""The autograd.Function each bn_act impl registers, built from its pure forward/backward pair
(the fuser composes the pair itself; this node is what `fusebench kernel bn_act` measures)."""
from __future__ import annotations

from typing import Callable

from fusebench.kernels.function_class import function_class


def bn_act_function(name: str, forward: Callable, backward: Callable) -> type:
    """A Function named `name` that runs forward without running statistics and saves x, the
    parameters and the (C,) mean / invstd."""
    def fwd(ctx, x, weight, bias, eps, act):
        y, mean, invstd = forward(x, weight, bias, None, None, 0.0, eps, act)
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.act = act
        return y

    def bwd(ctx, dy):
        x, weight, bias, mean, invstd = ctx.saved_tensors
        dx, dw, db = backward(dy, x, weight, bias, mean, invstd, ctx.act)
        return dx, dw, db, None, None

    return function_class(name, fwd, bwd, once=True)


def bn_add_relu_function(name: str, forward: Callable, backward: Callable) -> type:
    """A Function named `name`: relu(BN(x) + residual) without running statistics, saving x,
    the parameters, the (C,) mean / invstd and the output (ReLU's derivative reads off it, as
    the fused bn_add_act site keeps it); gradients for x, the residual and the parameters."""
    def fwd(ctx, x, residual, weight, bias, eps):
        y, mean, invstd = forward(x, weight, bias, None, None, 0.0, eps, "relu",
                                  residual=residual)
        ctx.save_for_backward(x, weight, bias, mean, invstd, y)
        return y

    def bwd(ctx, dy):
        x, weight, bias, mean, invstd, y = ctx.saved_tensors
        dx, dw, db, dr = backward(dy, x, weight, bias, mean, invstd, "relu", output=y)
        return dx, dr, dw, db, None

    return function_class(name, fwd, bwd, once=True)
