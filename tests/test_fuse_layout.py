"""Channels-last inside (fuse/layout.py): a fused model fed NCHW images runs its blocks on
channels-last data where a BN-family site fired, says so as an event, matches float64 eager in
forward and gradients, hands 4-D outputs back in NCHW, and keeps the user's layout (with the
reason) where the option, the sites or the model's own code say no."""
from __future__ import annotations

import copy
import functools
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fusebench.fuse import layout
from fusebench.fuse.rule import FusedModule
from fusebench.measure.events import EventLog
from fusebench.modes import get_mode
from fusebench.models.source import resolve_model
from tests.helpers import assert_matches_eager

sys.path.insert(0, str(Path(__file__).parent))
from assets import tv_efficientnet  # noqa: E402


def image(c=3, hw=32):
    return torch.randn(2, c, hw, hw, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(1))


def prepared(model, inputs, **options):
    events = EventLog()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # dwconv's "aten kept at this shape" notes
        fn = get_mode("fused").prepare(model, inputs, {"bench": "train", **options}, events)
    return fn, [(e.category, e.message) for e in events.events()]


def wrappers(fn) -> list[type]:
    """The wrapper types around the model in a prepared callable, outermost first."""
    out = []
    while not isinstance(fn, nn.Module):
        out.append(type(fn))
        fn = fn.fn
    return out


def layout_of(x) -> str:
    nchw, cl = x.is_contiguous(), x.is_contiguous(memory_format=torch.channels_last)
    return "both" if nchw and cl else "nchw" if nchw else "cl" if cl else "strided"


def layouts_seen(model) -> list[str]:
    """A pre-hook on every fused module and conv records its input's layout ("both" for 1x1
    maps); a graph site's absorbed modules are not called, its module's own forward is."""
    seen: list[str] = []
    for m in model.modules():
        if isinstance(m, (FusedModule, nn.Conv2d)):
            m.register_forward_pre_hook(lambda _m, args: seen.append(layout_of(args[0])))
    return seen


class ViewsNCHW(nn.Module):
    """User code written for NCHW: `.view` on the conv's output fails on channels-last data."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU()
        self.head = nn.Linear(8 * 16 * 16, 4)

    def forward(self, x):
        y = self.act(self.bn(self.conv(x)))
        return self.head(y.view(y.shape[0], -1))


class Dense(nn.Module):
    """A dense-prediction head: returns a 4-D map, which must come back NCHW."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(),
                                  nn.Conv2d(8, 2, 1))

    def forward(self, x):
        return self.body(x)


# name -> (factory of a train-mode model with a BN-family site, image size): the zoo's
# EfficientNet at 64 px (at 32 px it ends in BN over 2 values per channel, where eager itself
# turns a 1e-15 change of x into 1e-7 at the output: test_fuser.py)
MODELS = {
    "efficientnet_zoo": (lambda: resolve_model("efficientnet_b0").build(), 64),
    "tv_efficientnet": (tv_efficientnet.make, 32),
    "dense_head": (Dense, 32),
}


@pytest.fixture
def trial_says(monkeypatch):
    """auto's timed trial with the verdict fixed: "cl" (any NCHW lead is within the margin) or
    "nchw" (any channels-last time loses). Tiny models time in noise."""
    def says(verdict: str):
        monkeypatch.setattr(layout, "MARGIN", math.inf if verdict == "cl" else 0.0)
    return says


@pytest.mark.parametrize("name", MODELS)
def test_runs_channels_last_inside_and_matches_float64_eager(name, trial_says):
    trial_says("cl")
    torch.manual_seed(0)
    factory, hw = MODELS[name]
    model = factory().double().train()
    ref = copy.deepcopy(model)
    fn, events = prepared(model, (image(hw=hw),))
    assert isinstance(fn, layout.ChannelsLastInside)
    assert any(c == "fusion" and m.startswith("channels-last inside") for c, m in events), events
    seen = layouts_seen(model)
    y = assert_matches_eager(model, ref, (image(hw=hw),), call=fn)
    assert "cl" in seen and "nchw" not in seen, seen  # every fused block got channels-last x
    if y.dim() == 4:                                   # the caller's layout comes back
        assert y.is_contiguous()


def test_keep_runs_the_users_layout():
    model = resolve_model("efficientnet_b0").build().double().train()
    fn, events = prepared(model, (image(),), fused_layout="keep")
    assert layout.ChannelsLastInside not in wrappers(fn)
    assert ("info", "layout kept (fused_layout=keep)") in events
    seen = layouts_seen(model)
    fn(image())
    assert "nchw" in seen and "cl" not in seen, seen


