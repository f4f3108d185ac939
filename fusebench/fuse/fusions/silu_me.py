"""silu_me: nn.SiLU -> the memory-efficient SiLU of kernels.silu (saves its input only)."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.rule import FuseContext, FusedModule, register_fusion
from fusebench.kernels.silu import SiLUMemEff


class MemoryEfficientSiLU(SiLUMemEff, FusedModule):
    """kernels.silu's SiLUMemEff (saves its input only), marked as the fuser's product."""
    fusion = "silu_me"


@register_fusion("silu_me", nn.SiLU)
def silu(m: nn.SiLU, ctx: FuseContext):
    """nn.SiLU -> memory-efficient SiLU (saves its input only)."""
    return MemoryEfficientSiLU(impl=ctx.act("silu").impl)
