"""The fuser: rewrites a model into fusebench's multi-op kernels, one registered fusion at a time.
The only package that knows both models and kernels.

  engine.py    MultiOpKernel / MultiOpFunction: several basic ops in one autograd.Function
  binding.py   which kernel impl each op calls (PREFERRED per device, fallbacks), bound once
  rule.py      Fusion, register_fusion, FuseContext, the FusedModule marker base
  fusions/     one file per fusion: its rewrite, its fused module, its kernel
  walk.py      the model walk: fuse_in_order, unfused_leaves
  recompute.py a producer's output tagged with how to rebuild it: consumers save less
               (fused mode's `fused_recompute`; off by default: Saving runs with the tags off)
  layout.py    channels-last inside: NCHW image input converted at the call (fused mode)
  fx/          the graph pass: trace the model (per submodule where tracing fails) and match
               what the code computes, in several spellings (fusions/fx_*.py), not class names

ORDER: the module-level rules for fusebench's own classes run first (their fused modules are
leaves to the tracer), then the graph pass (GRAPH_ORDER) on everything else, then the rules on
single modules (silu_me), which skip what a graph site absorbed. dwconv runs first of the
module rules: the depthwise conv sits inside blocks other rules replace (ConvBNAct -> bn_silu),
whose fused modules the walk does not enter; no graph pattern absorbs a depthwise conv in train.

ORDER below is the order fusions are tried in (TransformerEngine's `ops/fused/__init__.py`
idea; a module a fusion replaced is not visited again): se_gate and bn_silu come before silu_me
because they match on the nn.SiLU inside their block, which silu_me would otherwise replace
first. se_project comes after se_gate and bn_train: it matches the MBConv around their fused
modules and keeps them as its children. Adding a fusion = one file in fusions/ plus its name here."""
from __future__ import annotations

import torch.nn as nn

from fusebench.fuse.fusions import (bn_silu, bn_train, conv_bn_fold,  # noqa: F401
                                    fx_attention,
                                    conv_bn_fold_seq, dwconv, fx_bn_act, fx_bn_add_act,
                                    fx_bn_train, fx_conv1x1, fx_fold, fx_glu, fx_gn_act, fx_grn, fx_ln2d,
                                    fx_ln_linear, fx_mha, fx_mlp, fx_patchify, fx_rms_norm,
                                    fx_se,
                                    ln2d, se_gate, se_project, silu_me)
from fusebench.fuse.fx import PATTERNS
from fusebench.fuse.rule import FUSIONS, FusedModule, Fusion, register_fusion
from fusebench.fuse.walk import FuseResult, GraphPass, fuse_in_order, unfused_leaves

ORDER: tuple[str, ...] = ("conv_bn_fold", "conv_bn_fold_seq", "dwconv", "se_gate", "bn_silu",
                          "bn_train", "se_project", "ln2d", "silu_me")
GRAPH_BEFORE = "silu_me"            # the graph pass runs just before this module rule
GRAPH_ORDER: tuple[str, ...] = ("ln2d", "ln2d_expr", "rms_norm", "gn_act", "se_project",
                                "se_gate", "bn_add_act", "bn_act", "glu_mlp", "grn_mlp", "mlp", "mha",
                                "attention",
                                "conv_bn_fold_fx", "ln_linear", "conv1x1", "patchify",
                                "bn_train_fx", "group_norm")
OPT_IN: tuple[str, ...] = ("ln_linear",)   # more work for less memory: reported, fused on request
assert set(ORDER) == set(FUSIONS.names()), "every bundled fusion is listed in ORDER once"
assert set(GRAPH_ORDER) == set(PATTERNS.names()), "every graph pattern is in GRAPH_ORDER once"


def graph_order() -> list[str]:
    """GRAPH_ORDER, with the patterns a plugin registered after it or where `before` says."""
    order = list(GRAPH_ORDER)
    for name in PATTERNS.names():
        if name not in GRAPH_ORDER:
            before = PATTERNS[name].before
            order.insert(order.index(before) if before in order else len(order), name)
    return order


def fuse(model: nn.Module, bench: str = "train", device: str = "cpu",
         only: list[str] | None = None, impls: dict[str, str] | None = None,
         opt_in: tuple[str, ...] = ()) -> FuseResult:
    """Apply every fusion for `bench`, in ORDER with the graph patterns (GRAPH_ORDER) before
    GRAPH_BEFORE, then any a plugin registered (by name); or only those named in `only`
    (fusion or graph pattern names). `impls` overrides binding.PREFERRED per act family, e.g.
    {"se_gate": "function"}. `opt_in` turns on fusions in OPT_IN (off by default: they trade
    time for activation memory; their candidates are `not_fused` notes until then)."""
    order = [*ORDER, *(n for n in FUSIONS.names() if n not in ORDER)]
    order = [n for n in order if only is None or n in only]
    graph = tuple(n for n in graph_order() if only is None or n in only)
    at = order.index(GRAPH_BEFORE) if GRAPH_BEFORE in order else len(order)
    bad = sorted(set(opt_in) - set(OPT_IN))
    if bad:
        raise ValueError(f"opt_in {bad}: only {list(OPT_IN)} are off by default")
    return fuse_in_order(model, [*order[:at], GraphPass(graph), *order[at:]], bench, device,
                         impls, opt_in)


__all__ = ["FUSIONS", "GRAPH_ORDER", "OPT_IN", "ORDER", "PATTERNS", "FuseResult", "FusedModule", "Fusion",
           "GraphPass", "fuse", "graph_order", "fuse_in_order", "register_fusion", "unfused_leaves"]