def test_auto_keeps_nchw_without_a_bn_site_and_the_option_forces_it():
    build = lambda: resolve_model("convnext_atto").build().double().train()   # noqa: E731
    fn, events = prepared(build(), (image(),))
    assert not isinstance(fn, layout.ChannelsLastInside)
    assert any(c == "info" and "no channels-last-preferring site" in m for c, m in events)
    fn, events = prepared(build(), (image(),), fused_layout="channels_last")
    assert isinstance(fn, layout.ChannelsLastInside)
    assert any("fused_layout=channels_last" in m for _, m in events)


def test_a_model_that_fails_on_channels_last_keeps_its_layout_and_says_why():
    torch.manual_seed(0)
    model = ViewsNCHW().double().train()
    ref = copy.deepcopy(model)
    before = {n: b.clone() for n, b in model.named_buffers()}
    fn, events = prepared(model, (image(hw=16),))
    assert layout.ChannelsLastInside not in wrappers(fn)   # NCHW kept, not a broken cell
    fallback = [m for c, m in events if c == "fallback"]
    assert fallback and "fails on channels-last input (RuntimeError" in fallback[0], events
    for n, b in model.named_buffers():               # the trial left no trace in BN's stats
        assert torch.equal(b, before[n]), n
    assert_matches_eager(model, ref, (image(hw=16),), call=fn)


def test_nothing_to_convert_says_nothing():
    model = resolve_model("efficientnet_b0").build().train()
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    fn, events = prepared(model, (x,))
    assert layout.ChannelsLastInside not in wrappers(fn) and not any("layout" in m or "channels-last inside" in m
                                   for _, m in events)


@pytest.mark.parametrize("t, converted", [
    (torch.randn(2, 3, 4, 4), True),
    (torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last), False),
    (torch.randn(2, 1, 4, 4), False),                 # one channel: both layouts are the same
    (torch.randint(0, 9, (2, 3, 4, 4)), False),       # not an image of floats
    (torch.randn(2, 3, 4), False),
])
def test_only_nchw_float_images_are_converted(t, converted):
    seen = []
    got = layout.ChannelsLastInside(lambda x: seen.append(x) or x)(t)
    assert layout.nchw_image(t) is converted
    assert seen[0].is_contiguous(memory_format=torch.channels_last) is (
        converted or seen[0] is t and t.is_contiguous(memory_format=torch.channels_last))
    assert torch.equal(got, t) and got.stride() == t.stride()    # the caller's layout back


def test_auto_keeps_nchw_off_the_cpu_it_was_measured_on():
    model = resolve_model("efficientnet_b0").build().train()
    got = layout.decide("auto", {"bn_silu": 3}, model, (torch.randn(2, 3, 32, 32),), "cuda:0")
    assert not got.inside and got.category == "info" and "measured on CPU only" in got.message


@pytest.mark.parametrize("wrap", [lambda y: y, lambda y: (y, 1), lambda y: [y],
                                  lambda y: {"map": y, "n": 1}])
def test_4d_outputs_come_back_nchw_in_containers(wrap):
    x = torch.randn(2, 3, 4, 4)
    out = layout.ChannelsLastInside(lambda t: wrap(t * 2))(x)
    y = out if torch.is_tensor(out) else (out["map"] if isinstance(out, dict) else out[0])
    assert torch.equal(y, x * 2) and y.is_contiguous()


@functools.cache
def _note_once(where: str) -> None:
    # a kernel's "said once per shape" note (dwconv.passes_for)
    warnings.warn(f"kernel note: {where}")


class SaysOnce(nn.Module):
    def forward(self, x):
        _note_once("channels-last" if layout_of(x) == "cl" else "nchw")
        return x


def _noted(verdict, trial_says):
    _note_once.cache_clear()
    trial_says(verdict)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(),
                          SaysOnce()).train()
    events = EventLog()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn = get_mode("fused").prepare(model, (torch.randn(2, 3, 16, 16),), {"bench": "train"},
                                       events)
    return fn, [(e.category, e.message) for e in events.events()], \
        [str(w.message) for w in caught if str(w.message).startswith("kernel note")]


def test_auto_times_both_layouts_and_keeps_nchw_where_it_is_faster(trial_says):
    fn, events, said = _noted("nchw", trial_says)
    assert layout.ChannelsLastInside not in wrappers(fn)
    kept = [m for c, m in events if c == "info" and m.startswith("layout kept NCHW")]
    assert kept and "prefer channels-last, but timed on the example inputs, a train step took" \
        in kept[0] and "ms NCHW and" in kept[0], events
    assert said == ["kernel note: nchw"]      # the trial's channels-last note is not the run's


def test_auto_keeps_channels_last_inside_near_a_tie_and_says_the_times(trial_says):
    fn, events, said = _noted("cl", trial_says)
    assert isinstance(fn, layout.ChannelsLastInside)
    inside = [m for c, m in events if c == "fusion" and m.startswith("channels-last inside")]
    assert inside and "(bn_act sites; timed on the example inputs" in inside[0], events
    assert said == ["kernel note: channels-last"]


