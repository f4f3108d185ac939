"""The `attention` graph pattern: attention written out by hand (tests/assets/
attention_spellings.py: timm, BERT, Meta LLaMA, HF eager, the Annotated Transformer, fairseq,
Whisper; nanoGPT and the tiny GPT in test_fuse_patterns) becomes one SDPA call. Per spelling:
one site, the site really called, SDPA's flash kernel in the autograd graph, forward and
gradients equal to float64 eager in train and infer, float32 close to float64, no (.., T, T)
tensor saved for backward. What does not fit is a `not_fused` reason; input SDPA cannot take
as written at run time is computed as written, with a warning."""
from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from tests.helpers import assert_close_to_float64, assert_matches_eager, autograd_nodes

sys.path.insert(0, str(Path(__file__).parent))
from assets import attention_spellings as A  # noqa: E402

FLASH = "ScaledDotProductFlashAttentionForCpuBackward0"
# the code's softmax runs in float32 (`.float()`, dtype=): a float64 run computes it that way
UP_CAST = {"llama_meta", "hf_eager", "whisper_style"}


def build(cls, dtype=torch.float64, **kw) -> nn.Module:
    torch.manual_seed(0)
    return cls(**kw).to(dtype)


def tokens(dtype=torch.float64, t: int = A.T) -> torch.Tensor:
    """The same values in any dtype (drawn in float64, then cast)."""
    x = torch.randn(2, t, A.DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return x.to(dtype)


def not_fused(res) -> list[str]:
    return [m for k, m in res.notes if k in ("not_fused", "fx_fallback")]


@pytest.mark.parametrize("bench", ["train", "infer"])
@pytest.mark.parametrize("name", sorted(A.SPELLINGS))
def test_spelling_is_one_sdpa_site_equal_to_float64_eager(name, bench, site_calls):
    model = build(A.SPELLINGS[name]).train(bench == "train")
    ref = copy.deepcopy(model)
    res = fuse(model, bench)
    sites = A.SITES.get(name, 1)
    assert dict(res.sites) == {"attention": sites}, (res.sites, res.notes)
    assert not_fused(res) == []
    y = assert_matches_eager(res.model, ref, (tokens(),))
    assert dict(site_calls) == {"fused_attention": sites}
    nodes = {type(n).__name__ for n in autograd_nodes(y)}
    assert (FLASH in nodes) == (name not in UP_CAST), nodes
    assert ("SoftmaxBackward0" in nodes) == (name in UP_CAST)


@pytest.mark.parametrize("name", sorted(A.SPELLINGS))
def test_float32_runs_sdpa_close_to_float64_eager(name, site_calls):
    ref = build(A.SPELLINGS[name])
    model = copy.deepcopy(ref).float()
    assert fuse(model, "train").sites == {"attention": A.SITES.get(name, 1)}
    y = assert_close_to_float64(model, ref, (tokens(torch.float32),), atol=2e-5, rtol=1e-4,
                                grad_tol=1e-4, ref_inputs=(tokens(),))
    assert FLASH in {type(n).__name__ for n in autograd_nodes(y)}


def saved_shapes(model, x) -> list[tuple]:
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return shapes


@pytest.mark.parametrize("name", sorted(A.SPELLINGS))
def test_no_scores_sized_tensor_is_saved(name):
    """Eager keeps (B, [H,] T, T) probabilities for backward; the site keeps none (SDPA keeps
    the mask, which is not per sample or head)."""
    model = build(A.SPELLINGS[name], torch.float32)
    eager = copy.deepcopy(model)
    fuse(model, "train")
    x = tokens(torch.float32)
    def per_head(shapes):
        return [s for s in shapes if s[-2:] == (A.T, A.T) and math.prod(s) >= 2 * A.T ** 2]
    assert per_head(saved_shapes(eager, x)), "eager saves its attention probabilities"
    assert per_head(saved_shapes(model, x)) == []


def test_other_lengths_than_the_traced_one(site_calls):
    """The trace reads shapes at run time: a shorter sequence (a sliced causal mask) runs the
    same site and still equals eager."""
    model = build(A.WhisperStyle, torch.float32)
    ref = copy.deepcopy(model)
    fuse(model, "train")
    for t in (5, A.T):
        torch.testing.assert_close(model(tokens(torch.float32, t)), ref(tokens(torch.float32, t)),
                                   atol=1e-5, rtol=1e-5)
    assert site_calls["fused_attention"] == 2


class Scored(nn.Module):
    """q @ k^T, then `between(s)`, softmax, @ v: each variant below is attention SDPA does not
    compute as written (a reason), or no attention at all."""

    def __init__(self, between, dim=A.DIM):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.between = between
        self.temperature = nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        s = self.between(self, q @ k.transpose(-2, -1))
        return s.softmax(dim=-1) @ v


REASONS = {
    "a learned temperature": (lambda m, s: s * m.temperature,
                              "the scores are scaled by a tensor"),
    "scaled after the mask": (lambda m, s: (s + torch.zeros_like(s[:1])) * 0.25,
                              "the scores are scaled after the mask"),
    "a small fill value": (lambda m, s: s.masked_fill(torch.ones_like(s, dtype=torch.bool)
                                                      .triu(1), -100.0),
                           "masked_fill with a value other than -inf or <= -1e4"),
    "a clamp": (lambda m, s: s.clamp(max=30.0), "`clamp` between q @ k^T and the softmax"),
}


@pytest.mark.parametrize("case", sorted(REASONS))
def test_what_sdpa_does_not_compute_is_a_reason(case):
    between, reason = REASONS[case]
    model = build(Scored, between=between)
    res = fuse(model, "train")
    assert "attention" not in res.sites
    assert any(m.startswith("attention: 1 candidate(s) not fused: " + reason)
               for m in not_fused(res)), res.notes


def test_used_weights_and_live_dropout_are_reasons():
    """The Annotated Transformer's `(out, p_attn)` return keeps the weights; a live attn_drop
    would draw SDPA's own mask (in eval the same module fuses)."""
    res = fuse(build(A.Annotated, returns_weights=True), "train")
    assert "attention" not in res.sites
    assert any("the attention weights are used elsewhere" in m for m in not_fused(res))
    model = build(A.TimmStyle, attn_drop=0.1)
    res = fuse(model, "train")
    assert "attention" not in res.sites
    assert any("a live dropout on the attention weights" in m for m in not_fused(res))
    assert fuse(model.eval(), "infer").sites == {"attention": 1}


def test_a_forward_that_assigns_an_attribute_is_not_traced(site_calls):
    """The Annotated Transformer keeps its weights, `self.attn = p_attn`: a traced graph
    would never make that assignment (and tracing left a Proxy there). The module is an
    fx_fallback with the reason, its attribute as it was, and its forward still sets it."""
    model = build(A.Annotated, keeps_weights=True)
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert "attention" not in res.sites and model.attn is None
    assert any("its forward assigns attn, which a traced graph would not do" in m
               for m in not_fused(res)), res.notes
    torch.testing.assert_close(model(tokens()), ref(tokens()))
    assert isinstance(model.attn, torch.Tensor) and model.attn.shape == (2, A.HEADS, A.T, A.T)


def test_a_softmax_that_is_not_attention_is_no_candidate():
    """Attention pooling (a learned score per token, softmax over tokens, a weighted sum):
    no q @ k^T behind the softmax, so neither a site nor a reason."""
    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.score = nn.Linear(A.DIM, 1)

        def forward(self, x):
            w = self.score(x).transpose(1, 2).softmax(dim=-1)      # (B, 1, T)
            return w @ x

    res = fuse(build(Pool), "train")
    assert "attention" not in res.sites and not_fused(res) == []


class SharedKV(nn.Module):
    """Multi-query attention written with k and v of one head broadcast over q's heads."""

    def __init__(self, dim=A.DIM, heads=A.HEADS):
        super().__init__()
        self.heads, self.d = heads, dim // heads
        self.q, self.kv = nn.Linear(dim, dim), nn.Linear(dim, 2 * self.d)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 1, 2 * self.d).transpose(1, 2).chunk(2, dim=-1)
        return (torch.softmax(q @ k.transpose(-2, -1) * self.d ** -0.5, -1) @ v).sum(1)


