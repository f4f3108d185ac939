"""Optional arguments of a traced forward (fuse/fx/specialise.py): fx traces a default of None
as a Proxy, which `is not None`, so nanoGPT's `forward(idx, targets=None)` used to trace its
loss branch and crash when called without targets, and `c = x if context is None else
context` called `k(None)`; a flag default (`if return_features:`) stopped the trace. Now the
defaults' branch is traced, the Proxy graph is kept for calls that pass the argument, each call
goes to the graph traced for it, and a call that fits neither runs the module's own forward
with a warning."""
from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse

sys.path.insert(0, str(Path(__file__).parent))
from assets import nano_gpt  # noqa: E402


class WithTargets(nano_gpt.GPT):
    """nanoGPT's own signature: logits and, given targets, the loss."""

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        if targets is not None:
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, None


class Features(nn.Module):
    """A flag default a forward branches on, and a mask passed through untouched."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, mask=None, return_features=False):
        h = F.gelu(self.fc1(x))
        y = self.fc2(h)
        y = F.scaled_dot_product_attention(y[:, None], y[:, None], y[:, None],
                                           attn_mask=mask)[:, 0]
        return (y, h) if return_features else y


def _ids():
    return torch.randint(0, nano_gpt.VOCAB, (2, nano_gpt.CONTEXT),
                         generator=torch.Generator().manual_seed(1))


def test_a_none_default_the_forward_branches_on_gets_a_graph_per_branch(site_calls):
    """nanoGPT's `forward(idx, targets=None)`: without targets the logits graph, with them
    the loss graph; both fused, both equal to eager in float64, gradients included."""
    torch.manual_seed(0)
    model = WithTargets().double()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"attention": 2, "mlp": 2}   # counted once
    idx = _ids()
    logits, loss = model(idx)                       # the defaults' graph: no loss
    assert loss is None
    torch.testing.assert_close(logits, ref(idx)[0])
    assert site_calls == {"fused_attention": 2, "fused_mlp": 2}
    site_calls.clear()
    got, want = model(idx, targets=idx), ref(idx, targets=idx)
    assert site_calls == {"fused_attention": 2, "fused_mlp": 2}    # the loss graph, fused
    torch.testing.assert_close(got[1], want[1])
    got[1].backward()
    want[1].backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)


class CrossOrSelf(nn.Module):
    """Stable Diffusion's attention: keys and values from the context, or from x without one.
    No op differs between the two traces, only what k and v read."""

    def __init__(self, dim=16):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x, context=None):
        c = x if context is None else context
        x = x + F.scaled_dot_product_attention(self.q(x), self.k(c), self.v(c))
        return x + self.fc2(F.gelu(self.fc1(x)))


def test_an_argument_that_only_changes_what_an_op_reads_is_a_branch_too(site_calls):
    torch.manual_seed(0)
    model = CrossOrSelf().double()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mlp": 1}
    x, ctx = (torch.randn(2, n, 16, dtype=torch.float64) for n in (5, 7))
    torch.testing.assert_close(model(x), ref(x))        # crashed: k(None)
    torch.testing.assert_close(model(x, ctx), ref(x, ctx))
    torch.testing.assert_close(model(x, context=ctx), ref(x, context=ctx))
    assert site_calls == {"fused_mlp": 3}


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, bias=None, scale=None):
        y = self.fc2(F.gelu(self.fc1(x)))
        y = y if bias is None else y + bias
        return y if scale is None else y * scale


def test_each_mix_of_branching_arguments_gets_its_graph(site_calls):
    """Two branching arguments: a graph with both None (counted), and one for each mix of
    them passed; every call runs fused and equals eager."""
    model = TwoBranches().double()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mlp": 1}
    x, b, s = (torch.randn(3, 8, dtype=torch.float64) for _ in range(3))
    for kwargs in ({}, {"bias": b}, {"scale": s}, {"bias": b, "scale": s}):
        torch.testing.assert_close(model(x, **kwargs), ref(x, **kwargs))
    torch.testing.assert_close(model(x, b, s), ref(x, b, s))
    assert site_calls == {"fused_mlp": 5}


class Stem(nn.Module):
    """Inference: a conv into timm's BatchNormAct2d (F.batch_norm in its forward), in a root
    whose forward branches on an optional argument, so its graph has two variants. The fold
    swaps the conv for a folded one in the module tree both run: each must drop the BN once
    (each variant's graph module holds the original conv, so each folds from it)."""

    def __init__(self):
        super().__init__()
        from assets.timm_efficientnet import BatchNormAct2d
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1, bias=False), BatchNormAct2d(8)

    def forward(self, x, extra=None):
        y = self.bn(self.conv(x))
        return y if extra is None else y + extra


def test_a_fold_applies_to_every_variant_once():
    torch.manual_seed(0)
    model = Stem().double()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    ref = copy.deepcopy(model)
    res = fuse(model, "infer")                   # on a copy: res.model
    assert res.sites["conv_bn_fold"] == 1
    model = res.model
    x = torch.randn(2, 3, 6, 6, dtype=torch.float64)
    e = torch.randn(2, 8, 6, 6, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))
        torch.testing.assert_close(model(x, e), ref(x, e))


def test_a_flag_default_now_traces_and_a_passed_mask_stays_an_argument(site_calls):
    """`return_features` stopped the trace (a Proxy has no truth value): now fixed to False.
    `mask` flows into SDPA without a branch: it stays a graph input, so a mask passed at
    call time runs the fused graph too."""
    torch.manual_seed(0)
    model = Features().double()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert dict(res.sites) == {"mlp": 1}
    assert not [m for k, m in res.notes if k == "fx_fallback"], res.notes
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(model(x), ref(x))
        torch.testing.assert_close(model(x, mask), ref(x, mask))
        torch.testing.assert_close(model(x, mask=mask), ref(x, mask=mask))
    assert site_calls == {"fused_mlp": 3}
    with pytest.warns(UserWarning, match=r"return_features=False; called with other values "
                                         r"\(return_features\)"):
        y, h = model(x, return_features=True)
    torch.testing.assert_close(h, ref(x, return_features=True)[1])
    assert site_calls == {"fused_mlp": 3}


class Kwargs(nn.Module):
    """HF's way: named optional arguments beside **kwargs (`attention_mask=None, **kwargs`).
    A **kwargs used to turn the fixing off, so the Proxy graph took `x * scale` and a call
    without a scale crashed."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, scale=None, **kwargs):
        y = self.fc2(F.gelu(self.fc1(x)))
        return y if scale is None else y * scale


def test_a_forward_with_kwargs_gets_its_graphs_too(site_calls):
    model = Kwargs().double()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x, s = (torch.randn(3, 8, dtype=torch.float64) for _ in range(2))
    for args, kwargs in (((x,), {}), ((x, s), {}), ((x,), {"scale": s}),
                         ((x,), {"scale": None, "output_attentions": False}),
                         ((x, s), {"use_cache": True})):
        torch.testing.assert_close(model(*args, **kwargs), ref(*args, **kwargs))
    assert site_calls == {"fused_mlp": 5}