@pytest.mark.parametrize("train", [True, False])
def test_the_timed_trial_leaves_no_trace(train):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU()).train()
    x = torch.randn(2, 3, 16, 16)
    before = copy.deepcopy(model.state_dict())
    state = torch.random.get_rng_state()
    nchw, cl = layout.timed_trial(model, model, (x,), train)
    assert nchw > 0 and cl > 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.random.get_rng_state(), state)


BF16_AUTOCAST = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)


class Recording(nn.Module):
    """conv -> BN -> SiLU (a bn_silu site) that records, per call, whether a CPU autocast was
    on and its input's layout."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU())
        self.calls: list[tuple[bool, str]] = []

    def forward(self, x):
        self.calls.append((torch.is_autocast_enabled("cpu"), layout_of(x)))
        return self.body(x)


def _untimed(monkeypatch):
    def trial(*_a, **_k):
        raise AssertionError("the layout trial ran")
    monkeypatch.setattr(layout, "timed_trial", trial)


@pytest.mark.parametrize("how", ["autocast", "bf16 model"])
def test_auto_keeps_nchw_untimed_where_the_step_computes_in_bf16(monkeypatch, how):
    """The sites' kernels take float32 / float64 only: under a CPU bf16 autocast (the cell's
    --amp, handed to prepare as options["autocast"]) or on a bf16 model they run eager's ops,
    and channels-last inside bought no time there but 1.7x the peak memory (b0, 35th session).
    auto keeps the user's layout, says why, and times nothing."""
    _untimed(monkeypatch)
    model = Recording().train()
    x = torch.randn(2, 3, 16, 16)
    options = {"autocast": BF16_AUTOCAST}
    if how == "bf16 model":
        model, x, options = model.bfloat16(), x.bfloat16(), {}
    fn, events = prepared(model, (x,), **options)
    assert layout.ChannelsLastInside not in wrappers(fn)
    kept = [m for c, m in events if c == "info" and m.startswith("layout kept NCHW")]
    assert kept and "prefer channels-last for their float32 / float64 CPU kernels, but this " \
        "step computes in bfloat16" in kept[0], events
    assert model.calls == []                      # not even the channels-last check ran


def test_auto_in_float32_still_converts_with_an_autocast_that_is_off(trial_says):
    trial_says("cl")
    model = Recording().train()
    fn, events = prepared(model, (torch.randn(2, 3, 16, 16),),
                          autocast=functools.partial(torch.autocast, "cpu", enabled=False))
    assert isinstance(fn, layout.ChannelsLastInside)
    assert {cl for _, cl in model.calls} == {"nchw", "cl"}    # both layouts were tried


def test_the_check_and_the_trial_run_under_the_cells_autocast(monkeypatch, trial_says):
    """Were the kernels to take bf16, the trial would time the step the cell times: the
    check's and the trial's calls all run under the autocast decide was given."""
    trial_says("cl")
    monkeypatch.setattr(layout, "KERNEL_DTYPES", layout.KERNEL_DTYPES | {torch.bfloat16})
    model = Recording().train()
    fn, _ = prepared(model, (torch.randn(2, 3, 16, 16),), autocast=BF16_AUTOCAST)
    assert isinstance(fn, layout.ChannelsLastInside)
    assert len(model.calls) >= 3 and all(on for on, _ in model.calls), model.calls
    model.calls.clear()
    fn(torch.randn(2, 3, 16, 16))                   # the autocast is not left on after prepare
    assert model.calls == [(False, "cl")]


def test_kernel_dtypes_are_the_channels_last_kernels_own():
    from fusebench.kernels.bn_act import cpu as bn_act
    from fusebench.kernels.gn_act import cpu as gn_act
    assert layout.KERNEL_DTYPES == set(bn_act.DTYPES) == set(gn_act.DTYPES)


def test_an_amp_cell_hands_its_autocast_to_the_layout_rule():
    """End to end: an --amp fused cell of an image model with a BN + SiLU site keeps NCHW and
    says it computes in bfloat16 (the cell passes its autocast to prepare)."""
    from fusebench.cell.model_cell import run_cell
    from fusebench.spec import CellSpec
    spec = CellSpec.for_model(f"{tv_efficientnet.__file__}:make", "fused", batch_size=2,
                              img_size=32, amp=True, check=False, warmup=1, steps=1, threads=1)
    rec = run_cell(spec, lambda phase: None)
    assert rec.status == "ok", rec.error
    kept = [e.message for e in rec.events if e.message.startswith("layout kept NCHW")]
    assert kept and "this step computes in bfloat16" in kept[0], [e.message for e in rec.events]
