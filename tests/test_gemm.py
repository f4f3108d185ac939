"""fuse/gemm.py: every registered backend's GEMMs against float64; oneDNN really runs where it
is picked (its op in the profile) and aten where it is not; auto races the two per call shape
and keeps the faster; the choice is a usage error when unknown or unavailable; the fused mode
reports it and takes --fused-gemm."""
from __future__ import annotations

import copy
import dataclasses
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from fusebench.errors import UsageError
from fusebench.fuse import gemm, patchify
from fusebench.fuse import fuse
from fusebench.fuse.conv1x1 import conv1x1
from fusebench.fuse.race import Verdicts
from fusebench.measure import correctness as corr

sys.path.insert(0, str(Path(__file__).parent))
from assets import convnext_official, nano_gpt, tv_efficientnet  # noqa: E402

AVAILABLE = [n for n, b in gemm.GEMMS.items() if b.missing() is None]
ONEDNN_OP = "mkldnn::_linear_pointwise"


def _ops(fn) -> set[str]:
    with profile() as p:
        fn()
    return {e.key for e in p.key_averages()}


def _close(got, want):
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


@pytest.fixture
def race_says(monkeypatch):
    """Fix auto's verdict for every call shape (tiny shapes time in noise): race_says("onednn")
    or ("aten"), through RACE_MARGIN as the real race reads it; earlier verdicts forgotten."""
    def say(winner: str):
        monkeypatch.setattr(gemm, "_raced", Verdicts())
        monkeypatch.setattr(gemm, "RACE_MARGIN", -1e9 if winner == "onednn" else 1.0)
    return say


@pytest.mark.parametrize("name", AVAILABLE)
@pytest.mark.parametrize("rows", [(7,), (2, 3, 5)])
def test_each_backend_computes_the_gemms_as_float64_does(name, rows):
    torch.manual_seed(0)
    a, w, b = torch.randn(*rows, 12), torch.randn(9, 12), torch.randn(9)
    dy, res = torch.randn(*rows, 9), torch.randn(*rows, 9)
    a64, w64, b64, dy64 = a.double(), w.double(), b.double(), dy.double()
    with gemm.using(name):
        _close(gemm.nt(a, w, b), a64 @ w64.t() + b64)
        _close(gemm.nt(a, w), a64 @ w64.t())
        _close(gemm.nn(dy, w), dy64 @ w64)
        _close(gemm.nt_add(res, a, w, b), res.double() + a64 @ w64.t() + b64)
        _close(gemm.wgrad(dy, a), dy64.reshape(-1, 9).t() @ a64.reshape(-1, 12))


