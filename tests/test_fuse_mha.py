"""The `mha` graph site: nn.MultiheadAttention as self-attention without its layout copies
(fuse/fusions/fx_mha.py). Every mask MultiheadAttention takes (key padding, 2-D and 3-D
attn_mask, bool or float, the causal hint), both layouts, with and without biases: forward
and gradients equal to float64 eager, the same attention-dropout draws from one seed, the site
really called; what it does not take is a reason."""
from __future__ import annotations

import copy

import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fusebench.fuse import fuse
from fusebench.fuse.fx.pattern import Site

sys.path.insert(0, str(Path(__file__).parent))
from assets import tv_vit  # noqa: E402

B, T, E, H = 3, 7, 16, 4


class Attend(nn.Module):
    """x + attn(x, x, x, ...)[0], spelled `[0]` or unpacked as `out, _ = ...`."""

    def __init__(self, unpack=False, dropout=0.0, batch_first=True, bias=True,
                 need_weights=False, **mha):
        super().__init__()
        self.unpack, self.need_weights = unpack, need_weights
        self.attn = nn.MultiheadAttention(E, H, dropout=dropout, batch_first=batch_first,
                                          bias=bias, **mha)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, attn_mask=None, key_padding_mask=None, is_causal=False):
        if self.unpack:
            out, _ = self.attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                               need_weights=self.need_weights, is_causal=is_causal)
        else:
            out = self.attn(x, x, x, key_padding_mask, self.need_weights, attn_mask,
                            is_causal=is_causal)[0]
        return x + self.drop(out)


def _x(batch_first=True):
    x = torch.randn(B, T, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x if batch_first else x.transpose(0, 1).contiguous()


def _masks(kind: str) -> dict:
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, T - 2:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
    per_head = torch.randn(B * H, T, T, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(2))
    return {"none": {}, "padding": dict(key_padding_mask=pad),
            "float_padding": dict(key_padding_mask=torch.zeros(B, T, dtype=torch.float64)
                                  .masked_fill(pad, float("-inf"))),
            "bool_2d": dict(attn_mask=torch.ones(T, T, dtype=torch.bool).triu(1)),
            "causal_hint": dict(attn_mask=causal, is_causal=True),
            "causal_and_padding": dict(attn_mask=causal, key_padding_mask=pad,
                                       is_causal=True),
            "per_head_3d": dict(attn_mask=per_head, key_padding_mask=pad)}[kind]


@pytest.fixture
def calls(monkeypatch):
    n = {"fused_mha": 0}
    real = Site.__call__

    def counted(self, *args):
        n[self.__name__] = n.get(self.__name__, 0) + 1
        return real(self, *args)
    monkeypatch.setattr(Site, "__call__", counted)
    return n


def _same(model, ref, x, kw, seed=3):
    outs = []
    for m in (model, ref):
        torch.manual_seed(seed)
        y = m(x, **kw)
        y.square().mean().backward()
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1], atol=1e-10, rtol=1e-10)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-10, rtol=1e-10, msg=n)


