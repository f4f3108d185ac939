"""The graph pattern gn_act: GroupNorm -> activation in the spellings diffusion code has
(diffusers' nn.GroupNorm -> nn.SiLU, the CompVis VAE's written-out swish, guided-diffusion's
and Stable Diffusion's GroupNorm32 with its float32 casts, F.group_norm in a module's own
forward), in both layouts: one site each, the kernel's Function really in the autograd graph,
forward and gradients equal to eager; what does not fuse is a reason; a UNet whose own code
fails in float64 still gets a correctness check."""
from __future__ import annotations

import copy
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from tests.helpers import assert_matches_eager, autograd_nodes, interpreted_triton

sys.path.insert(0, str(Path(__file__).parent))
from assets import diffusion_unet  # noqa: E402

NODE = "GNActCpuFunctionBackward"


class Diffusers(nn.Module):             # nn.GroupNorm -> nn.SiLU, eps 1e-6
    def __init__(self, c=8, groups=4, act=None):
        super().__init__()
        self.norm = nn.GroupNorm(groups, c, eps=1e-6)
        self.act = act or nn.SiLU()

    def forward(self, x):
        return self.act(self.norm(x))


class Functional(nn.Module):            # F.group_norm on its own parameters -> F.silu
    def __init__(self, c=8):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.rand(c))

    def forward(self, x):
        return F.silu(F.group_norm(x, 2, self.weight, self.bias, 1e-5))


class Swish(nn.Module):                 # CompVis VAE: Normalize -> x * torch.sigmoid(x)
    def __init__(self, c=8):
        super().__init__()
        self.norm = nn.GroupNorm(4, c, eps=1e-6, affine=True)

    def forward(self, x):
        h = self.norm(x)
        return h * torch.sigmoid(h)


class NoAffine(nn.Module):             # GroupNorm(affine=False) -> ReLU, then a scale
    def __init__(self, c=8):
        super().__init__()
        self.norm, self.act = nn.GroupNorm(4, c, affine=False), nn.ReLU()
        self.scale = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return self.act(self.norm(x)) * self.scale[:, None, None]


def _norm32(c=8):
    return nn.Sequential(diffusion_unet.GroupNorm32(4, c), nn.SiLU())


SPELLINGS = {
    "diffusers": Diffusers,
    "functional": Functional,
    "vae_swish": Swish,
    "gelu_after_identity": lambda: nn.Sequential(nn.GroupNorm(2, 8), nn.Identity(), nn.GELU()),
    "relu_no_affine": NoAffine,
    "instance_like": lambda: Diffusers(groups=8),
}


def _x(dtype=torch.float64, channels_last=False, seed=0):
    """x requires grad: torch 2.4-2.13's channels-last GroupNorm backward (the eager reference's)
    segfaults when x needs none (test_a_frozen_input_in_channels_last_runs_backward)."""
    x = 3 * torch.randn(2, 8, 5, 7, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
    return x.requires_grad_()


def _ran(y) -> int:
    return sum(type(n).__name__ == NODE for n in autograd_nodes(y))


def _build(factory, dtype=torch.float64):
    torch.manual_seed(0)
    m = factory().to(dtype)
    for p in m.parameters():
        with torch.no_grad():
            p.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_each_spelling_is_one_site_that_matches_eager(name, layout):
    model = _build(SPELLINGS[name])
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"gn_act": 1}, (result.sites, result.notes)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no site fell back to aten
        for _ in range(2):
            y = assert_matches_eager(model, ref, (_x(channels_last=layout == "channels_last"),))
            assert _ran(y) == 1
            model.zero_grad()
            ref.zero_grad()
    # same Parameters, and inference (a fused copy) computes the same
    assert all(p is q for p, q in zip(model.parameters(), result.model.parameters()))
    infer = fuse(copy.deepcopy(ref).eval(), "infer")
    assert dict(infer.sites) == {"gn_act": 1}
    torch.testing.assert_close(infer.model(_x()), ref.eval()(_x()))


def test_groupnorm32_casts_run_the_kernel_in_float32_and_the_users_ops_in_float64():
    """GroupNorm32: `super().forward(x.float()).type(x.dtype)`. float32 x: the kernel; bf16 x:
    the kernel on x.float(), rounded once (the spelled form rounds before the act: within an
    ulp); float64 x: the user's code computes in float32 next to float64 parameters, which
    fails in eager and identically in the fused model."""
    model = _build(_norm32, torch.float32)
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"gn_act": 1}
    y = assert_matches_eager(model, ref, (_x(torch.float32),), tol=1e-5)
    assert _ran(y) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xb = _x(torch.float32).to(torch.bfloat16)
        torch.testing.assert_close(model(xb), ref(xb), atol=2e-2, rtol=2e-2)
        assert model(xb).dtype == torch.bfloat16
    m64, r64 = copy.deepcopy(model).double(), copy.deepcopy(ref).double()
    for m in (m64, r64):
        with pytest.raises(RuntimeError, match="mixed dtype"):
            m(_x())