@pytest.mark.parametrize("name", AVAILABLE)
def test_linear_forward_and_gradients_match_float64(name):
    torch.manual_seed(1)
    x = torch.randn(4, 5, 16, requires_grad=True)
    w, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, requires_grad=True)
    dy = torch.randn(4, 5, 8)
    with gemm.using(name):
        y = gemm.linear(x, w, b)
        y.backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    y64 = torch.nn.functional.linear(x64, w64, b64)
    y64.backward(dy.double())
    for got, want in ((y, y64), (x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        _close(got, want)


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
@pytest.mark.parametrize("winner", ["onednn", "aten"])
def test_a_channels_last_1x1_conv_runs_what_auto_raced_and_aten_under_aten(winner, race_says):
    """The fused sites' 1x1 convs: under auto, oneDNN's matmul really runs (forward and dx)
    where it won the race and not where aten did; never under `aten`; gradients match float64
    either way."""
    race_says(winner)
    torch.manual_seed(2)
    x = torch.randn(2, 6, 4, 3).contiguous(memory_format=torch.channels_last).requires_grad_()
    w, b = torch.randn(10, 6, 1, 1, requires_grad=True), torch.randn(10, requires_grad=True)
    dy = torch.randn(2, 10, 4, 3)

    def run():
        y = conv1x1(x, w, b)
        y.backward(dy)
        return y

    assert gemm._choice.name == "auto"
    run()                                   # the race runs both sides: profile what follows
    ops = _ops(run)
    assert (ONEDNN_OP in ops) == (winner == "onednn")
    assert set(gemm.raced()) == {winner}
    assert sorted(k[0] for k in gemm._raced) == ["nn", "nt"]     # forward and dx, once each
    with gemm.using("aten"):
        assert ONEDNN_OP not in _ops(run)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.conv2d(x64, w64, b64).backward(dy.double())
    x.grad = w.grad = b.grad = None
    y = run()
    _close(y, torch.nn.functional.conv2d(x64.detach(), w64.detach(), b64.detach()))
    for got, want in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        _close(got, want)


def _slowed(backend: gemm.GemmBackend, s: float) -> gemm.GemmBackend:
    """backend with every nt call `s` seconds slower (the real GEMM still runs)."""
    def nt(*args):
        time.sleep(s)
        return backend.nt(*args)
    return dataclasses.replace(backend, nt=nt)


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
@pytest.mark.parametrize("slow", ["onednn", "aten"])
def test_auto_times_both_libraries_once_per_call_shape_and_keeps_the_faster(slow, monkeypatch):
    """The race itself, with real clocks: one side made 20 ms slower per call (far above any
    GEMM of this size) loses; the verdict is kept per kind and shape, not raced again; another
    shape races anew; the result is the GEMM's either way."""
    monkeypatch.setattr(gemm, "_raced", Verdicts())
    monkeypatch.setitem(gemm.GEMMS._items, slow, _slowed(gemm.GEMMS[slow], 0.02))
    fast = "aten" if slow == "onednn" else "onednn"
    a, w = torch.randn(32, 16), torch.randn(8, 16)
    calls = []
    monkeypatch.setattr(gemm, "_race", lambda kind, args, race=gemm._race: (
        calls.append(kind), race(kind, args))[1])
    _close(gemm.nt(a, w), a.double() @ w.double().t())
    assert gemm._raced == {gemm._key("nt", (a, w, None)): fast} and calls == ["nt"]
    _close(gemm.nt(a * 2, w), (a * 2).double() @ w.double().t())      # same shape: no race
    assert calls == ["nt"]
    gemm.nt(torch.randn(40, 16), w)                                     # another: raced
    assert calls == ["nt", "nt"] and gemm.raced() == Counter({fast: 2})
    assert f"raced 2 call shapes: {fast} faster at 2" in gemm.describe_raced()


def test_named_backends_and_unsuited_operands_do_not_race(monkeypatch):
    monkeypatch.setattr(gemm, "_raced", Verdicts())
    a, w = torch.randn(6, 4), torch.randn(3, 4)
    for name in AVAILABLE:
        if name != "auto":
            with gemm.using(name):
                gemm.nt(a, w)
    gemm.nt(a.double(), w.double())             # auto, but oneDNN does not take float64
    assert gemm._raced == {} and gemm.describe_raced() is None


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
def test_onednn_sees_an_in_place_weight_update():
    """The optimizer updates weights in place: no stale copy of the old values may be used."""
    a, w = torch.randn(6, 4), torch.randn(3, 4)
    with gemm.using("onednn"):
        gemm.nt(a, w)
        w.mul_(-2.0)
        _close(gemm.nt(a, w), a.double() @ w.double().t())


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
def test_operands_onednn_does_not_take_run_aten_and_say_so_when_asked_for_by_name():
    a, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert ONEDNN_OP not in _ops(lambda: gemm.nt(a, w))          # auto: aten, quietly
        assert not seen
        with gemm.using("onednn"):
            torch.testing.assert_close(gemm.nt(a, w), a @ w.t())
    assert len(seen) == 1 and "float64" in str(seen[0].message) and "aten" in str(seen[0].message)


def test_an_unknown_or_unavailable_backend_is_a_usage_error(monkeypatch):
    with pytest.raises(UsageError, match="valid: auto, onednn, aten"):
        with gemm.using("mkl"):
            pass
    with pytest.raises(UsageError, match="valid"):
        gemm.set_default("blas")
    monkeypatch.setattr(gemm, "_onednn_missing", lambda: "no oneDNN in this build")
    gemm.resolve.cache_clear()
    try:
        assert gemm.resolve("auto").name == "aten"
    finally:
        gemm.resolve.cache_clear()


def test_an_unavailable_backend_asked_for_by_name_says_why(monkeypatch):
    fake = gemm.GemmBackend("onednn", None, None, None, lambda *a, **k: False,
                            lambda: "this torch build has no oneDNN (MKLDNN)", "")
    monkeypatch.setitem(gemm.GEMMS._items, "onednn", fake)
    gemm.resolve.cache_clear()
    try:
        with pytest.raises(UsageError, match="unavailable: this torch build has no oneDNN"):
            gemm.set_default("onednn")
    finally:
        gemm.resolve.cache_clear()
    assert gemm._choice.name == "auto"


def test_the_fused_mode_takes_fused_gemm_and_reports_the_backend():
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    from fusebench.models.source import resolve_model
    model = resolve_model("efficientnet_b0").build().train().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    for choice, shown in (("aten", "gemm: 'aten'"), ("auto", "gemm: auto -> ")):
        events = EventLog()
        try:
            get_mode("fused").prepare(model, (x,), {"bench": "train", "fused_gemm": choice},
                                      events)
            assert gemm._choice.name == choice
        finally:
            gemm.set_default("auto")
        assert any(shown in e.message for e in events.events())


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
def test_the_fused_mode_reports_what_auto_raced_after_the_steps(race_says, monkeypatch):
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    race_says("onednn")
    # another test's patchify races are not this run's
    monkeypatch.setattr(patchify, "_raced", Verdicts())
    torch.manual_seed(0)
    model = nano_gpt.make().train()
    mode, events = get_mode("fused"), EventLog()
    call = mode.prepare(model, (_tokens(None),), {"bench": "train"}, events)
    mode.finish(events)
    assert not any("raced" in e.message for e in events.events())     # nothing ran yet
    call(_tokens(None)).square().mean().backward()
    mode.finish(events)
    won = gemm.raced()
    assert set(won) == {"onednn"} and won["onednn"] >= 3     # the MLP's fc1, fc2, their dx
    assert any(f"gemm: auto raced {won['onednn']} call shapes: onednn faster at "
               f"{won['onednn']}" in e.message for e in events.events())


def _image(dtype):
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)).to(dtype) \
        .contiguous(memory_format=torch.channels_last)


