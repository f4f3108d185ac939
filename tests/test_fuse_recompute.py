"""Recompute instead of save (fuse/recompute.py): a fused BN + act output that feeds the fused
depthwise conv or the fused SE is not kept for backward; the consumer saves the BN input and
statistics (already saved by the BN + act node) and rebuilds its input. Checked: the conv nodes really carry the
recipe, gradients match float64 eager (zoo EfficientNet and the torchvision-style asset, C++
kernel and aten's sequence), activation bytes drop, and an output changed in place is saved
as before."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse, recompute
from fusebench.kernels.bn_act import cpu as bn_act_cpu
from fusebench.kernels.dwconv import cpu as dw_cpu
from fusebench.measure import correctness as corr
from fusebench.measure.memory import SavedTensorBytes
from fusebench.models import create_model
from tests.helpers import autograd_nodes

sys.path.insert(0, str(Path(__file__).parent))
from assets import tv_efficientnet  # noqa: E402


@pytest.fixture(autouse=True)
def built():
    for mod in (bn_act_cpu, dw_cpu):
        ok, reason = mod.build()
        if not ok:
            pytest.skip(reason)


def dw_nodes(y):
    return [n for n in autograd_nodes(y) if type(n).__name__ == "DwConvCpuFunctionBackward"]


def train_step(model, ref, x):
    """Forward + backward of both; the fused model's output and its parameter grad errors."""
    y, r = model(x), ref(x)
    torch.testing.assert_close(y, r, atol=1e-9, rtol=1e-9)
    y.square().mean().backward()
    r.square().mean().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    exp = {n: p.grad for n, p in ref.named_parameters()}
    return y, max(corr.grad_errs(got, exp, list(exp), floor=1e-3).values())


def make(name):
    torch.manual_seed(0)
    if name == "zoo":
        return create_model("efficientnet_b0", num_classes=10).double().train()
    return tv_efficientnet.make().double().train()


@pytest.mark.parametrize("name, impl, channels_last", [
    ("zoo", "cpu", True), pytest.param("zoo", "cpu", False, marks=pytest.mark.slow),
    ("tv", "cpu", False), ("tv", "cpu", True), ("tv", "aten", False), ("tv", "aten", True)])
def test_consumers_rebuild_their_input_and_grads_match(name, impl, channels_last):
    model = make(name)
    ref = copy.deepcopy(model)
    res = fuse(model, "train", impls={"bn_act": impl})
    x = torch.randn(2, 3, 64 if name == "zoo" else 32, 64 if name == "zoo" else 32,
                    dtype=torch.float64)
    if channels_last:
        model, ref = (m.to(memory_format=torch.channels_last) for m in (model, ref))
        x = x.contiguous(memory_format=torch.channels_last)
    y, err = train_step(model, ref, x)
    nodes = dw_nodes(y)
    assert len(nodes) == res.sites["dwconv"] > 0
    # every depthwise conv's input is a fused BN + act output: all rebuild it
    assert all(isinstance(n.recompute, recompute.Recompute) for n in nodes)
    # and every SE's input (a BN + act output too): the engine rebuilds saved entry 0
    se = [n for n in autograd_nodes(y) if type(n).__name__ == "MultiOpFunctionBackward"
          and n.kernel.name.startswith("se")]
    assert len(se) == res.sites.get("se_gate", 0) > 0
    assert all(isinstance(n.recipes[0], recompute.Recompute) for n in se)
    assert err < 1e-9


def consumers(y):
    """(consumer, its saved input or None, its recipe or None) of every depthwise conv and SE."""
    for n in autograd_nodes(y):
        if type(n).__name__ == "DwConvCpuFunctionBackward":
            yield "dwconv", n.saved_tensors[1] if n.recompute is None else None, n.recompute
        elif type(n).__name__ == "MultiOpFunctionBackward" and n.kernel.name.startswith("se"):
            yield "se_gate", n.saved_tensors[0] if n.recipes[0] is None else None, n.recipes[0]


