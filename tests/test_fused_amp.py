"""Fused mode under autocast (AMP), on CPU with bf16: our zoo and the models written the way
other projects write them (tests/assets). Autocast leaves backward, so a fused Function whose
backward runs GEMMs or convs must re-enter forward's autocast region (engine.backward_autocast),
and a recomputed BN output must come back in the activation's dtype. Each case: the fused step
runs, its output has eager's dtype, and its error against float64 eager is no worse than
eager-under-autocast's own (bf16 is the error here, not the fuser)."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from fusebench.fuse import fuse
from fusebench.models import create_model
from tests.helpers import autograd_nodes, interpreted_triton
from tests.test_fuse_patterns import ASSETS

AMP = torch.bfloat16


def _zoo(name: str, px: int):
    return (lambda: create_model(name),
            lambda: (torch.randn(4, 3, px, px, generator=torch.Generator().manual_seed(1)),))


CASES = {"efficientnet_b0": _zoo("efficientnet_b0", 64), "convnext_atto": _zoo("convnext_atto", 64),
         **{n: (f, x) for n, (f, x, _) in ASSETS.items() if n in
            ("convnext_official", "convnext_v2_official", "nano_gpt", "tv_efficientnet",
             "tv_efficientnet_v2",
             "timm_efficientnet",
             "hf_gpt2", "hf_efficientnet", "tv_mobilenet_v2", "tv_mobilenet_v3",
             "llama_hf", "llama_torch_rmsnorm")}}


def _step(model, inputs, amp: bool, channels_last: bool):
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.to(memory_format=torch.channels_last) if x.dim() == 4 else x
                       for x in inputs)
    with torch.autocast("cpu", dtype=AMP, enabled=amp):
        y = model(*inputs)
    y.float().square().mean().backward()
    return y, [p.grad for p in model.parameters()]


def _rel(y, g, ref_y, ref_g) -> float:
    """The larger of the output's and all gradients' (as one vector) relative errors."""
    ey = (y.double() - ref_y).norm() / ref_y.norm()
    num = sum((a.double() - b).norm() ** 2 for a, b in zip(g, ref_g)) ** 0.5
    return max(ey.item(), (num / sum(b.norm() ** 2 for b in ref_g) ** 0.5).item())


def _check(name: str, impls: dict | None = None, channels_last: bool = True) -> list[str]:
    factory, make_inputs = CASES[name]
    torch.manual_seed(0)
    base = factory().float().train()
    inputs = make_inputs()
    inputs = tuple(x.float() if x.is_floating_point() else x for x in inputs)
    ref_y, ref_g = _step(copy.deepcopy(base).double(),
                         tuple(x.double() if x.is_floating_point() else x for x in inputs),
                         False, channels_last)
    ref_y, ref_g = ref_y.detach(), ref_g
    eager_y, eager_g = _step(copy.deepcopy(base), inputs, True, channels_last)
    res = fuse(copy.deepcopy(base), "train", "cpu", impls=impls or {})
    assert res.sites, f"{name}: nothing fused"
    fused_y, fused_g = _step(res.model, inputs, True, channels_last)
    assert fused_y.dtype == eager_y.dtype
    assert all(g is not None for g in fused_g)
    eager_err = _rel(eager_y.detach(), eager_g, ref_y, ref_g)
    fused_err = _rel(fused_y.detach(), fused_g, ref_y, ref_g)
    assert fused_err <= 1.5 * eager_err + 1e-2, (name, fused_err, eager_err)
    # a MultiOpFunction node carries its kernel (name says which impl ran); others their type
    return [getattr(getattr(n, "kernel", None), "name", None) or type(n).__name__
            for n in autograd_nodes(fused_y)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_step_under_autocast_is_as_accurate_as_eager(name):
    nodes = _check(name)
    # a fused kernel's name is "site[impl...]"; the LN2d kernels are their own Functions. A
    # model whose only sites are BN + act (MobileNetV2's BN + ReLU6) runs eager's batch norm
    # under bf16: the C++ kernel takes float32 / float64 (the test below)
    assert any("[" in n or "LN2d" in n for n in nodes) or (
        name == "tv_mobilenet_v2" and "NativeBatchNormBackward0" in nodes), nodes


@pytest.mark.parametrize("name", ["efficientnet_b0", "tv_mobilenet_v2"])
def test_a_bn_site_whose_kernel_takes_no_bf16_runs_eagers_ops(name):
    """Under bf16 autocast the bn_act C++ kernel cannot run: the site computes what eager does
    the way eager does (F.batch_norm, then the act), not aten's sequence inside our Function,
    which cast and copied around autocast (b0: 718 vs eager's 658 ms a step). Same outputs,
    gradients and running statistics as eager under autocast, and it says so. Bit for bit for
    MobileNetV2, whose sites (BN + act, 1x1 convs, depthwise) all run eager's ops under bf16;
    b0's SE gate computes in its own kernel, so the test above holds its step to float64."""
    factory, make_inputs = CASES[name]
    torch.manual_seed(0)
    base = factory().float().train()
    inputs = tuple(x.float() if x.is_floating_point() else x for x in make_inputs())
    eager = copy.deepcopy(base)
    res = fuse(copy.deepcopy(base), "train", "cpu")
    assert {"bn_act", "bn_silu"} & set(res.sites), res.sites
    with pytest.warns(UserWarning, match="ran eager's batch norm"):
        fused_y, fused_g = _step(res.model, inputs, True, True)
    eager_y, eager_g = _step(eager, inputs, True, True)
    nodes = [getattr(getattr(n, "kernel", None), "name", None) or type(n).__name__
             for n in autograd_nodes(fused_y)]
    assert not any("bn_act" in n or "bn_silu[" in n or "bn_train[" in n for n in nodes), nodes
    assert "NativeBatchNormBackward0" in nodes
    if name != "tv_mobilenet_v2":
        return
    torch.testing.assert_close(fused_y, eager_y, rtol=0, atol=0)
    for a, b in zip(fused_g, eager_g):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(res.model.buffers(), eager.buffers()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_nchw_under_autocast():
    _check("tv_efficientnet", channels_last=False)


def test_triton_kernels_under_autocast(monkeypatch):
    """What fused mode binds on CUDA (Triton act, SE gate and BN+act kernels), interpreted on
    CPU: bf16 activations against fp32 parameters, as autocast hands them over."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted_triton()
    impls = {"silu": "triton", "se_gate": "triton", "bias_gelu": "triton", "bn_act": "triton"}
    ran = _check("tv_efficientnet", impls)
    assert any("bn_act_triton" in n for n in ran), ran
    assert any("SEGateTriton" in n or "triton" in n for n in ran if "bn_act" not in n), ran


def test_triton_llama_kernels_under_autocast(monkeypatch):
    """The rms_norm and glu Triton kernels (glu: fused mode's CUDA binding; rms_norm there on
    request, impls={"rms_norm": "triton"}), interpreted on CPU, inside a LLaMA-like step under
    bf16 autocast."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    interpreted_triton()
    ran = _check("llama_torch_rmsnorm", {"glu": "triton", "rms_norm": "triton"})
    assert "glu_mlp[silu,triton]" in ran, ran
    assert "RMSNormTritonFunctionBackward" in ran, ran


# --- the BN + activation kernel by name: --fused-bn-act -------------------------------------

def _prepare(value, monkeypatch, interpret: bool):
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model = create_model("efficientnet_b0").train()
    x = torch.randn(2, 3, 32, 32)
    events = EventLog()
    call = get_mode("fused").prepare(model, (x,), {"bench": "train", "fused_bn_act": value},
                                     events)
    y = call(x)
    names = [getattr(getattr(n, "kernel", None), "name", "") for n in autograd_nodes(y)]
    return [(e.category, e.message) for e in events.events()], names


@pytest.mark.parametrize("value, kernel", [("aten", "bn_silu[function]"),
                                           ("cpu", "bn_act_cpu:silu"), ("auto", "bn_act_cpu:silu")])
def test_fused_bn_act_option_picks_the_kernel(value, kernel, monkeypatch):
    events, names = _prepare(value, monkeypatch, interpret=False)
    shown = "cpu" if value == "auto" else value
    assert ("info", f"bn_act: kernel = '{shown}'") in events
    assert any(kernel in n for n in names), names


def test_fused_bn_act_triton_runs_it_or_says_why_not(monkeypatch):
    interpreted_triton()
    events, names = _prepare("triton", monkeypatch, interpret=True)
    assert ("info", "bn_act: kernel = 'triton'") in events
    assert any("bn_act_triton:silu" in n for n in names), names
    # no GPU and no interpreter: aten's sequence, said as a kernel_fallback event
    events, names = _prepare("triton", monkeypatch, interpret=False)
    assert any(c == "kernel_fallback" and "bn_act 'triton' unavailable" in m for c, m in events)
    assert not any("bn_act_triton" in n for n in names)


def test_fused_bn_act_bad_value_is_one_usage_line():
    from typer.testing import CliRunner

    from fusebench.cli import app
    r = CliRunner().invoke(app, ["run", "efficientnet_b0", "-m", "fused", "--fused-bn-act",
                                 "cuda", "--no-save"])
    assert r.exit_code == 2
    assert "fused_bn_act='cuda'" in r.output and "valid: auto, aten, cpu, triton" in r.output
    assert "Traceback" not in r.output
