"""fuse/patchify.py and the `patchify` graph pattern: convs whose kernel equals their stride as
one GEMM over channels-last patches. The GEMM against float64 (output and every gradient, odd
and left-over sizes, non-square kernels); the site on the patch embeddings of models written
elsewhere; which convs are candidates and why they do not fuse; auto's race per call shape."""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.errors import UsageError
from fusebench.fuse import fuse, patchify
from fusebench.fuse.race import Verdicts

sys.path.insert(0, str(Path(__file__).parent))
from assets import convnext_official, tv_vit  # noqa: E402
from helpers import assert_matches_eager, autograd_nodes  # noqa: E402

CL = torch.channels_last
RAN = "PatchConvFunctionBackward"       # the GEMM's autograd node: the fused path really ran


@pytest.mark.parametrize("n,cin,cout,h,w,k,bias,x_grad", [
    (2, 5, 7, 8, 8, (2, 2), True, True),          # a ConvNeXt downsample
    (2, 3, 6, 16, 12, (4, 4), True, False),       # a stem / patch embedding: x needs no grad
    (1, 4, 3, 9, 11, (2, 2), False, True),        # H, W not multiples of k: the rest dropped
    (2, 3, 5, 12, 12, (3, 2), True, True),        # a non-square kernel
    (3, 8, 8, 4, 4, (4, 4), True, True),          # one patch per image
])
def test_gemm_matches_float64_conv(n, cin, cout, h, w, k, bias, x_grad):
    torch.manual_seed(0)
    x = torch.randn(n, cin, h, w).contiguous(memory_format=CL).requires_grad_(x_grad)
    wt = torch.randn(cout, cin, *k, requires_grad=True)
    b = torch.randn(cout, requires_grad=True) if bias else None
    y = patchify.gemm_conv(x, wt, b)
    ref = [t.detach().double().requires_grad_(t.requires_grad) if t is not None else None
           for t in (x, wt, b)]
    y64 = F.conv2d(*ref, stride=k)
    assert y.shape == y64.shape and y.is_contiguous(memory_format=CL)
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    dy = torch.randn_like(y64)
    y.backward(dy.float())
    y64.backward(dy)
    for got, want in zip((x, wt, b), ref):
        if got is not None and got.requires_grad:
            torch.testing.assert_close(got.grad.double(), want.grad, rtol=1e-4, atol=1e-4)
    kinds = {type(f).__name__ for f in autograd_nodes(y)}
    assert RAN in kinds and "ConvolutionBackward0" not in kinds, kinds


@pytest.mark.parametrize("x_grad", [True, False])
def test_gemm_saves_no_more_than_the_conv(x_grad):
    """The patches where x takes a gradient (x is then not kept), else x itself; never the
    weight's reordered copy (the Parameter is saved, and excluded here as the mode does)."""
    from fusebench.measure.memory import SavedTensorBytes
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, 16).contiguous(memory_format=CL).requires_grad_(x_grad)
    w, b = torch.randn(16, 8, 2, 2, requires_grad=True), torch.randn(16, requires_grad=True)
    saved = {}
    for fn in (patchify.aten_conv, patchify.gemm_conv):
        counter = SavedTensorBytes(exclude=[w, b])
        with counter.track():
            fn(x, w, b)
        saved[fn.__name__] = counter.bytes
    assert saved["gemm_conv"] == saved["aten_conv"] == x.numel() * 4, saved


