"""GroupNorm + act: the float64 reference the tests hold every impl to, and the aten sequence
eager runs (the baseline `fusebench kernel gn_act` measures against)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusebench.kernels.bn_act.reference import ACTS
from fusebench.kernels.registry import register_impl


def gn_act_reference(x, weight, bias, groups: int, eps: float, act: str = "silu"):
    """float64: y = act((x - mean_g) / sqrt(var_g + eps) * w + b), statistics per (sample,
    group of C / groups channels), biased variance."""
    xd = x.double()
    N, C = x.shape[:2]
    xg = xd.reshape(N, int(groups), -1)
    mean = xg.mean(-1, keepdim=True)
    var = (xg - mean).pow(2).mean(-1, keepdim=True)
    z = ((xg - mean) * torch.rsqrt(var + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.dim() - 2)
    return ACTS[act](z * weight.double().reshape(shape) + bias.double().reshape(shape))


@register_impl("gn_act", "aten")
def gn_act_aten(x, weight, bias, groups, eps: float):
    """F.group_norm then F.silu: what eager runs (saves x and the GroupNorm output)."""
    return F.silu(F.group_norm(x, int(groups), weight, bias, eps))
