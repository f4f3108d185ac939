"""Bias + GELU: y = gelu(x + bias[None, :, None, None]), saving only x (and the bias).

Four layers: bias_gelu_fwd / bias_gelu_bwd -> BiasGELUFunction -> bias_gelu -> BiasGELU.
backward: v = x + b recomputed, dx = dy * gelu'(v), dbias = sum over N, H, W of dx.
`approximate` is "none" (exact erf GELU, nn.GELU's default) or "tanh"."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.checks import GELU_APPROXIMATE, check_bias_gelu
from fusebench.kernels.registry import get_impl, register_impl

APPROXIMATE = GELU_APPROXIMATE


def _bc(bias: torch.Tensor) -> torch.Tensor:
    return bias[None, :, None, None]                            # (1, C, 1, 1)


def bias_gelu_reference(x, bias, approximate: str = "none"):
    """float64 ground truth."""
    return F.gelu(x.double() + _bc(bias.double()), approximate=approximate)


def bias_gelu_fwd(x, bias, approximate: str = "none"):
    return F.gelu(x + _bc(bias), approximate=approximate)


def bias_gelu_bwd(dy, x, bias, approximate: str = "none", want_y: bool = False):
    """(dx, dbias) from the saved x and bias; want_y: (dx, dbias, gelu(x + bias)) as well, the
    recomputed output a consumer's weight gradient needs (one x + bias for both)."""
    v = x + _bc(bias)
    dx = torch.ops.aten.gelu_backward(dy, v, approximate=approximate)
    db = dx.sum((0, 2, 3), dtype=torch.float32 if dx.dtype != torch.float64 else None)
    if want_y:
        return dx, db.to(bias.dtype), F.gelu(v, approximate=approximate)
    return dx, db.to(bias.dtype)


class BiasGELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        return bias_gelu_fwd(x, bias, approximate)

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, db = bias_gelu_bwd(dy, x, bias, ctx.approximate)
        return dx, db, None


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias[c]) that saves only x and bias for backward."""
    check_bias_gelu(x, bias, approximate)
    return BiasGELUFunction.apply(x, bias, approximate)


class BiasGELU(nn.Module):
    """gelu(x + bias) with the bias *shared*, not copied: pass the conv's bias Parameter.

    Use on a ConvMlp-style block (fc1 -> GELU -> fc2):
        bg = BiasGELU(mlp.fc1.bias, approximate=mlp.act.approximate)
        mlp.fc1.bias = None          # fc1 now computes x only; the Parameter lives on in bg
        mlp.act = bg
    `bg.bias is` the original Parameter object, so optimizers, state_dict loading into the
    original tensor, FSDP flattening and weight tying see one parameter. `impl` picks a
    registered "bias_gelu" impl."""

    def __init__(self, bias: nn.Parameter, approximate: str = "none", impl: str = "function"):
        super().__init__()
        if not isinstance(bias, nn.Parameter):
            raise TypeError(f"BiasGELU: bias must be an nn.Parameter (shared with the conv it "
                            f"came from), got {type(bias).__name__}")
        if approximate not in APPROXIMATE:
            raise ValueError(f"BiasGELU: approximate must be 'none' or 'tanh', "
                             f"got {approximate!r}")
        self.bias = bias                                        # same object: registered, shared
        self.approximate = approximate
        self.set_impl(impl)

    def set_impl(self, impl: str) -> None:
        self._fn = get_impl("bias_gelu", impl).fn
        self.impl = impl

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x, self.bias, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"{self.bias.numel()}, approximate={self.approximate!r}, impl={self.impl}"


@register_impl("bias_gelu", "eager")
def bias_gelu_eager(x, bias, approximate: str = "none"):
    """F.gelu(x + bias) in two aten ops: saves the x-sized sum x + bias."""
    return F.gelu(x + _bc(bias), approximate=approximate)


@register_impl("bias_gelu", "function")
def bias_gelu_function(x, bias, approximate: str = "none"):
    """autograd.Function in plain torch ops: saves only x and bias."""
    return bias_gelu(x, bias, approximate)