def test_a_unet_with_every_spelling_fuses_each_pair_and_matches_eager():
    """The asset as written (GroupNorm32 in its ResBlocks), float32: 13 GroupNorm -> SiLU
    sites and the attention block's GroupNorm alone, each running the kernel; forward and gradients equal to eager within float32
    rounding (eager's own gradients are 1.8e-5 from float64 on the nn.GroupNorm variant; its
    float64 check is test_fuse_patterns' diffusion_unet)."""
    model = _build(diffusion_unet.make, torch.float32).train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"gn_act": 13, "group_norm": 1, "mlp": 1,
                                                "silu_me": 4}
    inputs = model.example_inputs(2, "cpu", torch.float32)
    y = assert_matches_eager(model, ref, inputs, tol=1e-4)
    assert _ran(y) == 14


class TwoUses(nn.Module):               # the normalised tensor also feeds a residual
    def __init__(self):
        super().__init__()
        self.norm, self.act = nn.GroupNorm(4, 8), nn.SiLU()

    def forward(self, x):
        h = self.norm(x)
        return self.act(h) + h


class TensorWeight(nn.Module):          # functional group_norm on a computed weight
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return F.silu(F.group_norm(x, 4, self.w * 2, None))


REASONS = {
    "used_elsewhere": (TwoUses, "the GroupNorm output is used elsewhere too"),
    "tensor_weight": (TensorWeight, "weight and bias are not module parameters"),
    "quick_gelu": (lambda: nn.Sequential(nn.GroupNorm(4, 8), _QuickGELU()),
                   "activation quick_gelu"),     # (then the norm alone: group_norm)
}


class _QuickGELU(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


@pytest.mark.parametrize("name", sorted(REASONS))
def test_what_does_not_fuse_is_a_reason(name):
    factory, reason = REASONS[name]
    result = fuse(factory().double(), "train")
    assert "gn_act" not in result.sites
    assert any(k == "not_fused" and "gn_act" in m and reason in m for k, m in result.notes), \
        result.notes


class AttnNorm(nn.Module):              # an attention block's norm: no activation after it
    def __init__(self, norm32=False):
        super().__init__()
        self.norm = (diffusion_unet.GroupNorm32 if norm32 else nn.GroupNorm)(4, 8)
        self.proj = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return x + self.proj(self.norm(x))


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_a_groupnorm_alone_runs_the_kernel_with_the_identity(layout):
    model = _build(AttnNorm)
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"group_norm": 1}, (result.sites, result.notes)
    y = assert_matches_eager(model, ref, (_x(channels_last=layout == "channels_last"),))
    assert _ran(y) == 1
    m32 = _build(lambda: AttnNorm(norm32=True), torch.float32)     # with GroupNorm32's casts
    r32 = copy.deepcopy(m32)
    assert dict(fuse(m32, "train").sites) == {"group_norm": 1}
    y = assert_matches_eager(m32, r32, (_x(torch.float32),), tol=1e-5)
    assert _ran(y) == 1


def test_the_aten_binding_runs_the_sequence_and_says_so():
    model = _build(Diffusers)
    ref = copy.deepcopy(model)
    result = fuse(model, "train", impls={"gn_act": "aten"})
    assert ("info", "gn_act: kernel = 'aten'") in result.notes
    y = assert_matches_eager(model, ref, (_x(),))
    assert _ran(y) == 0 and dict(result.sites) == {"gn_act": 1}


def test_fused_mode_on_a_unet_that_fails_in_float64_checks_against_float32_eager():
    """Stable Diffusion's GroupNorm32 cannot run in float64: the cell still runs and its
    correctness check says it compared with float32 eager, and why."""
    from fusebench.cell.model_cell import run_cell
    from fusebench.spec import CellSpec
    spec = CellSpec.for_model(f"{diffusion_unet.__file__}:make", "fused", batch_size=2,
                              warmup=1, steps=1, threads=1)
    rec = run_cell(spec, lambda phase: None)
    assert rec.status == "ok", rec.error
    assert rec.correctness.passed, rec.correctness
    assert "the model fails in float64: mixed dtype" in rec.correctness.detail
    assert Counter(e.message for e in rec.events)["gn_act: 13 sites"] == 1
    assert Counter(e.message for e in rec.events)["group_norm: 1 sites"] == 1


