"""The op fuser on every zoo family at tiny sizes: same outputs and gradients as eager, the same
Parameters under the same names, the fused kernels really in the autograd graph, coverage events,
and a kernel fallback that is an event, never silent."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from fusebench.fuse import FusedModule, fuse
from fusebench.fuse.fusions.ln2d import FusedLayerNorm2d
from fusebench.measure import correctness as corr
from fusebench.measure.events import EventLog
from fusebench.measure.memory import SavedTensorBytes
from fusebench.models import create_model, get_model_info, list_models
from fusebench.modes import get_mode
from tests.helpers import autograd_nodes


def smallest_per_family() -> list[str]:
    by_family: dict[str, str] = {}
    for name in list_models():               # sorted; keep the first name of each family
        by_family.setdefault(get_model_info(name).family, name)
    return sorted(by_family.values())


SMALL = {"convnext": "convnext_atto", "efficientnet": "efficientnet_b0"}
FAMILY_MODELS = sorted({SMALL.get(get_model_info(m).family, m) for m in smallest_per_family()})
IMAGE_PX = {"efficientnet": 64}
EXPECTED = {"convnext_atto": {"ln2d", "mlp", "dwconv"},
            "efficientnet_b0": {"bn_silu", "bn_train", "se_gate", "dwconv"}}


def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    return create_model(name, num_classes=10).double()


def graph_nodes(y: torch.Tensor) -> set[str]:
    return {type(node).__name__ for node in autograd_nodes(y)}


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_train_fusion_matches_eager_and_really_runs(name):
    model = build(name).train()
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    result = fuse(model, "train")
    assert set(result.sites) >= EXPECTED.get(name, set()), result.sites
    # the same Parameters under the same names: optimizers and wrappers see them
    assert all(params[n] is p for n, p in model.named_parameters())
    assert params.keys() == dict(model.named_parameters()).keys()
    # EfficientNet at 32 px ends in 1x1 maps, BN over 2 values per channel: there eager itself
    # turns a 1e-15 relative change of x into 1.6e-7 at the output (1e-13 at 64 px), so only
    # a kernel bit-identical to aten's could pass at 32 px
    px = IMAGE_PX.get(get_model_info(name).family, 32)
    x = torch.randn(2, 3, px, px, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for _ in range(2):      # second step: BN running stats updated identically
        model.zero_grad()
        ref.zero_grad()
        y, r = model(x), ref(x)
        torch.testing.assert_close(y, r, atol=1e-10, rtol=1e-9)
        nodes = graph_nodes(y)
        assert "MultiOpFunctionBackward" in nodes, sorted(nodes)
        if "dwconv" in result.sites:
            assert "DwConvCpuFunctionBackward" in nodes, sorted(nodes)
        if "ln2d" in result.sites:
            assert nodes & {"GeneratedBackwardFor_fusebench_ln2d_cpu_forward_defaultBackward",
                            "LN2dFunctionBackward", "LN2dTritonFunctionBackward",
                            "LN2dCpuFunctionBackward"}, sorted(nodes)
        y.square().mean().backward()
        r.square().mean().backward()
        got = {n: p.grad for n, p in model.named_parameters()}
        exp = {n: p.grad for n, p in ref.named_parameters()}
        assert max(corr.grad_errs(got, exp, list(exp), floor=1e-3).values()) < 1e-9
    for (n, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, msg=n)


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_infer_fusion_folds_on_a_copy(name):
    model = build(name).eval()
    state = copy.deepcopy(model.state_dict())
    result = fuse(model, "infer")
    assert result.model is not model
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # untouched
    assert not any(isinstance(m, FusedModule) for m in model.modules())
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x), atol=1e-10, rtol=1e-9)
    if get_model_info(name).family == "efficientnet":
        assert result.sites["conv_bn_fold"] > 0


def fused_kernel_names(y: torch.Tensor) -> list[str]:
    """The MultiOpKernel each MultiOpFunction node ran (a custom Function's grad_fn is its ctx)."""
    return [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ == "MultiOpFunctionBackward"]


def test_bound_act_kernels_really_run(monkeypatch):
    """The act kernels bound at fuse time are the ones called, in forward and in backward:
    count calls of the act families' pure functions (function impl), of the C++ se_gate and
    of the C++ bn_act (BN + SiLU) kernel."""
    import importlib
    calls: dict[str, int] = {}

    def spy(obj, name):
        fn = getattr(obj, name)

        def wrapped(*a, **k):
            calls[name] = calls.get(name, 0) + 1
            return fn(*a, **k)
        monkeypatch.setattr(obj, name, wrapped)

    for mod, names in (("silu", ("silu_fwd", "silu_bwd")),
                       ("bias_gelu", ("bias_gelu_fwd", "bias_gelu_bwd"))):
        for n in names:
            spy(importlib.import_module(f"fusebench.kernels.{mod}.function"), n)
    from fusebench.kernels.act import cpu as act_cpu
    from fusebench.kernels.bn_act import cpu as bn_act_cpu
    if act_cpu.build()[0]:
        for n in ("se_gate_forward", "se_gate_backward", "bias_gelu_forward",
                  "bias_gelu_backward"):
            spy(act_cpu.extension(), n)
    bn_built = bn_act_cpu.build()[0]
    if bn_built:
        for n in ("forward", "backward"):
            spy(bn_act_cpu.extension(), n)
    bn_silu = "bn_silu[bn_act_cpu:silu]" if bn_built else "bn_silu[function]"
    bn_train = "bn_train[bn_act_cpu:identity]" if bn_built else "bn_train[identity]"
    x = torch.randn(2, 3, 32, 32)
    # at 32 px the SEs of the first stages fold into their projections (H*W >= out channels:
    # se_project, its (N, R) SiLU the silu pair), the later ones run the se_gate kernel
    for name, expect in (("efficientnet_b0", {bn_silu, bn_train, "se_gate[cpu,function]",
                                              "se_project[function]"}),
                         ("convnext_atto", {"mlp[conv2d,gelu[none]]"})):
        calls.clear()
        model = create_model(name, num_classes=10).train()
        res = fuse(model, "train")
        if not act_cpu.build()[0]:
            expect = {e.replace("[cpu]", "[function]").replace("[cpu,", "[function,")
                      .replace("cpu|", "function|") for e in expect}
        y = model(x)
        kernels = fused_kernel_names(y)
        assert set(kernels) == expect, kernels
        y.sum().backward()
        if name == "efficientnet_b0":
            n_act = res.sites["bn_silu"]               # one BN+SiLU fwd + bwd per site
            if bn_built:                               # and one BN (identity act) per bn_train
                n_bn = n_act + res.sites["bn_train"]
                assert calls["forward"] == calls["backward"] == n_bn, calls
            else:
                assert calls["silu_fwd"] >= n_act and calls["silu_bwd"] >= n_act, calls
            if act_cpu.build()[0]:
                assert calls["se_gate_forward"] == calls["se_gate_backward"] \
                    == kernels.count("se_gate[cpu,function]") > 0, calls
            assert (kernels.count("se_project[function]")
                    + kernels.count("se_gate[cpu,function]")
                    == res.sites["se_project"] == res.sites["se_gate"])
        else:        # C++ on the channels-last output of the cpu LN2d, plain torch on NCHW
            # one forward per site: backward's recompute of the GELU output rides in the
            # backward's own call (bwd_y), not a second forward
            n = res.sites["mlp"]
            fwd = calls.get("bias_gelu_fwd", 0) + calls.get("bias_gelu_forward", 0)
            bwd = calls.get("bias_gelu_bwd", 0) + calls.get("bias_gelu_backward", 0)
            assert fwd == n and bwd == n, calls


def test_fused_activations_are_smaller():
    """Fused ops keep fewer activation bytes than eager (EfficientNet: BN output not kept;
    ConvNeXt: GELU output not kept)."""
    for name in ("efficientnet_b0", "convnext_atto"):
        model = create_model(name, num_classes=10).train()
        x = torch.randn(2, 3, 64, 64)
        sizes = []
        for m in (model, fuse(copy.deepcopy(model), "train").model):
            counter = SavedTensorBytes(exclude=list(m.parameters()))
            with counter.track():
                m(x)
            sizes.append(counter.bytes)
        assert sizes[1] < 0.85 * sizes[0], (name, sizes)


def test_mode_records_coverage_events():
    mode = get_mode("fused")
    model = build("convnext_atto").float()
    events = EventLog()
    mode.prepare(model, (torch.randn(1, 3, 32, 32),), {"bench": "train"}, events)
    by_kind: dict[str, list] = {}
    for e in events.events():
        by_kind.setdefault(e.category, []).append(e)
    fusion = {e.message for e in by_kind["fusion"]}
    assert {"ln2d: 17 sites", "mlp: 12 sites", "dwconv: 12 sites",
            "patchify: 4 sites"} <= fusion, fusion      # patchify: the stem + 3 downsamples
    assert all(e.source == "fuser" for e in by_kind["fusion"])
    unfused, = by_kind["unfused"]       # the head's pool and Linear
    assert unfused.message == "left unfused: AdaptiveAvgPool2d x1, Linear x1"
    assert unfused.count == 2


def test_mode_on_a_model_without_patterns_says_zero_sites():
    events = EventLog()
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    get_mode("fused").prepare(model, (torch.randn(1, 3, 8, 8),), {"bench": "train"}, events)
    assert any(e.category == "fusion" and e.message.startswith("0 sites") for e in events.events())


def test_ln2d_kernel_fallback_is_an_event(monkeypatch):
    from fusebench.kernels.ln2d import auto as ln_auto
    monkeypatch.setattr(ln_auto, "resolve", lambda device, build=True: (None, "cpu: no g++"))
    events = EventLog()
    model = build("convnext_atto").float()
    get_mode("fused").prepare(model, (torch.randn(1, 3, 32, 32),), {"bench": "train"}, events)
    fb = [e for e in events.events() if e.category == "kernel_fallback"]
    assert fb and "ran 'function'" in fb[0].message and "no g++" in fb[0].message
    assert all(m.impl == "function" for m in model.modules()
               if isinstance(m, FusedLayerNorm2d))


def test_sequential_conv_bn_is_folded_for_user_models():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    model[1].running_mean.uniform_()
    result = fuse(model, "infer")
    assert result.sites == {"conv_bn_fold_seq": 1}
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(result.model(x), model(x), atol=1e-5, rtol=1e-5)
