"""Grad and autocast `with` blocks inside a forward (fuse/fx/modes.py): a fused graph runs them
as eager does. Before, fx ran them at trace time only: `x * 2` under no_grad added 2 to every
input's gradient in the fused model. Each model here is compared with its eager copy, inputs'
gradients included, under the caller's modes that matter (grad on, no_grad, CPU autocast)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from fusebench.fuse.fx import modes


class Mlp(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):          # not a leaf: the parent's trace inlines it (one mlp site)
        return self.fc2(F.gelu(self.fc1(x)))


class TargetUnderNoGrad(nn.Module):
    """A teacher's target (BYOL, DINO, a codebook lookup): computed without grad, beside a site."""

    def __init__(self):
        super().__init__()
        self.mlp, self.teacher = Mlp(), Mlp()

    def forward(self, x):
        with torch.no_grad():
            t = self.teacher(x) * 2
        return self.mlp(x) + t


class SiteInsideNoGrad(nn.Module):
    """The site itself inside the block, and grad back on for a part of it (nested)."""

    def __init__(self):
        super().__init__()
        self.mlp, self.head = Mlp(), nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            frozen = self.mlp(x)
            with torch.enable_grad():
                live = self.head(x)
        return frozen.sum(-1, keepdim=True) + live    # not a residual: no fold across