def test_input_sdpa_does_not_take_runs_as_written_with_a_warning():
    model = build(SharedKV)
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites == {"attention": 1}
    with pytest.warns(UserWarning, match="batch dims that broadcast against each other; ran "
                                         "the attention as written"):
        assert_matches_eager(model, ref, (tokens(),))


def test_causal_gpt_step_equals_eager_after_an_optimizer_step(site_calls):
    """nanoGPT-like, float32: two SGD steps, the fused model's logits stay eager's."""
    from assets import nano_gpt
    torch.manual_seed(0)
    model = nano_gpt.make()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["attention"] == 2
    idx = torch.randint(0, nano_gpt.VOCAB, (4, nano_gpt.CONTEXT),
                        generator=torch.Generator().manual_seed(2))
    for m in (model, ref):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            m(idx).square().mean().backward()
            opt.step()
    torch.testing.assert_close(model(idx), ref(idx), atol=1e-4, rtol=1e-4)
    assert site_calls["fused_attention"] == 2 * 2 + 2


@pytest.mark.slow
def test_the_benchmark_runs_at_a_tiny_size(capsys):
    from tests.helpers import load_benchmark
    bench = load_benchmark("gpt_attention")
    assert bench.main(["--size", "tiny", "--batch", "2", "--rounds", "2", "--threads", "1",
                       "--contexts", "8,16"]) == 0
    out = capsys.readouterr().out
    assert out.count("eager/site") == 2 and "(B 2, H 4, T 16, D 8)" in out, out
    assert "sites {'attention': 2, 'mlp': 2}" in out and "eager/no attention site" in out, out