@pytest.mark.parametrize("mask", ["none", "padding", "float_padding", "bool_2d", "causal_hint",
                                  "causal_and_padding", "per_head_3d"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["p0", "p0.2"])
def test_self_attention_matches_float64_eager(mask, batch_first, dropout, calls):
    torch.manual_seed(0)
    model = Attend(dropout=dropout, batch_first=batch_first).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mha": 1}, (result.sites, result.notes)
    _same(model, ref, _x(batch_first), _masks(mask))
    assert calls["fused_mha"] == 1


@pytest.mark.parametrize("unpack", [False, True], ids=["[0]", "unpacked"])
@pytest.mark.parametrize("bias", [True, False])
def test_spellings_and_no_bias(unpack, bias, calls, monkeypatch):
    """`out, _ = attn(...)` leaves an unused getitem on the module's call: the site erases it
    too, so MultiheadAttention itself no longer runs (it did, and drew dropout twice)."""
    torch.manual_seed(0)
    model = Attend(unpack=unpack, bias=bias, dropout=0.2).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mha": 1}
    ran = []
    real = nn.MultiheadAttention.forward
    monkeypatch.setattr(nn.MultiheadAttention, "forward",
                        lambda self, *a, **k: ran.append(self) or real(self, *a, **k))
    _same(model, ref, _x(), _masks("padding"))
    assert calls["fused_mha"] == 1 and ran == [ref.attn]


def test_need_weights_without_dropout_fuses_the_same_output(calls):
    """need_weights=True (MultiheadAttention's default) with the weights unused: eager takes
    its explicit softmax path, the site SDPA: the same output within float64 rounding."""
    torch.manual_seed(0)
    model = Attend(need_weights=True).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mha": 1}
    _same(model, ref, _x(), _masks("padding"))


class UsesWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(E, H, batch_first=True)

    def forward(self, x):
        out, w = self.attn(x, x, x)
        return out + w.sum()


S = 5                                   # memory length: cross-attention's keys


class CrossAttend(nn.Module):
    """attn(query, key, value) with the inputs apart: `cross` is a decoder's
    `multihead_attn(x, memory, memory)` (key is value), `detr` DETR's self-attention with
    positions added to q and k only (query is key), `three` all three apart."""

    def __init__(self, form, dropout=0.0, batch_first=True, bias=True):
        super().__init__()
        self.form, self.batch_first = form, batch_first
        self.attn = nn.MultiheadAttention(E, H, dropout=dropout, batch_first=batch_first,
                                          bias=bias)
        self.pos = nn.Parameter(torch.randn(T, E) / 4)

    def forward(self, x, memory, attn_mask=None, key_padding_mask=None):
        pos = self.pos if self.batch_first else self.pos[:, None]
        if self.form == "cross":
            q, k, v = x, memory, memory
        elif self.form == "detr":
            q = k = x + pos
            v = x
        else:
            q, k, v = x + pos, memory * 2, memory
        out = self.attn(q, k, v, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                        need_weights=False)[0]
        return x + out


def _cross_masks(kind: str, form: str) -> dict:
    s = T if form == "detr" else S
    pad = torch.zeros(B, s, dtype=torch.bool)
    pad[1, s - 2:] = True
    return {"none": {}, "padding": dict(key_padding_mask=pad),
            "bool_2d": dict(attn_mask=torch.ones(T, s, dtype=torch.bool).triu(1)),
            "per_head_3d": dict(attn_mask=torch.randn(B * H, T, s, dtype=torch.float64,
                                                      generator=torch.Generator().manual_seed(2)),
                                key_padding_mask=pad)}[kind]


@pytest.mark.parametrize("mask", ["none", "padding", "bool_2d", "per_head_3d"])
@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("form", ["cross", "detr", "three"])
@pytest.mark.parametrize("dropout", [0.0, 0.2], ids=["p0", "p0.2"])
def test_query_key_value_apart_match_float64_eager(form, mask, batch_first, dropout, calls):
    """One projection GEMM per distinct input over its rows of in_proj_weight (memory once
    for k and v; x + pos once for q and k), the same SDPA call and dropout draws."""
    torch.manual_seed(0)
    model = CrossAttend(form, dropout=dropout, batch_first=batch_first).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mha": 1}, (result.sites, result.notes)
    memory = torch.randn(B, S, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    memory = memory if batch_first else memory.transpose(0, 1).contiguous()
    _same(model, ref, _x(batch_first), dict(memory=memory, **_cross_masks(mask, form)))
    assert calls["fused_mha"] == 1


@pytest.mark.parametrize("form, gemms", [("cross", 2), ("detr", 2), ("three", 3)])
def test_one_projection_gemm_per_distinct_input(form, gemms, monkeypatch):
    model = CrossAttend(form, bias=False).train()
    fuse(model, "train")
    seen = []
    real = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: seen.append(w.shape[0]) or real(x, w, b))
    model(_x().float(), torch.randn(B, S, E))
    assert sorted(seen[:-1]) == sorted({"cross": [E, 2 * E], "detr": [2 * E, E],
                                        "three": [E, E, E]}[form]) and len(seen) == gemms + 1


@pytest.mark.parametrize("model, reason", [
    (UsesWeights, "the attention weights are used"),
    (lambda: Attend(dropout=0.1, need_weights=True), "need_weights with attention dropout"),
    (lambda: Attend(kdim=8, vdim=8), "kdim / vdim"),
    (lambda: Attend(add_bias_kv=True), "add_bias_kv")])
def test_what_it_does_not_take_is_a_reason(model, reason):
    m = model().train()
    result = fuse(m, "train")
    assert "mha" not in result.sites
    assert any(c == "not_fused" and m_.startswith("mha:") and reason in m_
               for c, m_ in result.notes), result.notes


def test_the_layout_copies_are_gone():
    """What the site is for: MultiheadAttention's training path copies q / k / v apart and
    SDPA's output back (aten::copy_ / contiguous calls); the site keeps views."""
    torch.manual_seed(0)
    model = Attend().train()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = _x().float()

    def copies(m):
        with torch.profiler.profile() as prof:
            m(x).sum().backward()
        return sum(e.name == "aten::copy_" for e in prof.events())
    assert copies(model) < copies(ref)


def test_eval_is_left_to_multihead_attention():
    """Its fast path in eval is one native op: the infer bench has no mha pattern."""
    result = fuse(Attend().eval(), "infer")
    assert "mha" not in result.sites and not any("mha" in m for _, m in result.notes)


def test_torchvision_vit_with_dropout_everywhere_matches_seeded_eager(calls):
    """torchvision's ViT layout with attention dropout and MLP dropout: both sites per block,
    the same draws from one seed (the unpacked attention output used to leave
    MultiheadAttention running beside the site, drawing its dropout twice)."""
    torch.manual_seed(0)
    model = tv_vit.make(dropout=0.1, attention_dropout=0.1).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mha": 2, "mlp": 2, "patchify": 1}
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outs = []
    for m in (model, ref):
        torch.manual_seed(3)
        outs.append(m(x))
        outs[-1].square().mean().backward()
    torch.testing.assert_close(outs[0], outs[1], atol=1e-10, rtol=1e-10)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-10, rtol=1e-10)
    assert calls["fused_mha"] == 2