class SpansTheBlock(nn.Module):
    """fc1 and its activation under no_grad, fc2 after it: no one call can be both."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        with torch.no_grad():
            h = F.gelu(self.fc1(x))
        return self.fc2(h) + x


@torch.no_grad()
def _frozen_scale(t):              # the decorator form enters no_grad too
    return t * 3


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        return self.mlp(x) + _frozen_scale(x)


class Float32Island(nn.Module):
    """HF's rotary embedding: `with torch.autocast(device_type=..., enabled=False)` around
    math that must stay float32, the device type read from a tensor (which, traced, is the
    code's "cpu" fallback); then an MLP under the caller's autocast."""

    def __init__(self):
        super().__init__()
        self.mlp, self.proj = Mlp(), nn.Linear(8, 8)

    def forward(self, x):
        device_type = x.device.type if isinstance(x.device.type, str) else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            angles = self.proj(x.float())
        return self.mlp(x), angles


def _fused(cls):
    torch.manual_seed(0)
    model = cls().double()
    ref = copy.deepcopy(model)
    return model, ref, fuse(model, "train")


def _step(model, x):
    x = x.detach().clone().requires_grad_()
    y = model(x)
    y.square().mean().backward()
    return y, x.grad, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("cls, sites", [(TargetUnderNoGrad, 2), (SiteInsideNoGrad, 1),
                                        (Decorated, 1)])
def test_a_no_grad_block_keeps_its_gradients_as_eager(cls, sites, site_calls):
    model, ref, result = _fused(cls)
    assert result.sites["mlp"] == sites, result.sites
    x = torch.randn(4, 8, dtype=torch.float64)
    for (y, dx, grads), (ry, rdx, rgrads) in [(_step(model, x), _step(ref, x))]:
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(dx, rdx)         # was off by 2 (or 3) before
        for n, g in rgrads.items():
            torch.testing.assert_close(grads[n], g, msg=n)   # None where eager has None
    assert site_calls["fused_mlp"] == sites
    assert torch.is_grad_enabled()                   # the caller's mode is back


class GradBackOn(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp, self.head = Mlp(), nn.Linear(8, 8)

    def forward(self, x):
        with torch.enable_grad():
            live = self.head(x)
        return self.mlp(x), live


def test_the_callers_no_grad_is_back_after_the_block(site_calls):
    """Relative to the caller, as `with` is: an inference call under no_grad gets grad in the
    enable_grad block only, and no_grad again after it."""
    model, ref, result = _fused(GradBackOn)
    assert result.sites["mlp"] == 1
    x = torch.randn(4, 8, dtype=torch.float64)
    with torch.no_grad():
        (out, live), (rout, rlive) = model(x), ref(x)
        assert not torch.is_grad_enabled()
    assert (out.requires_grad, live.requires_grad) == (rout.requires_grad, rlive.requires_grad) \
        == (False, True)
    assert site_calls["fused_mlp"] == 1


def test_a_site_across_the_block_is_a_reason(site_calls):
    model, ref, result = _fused(SpansTheBlock)
    assert result.sites["mlp"] == 0
    assert any("both sides of a `with` block" in text for _, text in result.notes), result.notes
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(_step(model, x)[1], _step(ref, x)[1])


def test_an_autocast_off_block_stays_float32_under_the_callers_autocast(site_calls):
    torch.manual_seed(0)
    model = Float32Island()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["mlp"] == 1
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (y, angles), (ry, rangles) = model(x), ref(x)
        assert torch.is_autocast_enabled("cpu")
    assert angles.dtype == rangles.dtype == torch.float32     # bfloat16 before
    torch.testing.assert_close(angles, rangles, atol=0, rtol=0)
    assert y.dtype == ry.dtype == torch.bfloat16
    torch.testing.assert_close(y, ry, atol=2e-2, rtol=2e-2)
    assert site_calls["fused_mlp"] == 1


class InferenceMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        with torch.inference_mode():
            t = x * 2
        return self.mlp(x) + t


class SetAsFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        y = self.mlp(x)
        torch.set_grad_enabled(False)
        t = x * 2
        torch.set_grad_enabled(True)
        return y + t


@pytest.mark.parametrize("cls", [InferenceMode, SetAsFunction])
def test_a_mode_set_any_other_way_keeps_the_modules_own_forward(cls):
    model, ref, result = _fused(cls)
    assert result.sites["mlp"] == 1                  # Mlp, traced on its own
    assert any(kind == "fx_fallback" and "changes grad, inference or autocast mode" in text
               for kind, text in result.notes), result.notes
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    x = torch.randn(4, 8, dtype=torch.float64)
    if cls is SetAsFunction:
        torch.testing.assert_close(_step(model, x)[1], _step(ref, x)[1])


class Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()

    def forward(self, x):
        with torch.no_grad():
            t = self.mlp(x)
            t = t.view(-1, 3)                        # raises where the size does not divide
        return t


def test_an_exception_inside_the_block_gives_the_callers_mode_back():
    model, _, result = _fused(Raises)
    assert result.sites["mlp"] == 1
    with pytest.raises(RuntimeError, match="invalid for input"):
        model(torch.randn(4, 8, dtype=torch.float64))
    assert torch.is_grad_enabled()
    assert not modes._entered()


class MeetsAThread(nn.Module):
    """Its forward runs while another thread is inside a no_grad block (grad mode is per
    thread: that block is not the model's)."""

    def __init__(self, go, inside, release, left):
        super().__init__()
        self.mlp, self.events, self.calls = Mlp(), (go, inside, release, left), []

    def forward(self, x):
        self.calls.append(x)
        go, inside, release, left = self.events
        go.set()
        inside.wait(10)                                 # the other thread is in its block
        y = self.mlp(x)
        release.set()
        left.wait(10)                                   # and has left it
        return y


def test_another_threads_blocks_during_the_trace_are_not_the_models():
    """The managers are patched for the trace's duration; another thread's block must pass
    through untouched (before: it was recorded as the model's, and the first trace failed on
    it: the model was traced twice, or, where every attempt met such a block, not at all)."""
    import threading
    go, inside, release, left = (threading.Event() for _ in range(4))
    errors: list = []

    def other():
        go.wait(10)                                     # the trace has begun
        try:
            with torch.no_grad():
                inside.set()
                release.wait(10)
        except Exception as e:                          # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            left.set()
    thread = threading.Thread(target=other)
    thread.start()
    model = MeetsAThread(go, inside, release, left)
    result = fuse(model, "train")
    thread.join(10)
    assert errors == []
    assert len(model.calls) == 1                        # one trace: the first one held
    assert result.sites["mlp"] == 1
    assert not [text for kind, text in result.notes if kind == "fx_fallback"], result.notes