class Masked(nn.Module):
    """q @ k^T / sqrt(d) masked by `kind`, softmax, @ v; a (1, 1, N, N) buffer `buf`."""

    def __init__(self, kind, n=A.T + 4, dim=A.DIM, heads=A.HEADS):
        super().__init__()
        self.kind, self.heads, self.d = kind, heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        ones = torch.ones(n, n)
        buf = {"tril_buffer": ones.tril(), "tril_offset": ones.tril(1),
               "triu_buffer": ones.triu(), "corner_1x1": ones.tril(),
               "shifted_corner": ones.tril(),
               "additive_buffer": torch.full((n, n), -math.inf).triu(1)}.get(kind, ones)
        self.register_buffer("buf", buf.view(1, 1, n, n))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, self.d).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
        if self.kind == "full_triu":
            s = s + torch.full((t, t), float("-inf"), device=x.device).triu(1)
        elif self.kind == "additive_buffer":
            s = s + self.buf[:, :, :t, :t]
        elif self.kind == "corner_1x1":                     # masks nothing: broadcast
            s = s.masked_fill(self.buf[:, :, :1, :1] == 0, float("-inf"))
        elif self.kind == "shifted_corner":
            s = s.masked_fill(self.buf[:, :, 1:t + 1, 1:t + 1] == 0, float("-inf"))
        else:
            s = s.masked_fill(self.buf[:, :, :t, :t] == 0, float("-inf"))
        return (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, c)


@pytest.mark.parametrize("kind, causal", [
    ("tril_buffer", True), ("additive_buffer", True), ("full_triu", True),
    ("tril_offset", False), ("triu_buffer", False), ("corner_1x1", False),
    ("shifted_corner", False)])
