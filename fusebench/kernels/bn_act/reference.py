"""BN(train) + act: the float64 reference the tests hold every impl to, and the aten sequence
eager runs (the baseline `fusebench kernel bn_act` measures against)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.registry import register_impl

# activation name -> the float64 / aten function (what every impl's `act` argument names)
ACTS = {"silu": F.silu, "relu": F.relu, "gelu": F.gelu,
        "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"), "identity": lambda z: z,
        "relu6": F.relu6, "hardswish": F.hardswish}


def bn_act_reference(x, weight, bias, eps: float, act: str = "silu",
                     running_mean=None, running_var=None, momentum: float = 0.1,
                     residual=None):
    """float64: y = act((x - mean) / sqrt(var + eps) * w + b [+ residual]) with the batch's
    biased variance (a residual block's `act(bn(x) + identity)` when residual is given);
    running stats (when given, updated in place) as nn.BatchNorm2d does: unbiased variance."""
    xd = x.double()
    mean = xd.mean((0, 2, 3))
    var = (xd - mean[:, None, None]).pow(2).mean((0, 2, 3))
    if running_mean is not None:
        n = x.numel() // x.shape[1]
        with torch.no_grad():
            running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
            running_var.mul_(1 - momentum).add_(momentum * (var * n / (n - 1))
                                                .to(running_var.dtype))
    z = (xd - mean[:, None, None]) * torch.rsqrt(var + eps)[:, None, None]
    z = z * weight.double()[:, None, None] + bias.double()[:, None, None]
    return ACTS[act](z if residual is None else z + residual.double())


@register_impl("bn_add_act", "aten")
def bn_add_act_aten(x, residual, weight, bias, eps: float):
    """F.batch_norm (training statistics), + residual, then F.relu: a ResNet block's end as
    eager runs it (saves x, and ReLU's output)."""
    return F.relu(F.batch_norm(x, None, None, weight, bias, True, 0.0, eps) + residual)


@register_impl("bn_act", "aten")
def bn_act_aten(x, weight, bias, eps: float):
    """F.batch_norm (training statistics) then F.silu: what eager runs (saves x and the BN
    output)."""
    return F.silu(F.batch_norm(x, None, None, weight, bias, True, 0.0, eps))