def test_activation_bytes_drop_by_the_consumers_inputs(monkeypatch):
    """Exactly: each depthwise conv's and SE's input is spared, the (C,) weight / bias copies
    are added (the BN input and statistics are the BN + act node's own saved storages).
    Our grad weight at every depthwise conv (3x3 would keep oneDNN's passes, and with nothing
    to rebuild aten's own conv node), so every conv is a DwConvCpuFunction node in both runs."""
    from fusebench.fuse.fusions import dwconv as dwconv_fusion
    monkeypatch.setattr(dwconv_fusion, "passes_for", lambda *a: dwconv_fusion.GRAD_WEIGHT)
    model = make("zoo").to(memory_format=torch.channels_last)
    fuse(model, "train")
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    sizes, delta = {}, 0
    for key in ("save", "recompute"):
        counter = SavedTensorBytes(exclude=list(model.parameters()))
        with (recompute.disabled() if key == "save" else torch.enable_grad()), counter.track():
            y = model(x)
        sizes[key] = counter.bytes
        for _, kept, recipe in consumers(y):
            assert (recipe is None) == (key == "save")
            if key == "save":
                delta += kept.untyped_storage().nbytes()
            else:
                delta -= sum(t.untyped_storage().nbytes() for t in recipe.tensors[3:])
        y.sum().backward()
    assert delta > 0 and sizes["save"] - sizes["recompute"] == delta


@pytest.mark.parametrize("off", ["se_gate", "dwconv"])
def test_one_consumer_can_save_its_input_while_the_other_rebuilds(off, monkeypatch):
    """recompute.disabled((consumer,)): that consumer saves its input, the other still carries
    the recipe; gradients unchanged (the A/B variants of benchmarks/mbconv_recompute.py)."""
    from fusebench.fuse.fusions import dwconv as dwconv_fusion
    monkeypatch.setattr(dwconv_fusion, "passes_for", lambda *a: dwconv_fusion.GRAD_WEIGHT)
    model = make("zoo").to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    with recompute.disabled((off,)):
        y = model(x)
    saves = {}                  # consumer -> {whether each of its nodes saved its input}
    for kind, _, recipe in consumers(y):
        saves.setdefault(kind, set()).add(recipe is None)
    other = ({"se_gate", "dwconv"} - {off}).pop()
    assert saves == {off: {True}, other: {False}}, saves
    y.sum().backward()
    ref(x).sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


class InPlaceAfterAct(nn.Module):
    """BN -> SiLU, its output changed in place, then a depthwise conv: the recipe is stale."""

    def __init__(self):
        super().__init__()
        # 5x5: a conv whose passes are partly ours (3x3 keeps aten's, with no node of ours
        # when there is nothing to rebuild)
        self.bn, self.dw = nn.BatchNorm2d(4), nn.Conv2d(4, 4, 5, padding=2, groups=4)

    def forward(self, x):
        a = F.silu(self.bn(x))
        return self.dw(a.mul_(2.0))


def test_an_output_changed_in_place_is_saved_not_rebuilt():
    torch.manual_seed(0)
    model = InPlaceAfterAct().double().train()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert res.sites["bn_act"] == res.sites["dwconv"] == 1
    y, err = train_step(model, ref, torch.randn(2, 4, 6, 6, dtype=torch.float64))
    (node,) = dw_nodes(y)
    assert node.recompute is None and err < 1e-9


@pytest.mark.parametrize("rebuild", [False, True])
def test_fused_mode_saves_by_default_and_rebuilds_on_request(rebuild, monkeypatch):
    """The mode's `fused_recompute` (default off): every consumer saves its input (none has a
    recipe) or rebuilds it (all do), an event says which, and both match float64 eager."""
    from fusebench.fuse.fusions import dwconv as dwconv_fusion
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    monkeypatch.setattr(dwconv_fusion, "passes_for", lambda *a: dwconv_fusion.GRAD_WEIGHT)
    model = make("zoo").to(memory_format=torch.channels_last)
    ref = copy.deepcopy(model)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64).contiguous(
        memory_format=torch.channels_last)
    events = EventLog()
    fn = get_mode("fused").prepare(model, (x,), {"bench": "train", "fused_recompute": rebuild},
                                   events)
    said = [e.message for e in events.events() if e.message.startswith("recompute")]
    assert len(said) == 1 and ("rebuilt" in said[0]) is rebuild, said
    y = fn(x)
    recipes = [r for _, _, r in consumers(y)]
    assert recipes and all((r is not None) is rebuild for r in recipes)
    torch.testing.assert_close(y, ref(x), atol=1e-9, rtol=1e-9)
    y.square().mean().backward()
    ref(x).square().mean().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    exp = {n: p.grad for n, p in ref.named_parameters()}
    assert max(corr.grad_errs(got, exp, list(exp), floor=1e-3).values()) < 1e-9