def test_the_causal_mask_becomes_is_causal(kind, causal, monkeypatch, site_calls):
    """A mask the code builds as the causal pattern (a corner of a tril buffer, a -inf triu
    added, `full(-inf).triu(1)` built in forward) is SDPA's is_causal, no mask passed;
    anything else (another diagonal, the upper triangle, a corner off the top-left, one that
    broadcasts) is passed as the mask. Either way the output and gradients are eager's."""
    from fusebench.fuse.fusions import fx_attention
    calls = []
    real = F.scaled_dot_product_attention

    def recorded(*a, **kw):
        calls.append((kw.get("is_causal"), kw.get("attn_mask") is None))
        return real(*a, **kw)
    monkeypatch.setattr(fx_attention.F, "scaled_dot_product_attention", recorded)
    model = build(Masked, kind=kind)
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites == {"attention": 1}
    assert_matches_eager(model, ref, (tokens(),))
    assert calls == [(causal, causal)]


def _swin(dtype=torch.float64):
    from assets import swin
    torch.manual_seed(0)
    model = swin.SwinStage().to(dtype)
    return model, model.example_inputs(2, "cpu", dtype)


@pytest.mark.parametrize("frozen", [False, True])
def test_swin_window_attention_with_and_without_the_shifted_mask(site_calls, frozen):
    """Official Swin's WindowAttention: the relative position bias an additive mask; in the
    shifted block the mask added through the scores' 5-D view, `(attn.view(B_ // nW, nW,
    heads, N, N) + mask).view(-1, heads, N, N)`, which SDPA takes as a (B_, 1, N, N) mask.
    Both blocks' attentions are sites (each block is traced in parts: window_reverse's
    `int()`). A learned bias takes a gradient, which SDPA's CPU kernels do not give: the site
    runs the written ops, and says so; with the bias table frozen, SDPA's flash kernel."""
    model, inputs = _swin()
    if frozen:
        for blk in model.blocks:
            blk.attn.relative_position_bias_table.requires_grad_(False)
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert res.sites["attention"] == 2 and res.sites["mlp"] == 2, res.sites
    if frozen:
        y, want = model(*inputs), ref(*inputs)
        torch.testing.assert_close(y, want)
        assert sum(type(n).__name__ == FLASH for n in autograd_nodes(y)) == 2
        y.square().mean().backward()
        want.square().mean().backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            if p.requires_grad:
                torch.testing.assert_close(p.grad, q.grad, msg=name)
    else:
        with pytest.warns(UserWarning, match="a mask that takes a gradient"):
            assert_matches_eager(model, ref, inputs)
    assert site_calls["fused_attention"] == 2


def test_swin_inference_runs_sdpa_on_both_masks(site_calls):
    model, inputs = _swin(torch.float32)
    model.eval()
    ref = copy.deepcopy(model)
    res = fuse(model, "infer")
    with torch.no_grad():
        torch.testing.assert_close(res.model(*inputs), ref(*inputs), atol=1e-5, rtol=1e-5)
    assert site_calls["fused_attention"] == 2


def test_a_windowed_mask_sdpa_cannot_take_runs_as_written():
    """An integer mask (eager adds it to float scores): the site runs the code's ops."""
    from assets import swin
    torch.manual_seed(0)
    attn = swin.WindowAttention(swin.DIM, swin.WINDOW, swin.HEADS).double().eval()
    ref = copy.deepcopy(attn)
    res = fuse(attn, "infer")
    n = swin.WINDOW ** 2
    x = torch.randn(8, n, swin.DIM, dtype=torch.float64)
    mask = torch.randint(-100, 1, (4, n, n))
    with torch.no_grad(), pytest.warns(UserWarning, match="a windowed mask that is not float"):
        y = res.model(x, mask=mask)
    torch.testing.assert_close(y, ref(x, mask=mask))


@pytest.mark.slow
def test_the_learned_mask_benchmark_runs_at_a_tiny_size(capsys):
    from tests.helpers import load_benchmark
    bench = load_benchmark("learned_mask")
    assert bench.main(["--rounds", "2", "--batch", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "(B 8, H 3, N 49, D 32)" in out and "sdpa/written" in out, out