class PatchNet(nn.Module):
    """A patch embedding, a norm, a 2x2 downsample and a head, as a small hierarchical
    vision model writes them."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 8, 4, stride=4)
        self.norm = nn.BatchNorm2d(8)
        self.down = nn.Conv2d(8, 16, kernel_size=2, stride=2, bias=False)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.down(self.norm(self.embed(x)).relu())
        return self.head(x.mean((2, 3)))


def _image(n=2, hw=32):
    return torch.randn(n, 3, hw, hw, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1)).contiguous(memory_format=CL)


def test_site_runs_the_gemm_and_matches_float64_eager(site_calls):
    torch.manual_seed(0)
    model = PatchNet().double().train()
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    result = fuse(model, "train")
    assert result.sites["patchify"] == 2, result.sites
    assert all(params[n] is p for n, p in model.named_parameters())    # the user's own
    with patchify.using("gemm"):
        y = assert_matches_eager(model, ref, (_image(),))
    assert site_calls["fused_patchify"] == 2
    kinds = {type(f).__name__ for f in autograd_nodes(y)}
    assert RAN in kinds and "ConvolutionBackward0" not in kinds, kinds


@pytest.mark.parametrize("factory,sites", [
    (convnext_official.make, 4),        # the stem (4x4) and three 2x2 downsamples
    (tv_vit.make, 1),                   # conv_proj: the 16x16 patch embedding
])
def test_models_written_elsewhere_get_their_patch_convs_fused(factory, sites, site_calls):
    torch.manual_seed(0)
    model = factory().double().train()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["patchify"] == sites
    with patchify.using("gemm"):
        y = assert_matches_eager(model, ref, (_image(),))
    assert site_calls["fused_patchify"] == sites
    assert RAN in {type(f).__name__ for f in autograd_nodes(y)}


@pytest.mark.parametrize("conv,reason", [
    (nn.Conv2d(4, 4, 2, stride=2, groups=2), "2 groups"),
    (nn.Conv2d(4, 4, 2, stride=2, padding=1), "padding (1, 1)"),
    (nn.Conv2d(4, 4, 2, stride=2, dilation=2), "dilation (2, 2)"),
])
def test_a_kernel_equal_stride_conv_that_is_no_patch_gemm_says_why(conv, reason):
    result = fuse(nn.Sequential(conv), "train")
    assert "patchify" not in result.sites
    assert any(k == "not_fused" and "patchify" in m and reason in m
               for k, m in result.notes), result.notes


@pytest.mark.parametrize("conv", [nn.Conv2d(4, 4, 3, stride=2), nn.Conv2d(4, 4, 1),
                                  nn.Conv2d(4, 4, 2, stride=1)])
def test_other_convs_are_not_candidates(conv):
    result = fuse(nn.Sequential(conv, nn.Tanh()), "train")
    assert "patchify" not in result.sites
    assert not any("patchify" in m for _, m in result.notes), result.notes


def test_inference_keeps_the_conv():
    assert "patchify" not in fuse(PatchNet().eval(), "infer").sites


def _operands(x_grad=True):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 8, 8).contiguous(memory_format=CL).requires_grad_(x_grad)
    return x, torch.randn(4, 6, 2, 2, requires_grad=True), torch.randn(4, requires_grad=True)


def test_auto_races_once_per_call_shape_and_keeps_the_faster(monkeypatch):
    """The race with real clocks: the GEMM side made 20 ms slower (far above either side's
    time at this size) loses; then aten's conv made slower loses. The verdict is kept per
    shape; the race leaves the model's gradients alone."""
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    real = patchify._forward
    monkeypatch.setattr(patchify, "_forward", lambda *a: (time.sleep(0.02), real(*a))[1])
    x, w, b = _operands()
    patchify.conv(x, w, b)
    assert patchify.raced() == {"conv": 1} and w.grad is None
    monkeypatch.setattr(patchify, "_forward", real)
    patchify.conv(x, w, b)                                  # same shape: no new race
    assert sum(patchify.raced().values()) == 1
    conv = patchify.aten_conv
    monkeypatch.setattr(patchify, "aten_conv", lambda *a: (time.sleep(0.02), conv(*a))[1])
    x2 = torch.randn(2, 6, 12, 12).contiguous(memory_format=CL).requires_grad_()
    y = patchify.conv(x2, w, b)
    assert patchify.raced() == {"conv": 1, "gemm": 1}
    assert RAN in {type(f).__name__ for f in autograd_nodes(y)}
    assert patchify.describe_raced() == ("patchify: auto raced 2 conv shapes: the GEMM "
                                         "faster at 1, aten's conv faster at 1")


def test_the_race_records_nothing_for_autograd():
    """The race calls each side's passes without autograd: no tensor goes through the
    caller's saved-tensor hooks (an activation checkpoint's would recompute its region)."""
    x, w, b = _operands()
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        assert patchify._race(x, w, b, (True, True, True)) in ("gemm", "conv")
    assert packed == [] and w.grad is None and x.grad is None


def test_a_race_inside_an_activation_checkpoint(monkeypatch):
    from torch.utils.checkpoint import checkpoint
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    x, w, b = _operands()
    checkpoint(patchify.conv, x, w, b, use_reentrant=False).square().sum().backward()
    got = [t.grad for t in (x, w, b)]
    assert sum(patchify.raced().values()) == 1
    for t in (x, w, b):
        t.grad = None
    patchify.aten_conv(x, w, b).square().sum().backward()
    for g, t in zip(got, (x, w, b)):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-4)


def test_no_race_without_autograd_nchw_or_a_named_choice(monkeypatch):
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    x, w, b = _operands()
    with torch.no_grad():
        y = patchify.conv(x, w, b)                      # a forward alone keeps the conv
    patchify.conv(_operands(x_grad=False)[0].detach(), w.detach(), None)
    nchw = patchify.conv(x.contiguous(), w, b)          # NCHW: aten's conv
    assert "ConvolutionBackward0" in {type(f).__name__ for f in autograd_nodes(nchw)}
    for name in ("gemm", "conv"):
        with patchify.using(name):
            patchify.conv(x, w, b)
    assert patchify._raced == {} and patchify.describe_raced() is None
    torch.testing.assert_close(y, F.conv2d(x, w, b, stride=2))


@pytest.mark.parametrize("name", patchify.CHOICES)
def test_autocast_keeps_the_conv_as_autocast_casts_it(name, monkeypatch):
    """bf16 autocast: aten's conv, cast as in eager (the Function's backward would mix dtypes)."""
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    x, w, b = _operands()
    with patchify.using(name), torch.autocast("cpu", torch.bfloat16):
        y = patchify.conv(x, w, b)
    y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
    assert type(y.grad_fn).__name__ == "ConvolutionBackward0" and patchify._raced == {}


def test_an_unknown_choice_is_a_usage_error():
    with pytest.raises(UsageError, match="valid: auto, gemm, conv"):
        with patchify.using("fast"):
            pass


def test_the_fused_mode_reports_what_the_race_chose(monkeypatch):
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    torch.manual_seed(0)
    mode, events = get_mode("fused"), EventLog()
    x = _image().float()
    call = mode.prepare(PatchNet().train(), (x,), {"bench": "train"}, events)
    assert any(e.message == "patchify: 2 sites" for e in events.events())
    call(x).square().mean().backward()
    mode.finish(events)
    won = patchify.raced()
    assert sum(won.values()) >= 2           # the stem and the downsample, raced once each
    sides = [f"{label} faster at {won[side]}"
             for side, label in (("gemm", "the GEMM"), ("conv", "aten's conv")) if won[side]]
    assert any(e.message == f"patchify: auto raced {sum(won.values())} conv shapes: "
               + ", ".join(sides) for e in events.events()), [e.message for e in events.events()]
