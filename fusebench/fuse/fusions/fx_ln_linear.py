"""ln_linear (graph, candidates only): LayerNorm -> Linear (a transformer's pre-norm). No
fusebench kernel computes LayerNorm and a matrix product together, so every such site is a
`not_fused` note saying so, never a silent skip. (The GELU MLP after it is the mlp pattern.)"""
from __future__ import annotations

from fusebench.fuse.fx import nodes as N
from fusebench.fuse.fx.pattern import Miss, register_pattern


@register_pattern("ln_linear", benches=("train", "infer"))
def ln_linear(n, scope):
    """LayerNorm -> Linear: reported, not fused (no LayerNorm+Linear kernel here)."""
    ln = N.x_of(n) if N.op(n) == "linear" else None
    if ln is None or N.op(ln) != "layer_norm" or N.is_permute(N.x_of(ln), (0, 2, 3, 1)):
        return None
    return Miss("ln_linear", "no fused LayerNorm+Linear kernel in fusebench; aten runs both")