def test_a_frozen_input_in_channels_last_runs_backward():
    """aten's channels-last GroupNorm backward segfaults on torch 2.4-2.13 (CPU) when the input
    needs no gradient (a GroupNorm on the image, a frozen stem: `python -c` in a subprocess
    shows it); the fused site's kernel computes the same parameter gradients as eager on the
    NCHW copy."""
    import subprocess
    crash = ("import torch; x = torch.randn(2, 8, 5, 7).contiguous(memory_format="
             "torch.channels_last); y = torch.nn.GroupNorm(4, 8)(x); y.sum().backward()")
    aten = subprocess.run([sys.executable, "-c", crash], capture_output=True)
    model = _build(Diffusers)
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = _x(channels_last=True).detach()
    model(x).square().mean().backward()
    ref(x.contiguous()).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    # the torch bug itself, seen crash on 2.4.1 and 2.13.0, fixed by 2.14.1: a torch that
    # brings it back, or a 2.13 that does not crash, shows up here
    fixed = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 14)
    assert (aten.returncode == 0) == fixed, (torch.__version__, aten.returncode)


def test_fused_mode_runs_a_unets_nchw_input_channels_last_inside(monkeypatch):
    """fused_layout=auto: gn_act sites (with the 3x3 convs around them, faster on channels-last
    data on CPU: benchmarks/unet_parts.py) turn on channels-last inside; output in the
    caller's layout, forward and gradients equal to float64 eager."""
    from fusebench.fuse import layout
    from tests.test_fuse_layout import prepared
    monkeypatch.setattr(layout, "MARGIN", float("inf"))   # the timed trial's verdict: tiny
    model = _build(diffusion_unet.make_plain).train()
    ref = copy.deepcopy(model)
    inputs = model.example_inputs(2, "cpu", torch.float64)
    fn, events = prepared(model, inputs)
    assert isinstance(fn, layout.ChannelsLastInside)
    assert any(c == "fusion" and "channels-last inside" in m and "gn_act sites" in m
               for c, m in events), events
    y = assert_matches_eager(model, ref, inputs, call=fn)
    assert y.is_contiguous()


@pytest.mark.parametrize("value, node", [("auto", NODE), ("cpu", NODE), ("aten", None),
                                         ("triton", "GNActTritonFunctionBackward")])
def test_the_fused_gn_act_option_picks_the_kernel(value, node, monkeypatch):
    """--fused-gn-act: the kernel that runs, said as an info event; Triton runs interpreted
    on CPU here, and without the interpreter (no GPU) aten's sequence runs, said as a
    kernel_fallback event."""
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    if value == "triton":
        interpreted_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for interpret in ((True, False) if value == "triton" else (True,)):
        if not interpret:
            monkeypatch.delenv("TRITON_INTERPRET")
        model = _build(Diffusers, torch.float32)
        events = EventLog()
        call = get_mode("fused").prepare(model, (_x(torch.float32),),
                                         {"bench": "train", "fused_gn_act": value}, events)
        seen = {type(n).__name__ for n in autograd_nodes(call(_x(torch.float32)))}
        said = [(e.category, e.message) for e in events.events()]
        if interpret:
            shown = "cpu" if value == "auto" else value
            assert ("info", f"gn_act: kernel = '{shown}'") in said, said
            assert node is None and not seen & {NODE, "GNActTritonFunctionBackward"} or \
                node in seen, seen
        else:
            assert any(c == "kernel_fallback" and "gn_act 'triton' unavailable" in m
                       for c, m in said), said
            assert "GNActTritonFunctionBackward" not in seen


def test_under_cpu_autocast_a_bf16_input_runs_atens_sequence_and_says_so():
    """CPU autocast hands the GroupNorm the conv's bf16 output (it does not upcast
    group_norm, CUDA's autocast does); the C++ kernel takes float32 / float64 only, so the
    site runs aten's GroupNorm and act, with a warning (an event in a run)."""
    conv_gn = lambda: nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), Diffusers())  # noqa: E731
    model = _build(conv_gn, torch.float32)
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"gn_act": 1}
    x = _x(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(UserWarning, match="gn_act: the cpu kernel does not take this input"):
            y = model(x)
        r = ref(x)
    assert y.dtype == r.dtype == torch.bfloat16
    torch.testing.assert_close(y, r)
