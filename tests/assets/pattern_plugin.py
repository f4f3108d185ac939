"""Test-only plugin: a graph pattern of its own, loaded through FUSEBENCH_PLUGINS. It claims
a global average pool written as `x.mean((2, 3))` and runs the same mean in a named site, so
a run's `fusion` events show that the fused mode's graph pass ran the plugin's pattern."""
import torch

from fusebench.fuse.fx import Hit, Site, register_pattern
from fusebench.fuse.fx import nodes as N

TOY_MEAN = Site("toy_mean", lambda x: torch.mean(x, (2, 3)))


@register_pattern("toy_mean", benches=("train", "infer"))
def toy_mean(n, scope):
    """x.mean((2, 3)) -> the plugin's own site (same numbers)."""
    if not N.is_spatial_mean(n, keepdim=False):
        return None
    return Hit("toy_mean", n, TOY_MEAN, (N.x_of(n),))