def _tokens(dtype):
    return torch.randint(0, nano_gpt.VOCAB, (2, nano_gpt.CONTEXT),
                         generator=torch.Generator().manual_seed(1))


ASSETS = {"nano_gpt": (nano_gpt.make, _tokens),
          "convnext_official": (convnext_official.make, _image),
          "tv_efficientnet": (tv_efficientnet.make, _image)}


@pytest.mark.skipif("onednn" not in AVAILABLE, reason="torch built without oneDNN")
@pytest.mark.parametrize("name", sorted(ASSETS))
def test_user_models_in_float32_run_onednn_and_match_float64_eager(name, race_says):
    """Models written as other projects write them (test assets): fused in float32, their
    sites' GEMMs (MLPs; the torchvision-like EfficientNet's pointwise convs, channels-last)
    really run on oneDNN, and the output and every gradient agree with float64 eager to
    float32's precision."""
    factory, inputs = ASSETS[name]
    race_says("onednn")
    torch.manual_seed(0)
    model = factory().float().train()
    if inputs is _image:
        model = model.to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model).double()
    assert fuse(model, "train").sites
    out = {}

    def run():
        out["y"] = model(inputs(torch.float32))
        out["y"].square().mean().backward()

    assert ONEDNN_OP in _ops(run)
    r = ref(inputs(torch.float64))
    r.square().mean().backward()
    torch.testing.assert_close(out["y"].double(), r, rtol=1e-4, atol=1e-4)
    got = {n: p.grad.double() for n, p in model.named_parameters()}
    exp = {n: p.grad for n, p in ref.named_parameters()}
    errs = corr.grad_errs(got, exp, list(exp), floor=1e-3)
    assert max(errs.values()) < 1e-3, sorted(errs.items(), key=lambda kv: -kv[1])[:3]
