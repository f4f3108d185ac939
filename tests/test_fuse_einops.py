"""Models written with einops and einsum (tests/assets/einops_models.py): einops calls are one
graph node each (fx/leaves.py), `map(f, x.chunk(3, -1))` iterates its three parts, einsum
products are read as matmuls (fx/products.py), so Stable Diffusion's attention and lucidrains'
ViT get their attention, GEGLU and MLP sites, forward and gradients equal to float64 eager."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import einops
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.fx as fx

from fusebench.fuse import fuse
from fusebench.fuse.fx.products import product

sys.path.insert(0, str(Path(__file__).parent))
from assets import einops_models as E  # noqa: E402

# equation -> b_rows (a @ b^T) / False (a @ b) / None (not a matrix product)
EQUATIONS = {
    "b i d, b j d -> b i j": True, "bhid,bhjd->bhij": True, "...id,...jd->...ij": True,
    "b i j, b j d -> b i d": False, "bhij,bhjd->bhid": False, "ik,kj->ij": False,
    "bhid,bhjd->bhji": None,        # the output transposed
    "bhid,bhjd->bij": None,         # a sum over heads
    "bid,bjd->bij d": None,         # no contraction
    "bhid,hbjd->bhij": None,        # leading axes in another order
    "bij,bjk": None,                # no output given
    "bii,bid->bid": None,           # a diagonal
}


def _tensors(eq: str):
    lhs = eq.replace(" ", "").split("->")[0].split(",")
    size = {"b": 2, "h": 3, "i": 4, "j": 5, "d": 6, "k": 7}
    return [torch.randn(*[size[c] for c in side if c != "."], dtype=torch.float64)
            for side in lhs]


def _einsum_node(fn, *args):
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    def value(x):
        if isinstance(x, list):
            return [value(y) for y in x]
        return {"A": a, "B": b}.get(x, x)
    return g.call_function(fn, tuple(value(x) for x in args))


@pytest.mark.parametrize("eq", list(EQUATIONS))
def test_an_einsum_is_read_as_the_product_it_computes(eq):
    """Read as torch.einsum(eq, a, b), torch.einsum(eq, [a, b]) and einops.einsum(a, b, eq)
    (word axes); where it is a product, that product equals the einsum."""
    want = EQUATIONS[eq]
    for node in (_einsum_node(torch.einsum, eq, "A", "B"),
                 _einsum_node(torch.einsum, eq, ["A", "B"])):
        got = product(node)
        assert (got.b_rows if got else None) is want
    if "." not in eq:
        words = " ".join(eq.replace(" ", "")).replace(" , ", ", ").replace("- >", "->")
        got = product(_einsum_node(einops.einsum, "A", "B", words))
        assert (got.b_rows if got else None) is want, words
    if want is not None:
        a, b = _tensors(eq)
        torch.testing.assert_close(a @ (b.transpose(-2, -1) if want else b),
                                   torch.einsum(eq, a, b))


def _compare(model, *inputs):
    """float64 forward and every parameter's gradient against an untouched copy."""
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    y, want = model(*inputs), ref(*inputs)
    torch.testing.assert_close(y, want)
    y.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    return res


def _no_fallback(res):
    assert not [m for k, m in res.notes if k == "fx_fallback"], res.notes


def test_stable_diffusions_spatial_transformer_fuses_its_einsum_attention(site_calls):
    torch.manual_seed(0)
    model = E.SpatialTransformer().double()
    x = torch.randn(2, 32, 4, 4, dtype=torch.float64)
    context = torch.randn(2, 5, 24, dtype=torch.float64)
    res = _compare(model, x, context)
    _no_fallback(res)
    assert res.sites["attention"] == 2 and res.sites["glu_mlp"] == 1, res.sites
    assert site_calls["fused_attention"] == 2 and site_calls["fused_glu_mlp"] == 1


def test_without_a_context_the_same_model_attends_to_itself(site_calls):
    """forward(x, context=None): the defaults' graph (keys from x) and the context's graph."""
    torch.manual_seed(0)
    model = E.SpatialTransformer(context_dim=None).double()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = torch.randn(2, 32, 4, 4, dtype=torch.float64)
    other = torch.randn(2, 7, 32, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x))
    torch.testing.assert_close(model(x, other), ref(x, other))
    assert site_calls["fused_attention"] == 4


def test_sds_mask_branch_traces_and_its_call_runs_fused(site_calls):
    """CrossAttention alone: `masked_fill(~mask, -torch.finfo(sim.dtype).max)` under `if mask
    is not None` stopped the trace (a traced dtype was no dtype: mask was fixed to None and a
    call with a mask ran the module's own forward). fx/shims.py reads the dtype's limit at
    run time, and the attention site takes that fill as a mask: every mix is a fused graph."""
    torch.manual_seed(0)
    model = E.CrossAttention(16, 16).double()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["attention"] == 1
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    c = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.rand(2, 5) > 0.3
    mask[:, 0] = True                           # every row keeps a key (else eager NaN)
    for args in ((x,), (x, c), (x, c, mask)):
        torch.testing.assert_close(model(*args), ref(*args))
    assert site_calls["fused_attention"] == 3


class MaskAny(nn.Module):
    """A mask branch fx cannot trace (`mask.any()`: a traced truth value) beside an optional
    context: mask is fixed to None alone, context keeps a graph each way."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x, context=None, mask=None):
        context = x if context is None else context
        h = self.fc2(F.gelu(self.fc1(context)))
        if mask is not None and mask.any():
            h = h.masked_fill(~mask[..., None], 0.0)
        return h


def test_a_mask_branch_that_cannot_trace_leaves_the_other_arguments_their_graphs(site_calls):
    torch.manual_seed(0)
    model = MaskAny().double()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["mlp"] == 1
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    c = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x))
    torch.testing.assert_close(model(x, context=c), ref(x, context=c))
    assert site_calls["fused_mlp"] == 2
    mask = torch.rand(2, 5) > 0.3
    with pytest.warns(UserWarning, match=r"traced for mask=None, context=None or mask=None, "
                                         r"context=<given>; called with other values \(mask\)"):
        torch.testing.assert_close(model(x, c, mask), ref(x, c, mask))
    assert site_calls["fused_mlp"] == 2


def test_lucidrains_vit_fuses_after_rearrange_and_a_mapped_chunk(site_calls):
    torch.manual_seed(0)
    model = E.ViT().double()
    res = _compare(model, torch.randn(2, 3, 16, 16, dtype=torch.float64))
    _no_fallback(res)
    assert res.sites["attention"] == 2 and res.sites["mlp"] == 2, res.sites
    assert site_calls["fused_attention"] == 2 and site_calls["fused_mlp"] == 2


@pytest.mark.slow
def test_the_benchmark_runs_at_a_tiny_size(capsys):
    from tests.helpers import load_benchmark
    bench = load_benchmark("einops_models")
    assert bench.main(["--size", "tiny", "--rounds", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("eager/fused") == 2 and out.count("eager/no attention site") == 2, out
    assert "SpatialTransformer, b2, 4x4 latent (16 tokens) (sites {" in out, out
    assert "'attention': 2" in out and "ViT, b2 (sites {'attention': 1, 'mlp': 1" in out, out
