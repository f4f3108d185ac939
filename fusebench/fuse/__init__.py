"""The fuser: rewrites a model into fusebench's multi-op kernels, one registered fusion at a time.
The only package that knows both models and kernels.

  engine.py    MultiOpKernel / MultiOpFunction: several basic ops in one autograd.Function
  binding.py   which kernel impl each op calls (PREFERRED per device, fallbacks), bound once
  rule.py      Fusion, register_fusion, FuseContext, the FusedModule marker base
  fusions/     one file per fusion: its rewrite, its fused module, its kernel
  walk.py      the model walk: fuse_in_order, unfused_leaves

ORDER below is the order fusions are tried in (TransformerEngine's `ops/fused/__init__.py`
idea; a module a fusion replaced is not visited again): se_gate and bn_silu come before silu_me
because they match on the nn.SiLU inside their block, which silu_me would otherwise replace
first. Adding a fusion = one file in fusions/ plus its name here."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.fusions import (bn_silu, conv_bn_fold, conv_bn_fold_seq, dwconv,  # noqa: F401
                                    ln2d, mlp_bias_gelu, se_gate, silu_me)
from fusebench.fuse.rule import FUSIONS, FusedModule, Fusion, register_fusion
from fusebench.fuse.walk import FuseResult, fuse_in_order, unfused_leaves

ORDER: tuple[str, ...] = ("conv_bn_fold", "conv_bn_fold_seq", "se_gate", "bn_silu", "silu_me",
                          "mlp_bias_gelu", "dwconv", "ln2d")
assert set(ORDER) == set(FUSIONS.names()), "every bundled fusion is listed in ORDER once"


def fuse(model: nn.Module, bench: str = "train", device: str = "cpu",
         only: list[str] | None = None, impls: dict[str, str] | None = None) -> FuseResult:
    """Apply every fusion for `bench`, in ORDER, then any a plugin registered (by name); or only
    those named in `only`. `impls` overrides binding.PREFERRED per act family, e.g.
    {"se_gate": "function"}."""
    order = [*ORDER, *(n for n in FUSIONS.names() if n not in ORDER)]
    order = [n for n in order if only is None or n in only]
    return fuse_in_order(model, order, bench, device, impls)


__all__ = ["FUSIONS", "ORDER", "FuseResult", "FusedModule", "Fusion", "fuse", "fuse_in_order",
           "register_fusion", "unfused_leaves"]
