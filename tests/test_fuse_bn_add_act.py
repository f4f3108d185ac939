"""The graph pattern bn_add_act: a residual block's end, BatchNorm2d -> + residual [-> act], in
ResNet's spellings (`out += identity; relu(out)`, `F.relu(torch.add(identity, out))`) and an
inverted residual's `x + bn(conv(x))`: one site each, the bn_act kernel really called with the
residual (C++, and Triton under the interpreter), forward and every gradient (the residual's
included) equal to float64 eager, in both layouts; frozen statistics, a broadcasting residual
and what does not fuse."""
from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse, recompute
from fusebench.kernels.bn_act import cpu as bn_act_cpu
from tests.helpers import assert_matches_eager, autograd_nodes, random_running_stats

sys.path.insert(0, str(Path(__file__).parent))
from assets import tv_resnet  # noqa: E402


class Block(nn.Module):
    """conv -> BN -> + x -> act, the act and the add spelled as `act` and `add` say."""

    def __init__(self, c=8, act=nn.ReLU(), add="inplace"):
        super().__init__()
        self.conv, self.bn, self.act, self.add = nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c), \
            act, add

    def forward(self, x):
        out = self.bn(self.conv(x))
        if self.add == "inplace":
            out += x
        elif self.add == "torch_add_swapped":
            out = torch.add(x, out)
        elif self.add == "method":
            out = out.add(x)
        return self.act(out) if self.act is not None else out


def _build(factory, dtype=torch.float64):
    torch.manual_seed(0)
    model = factory().to(dtype).train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)
    return model


def _x(dtype=torch.float64, layout="nchw", shape=(2, 8, 6, 5)):
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    return x.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else x


@pytest.fixture
def kernel_calls(monkeypatch):
    """The bn_act C++ kernel's forward calls that carried a residual, and its backward calls
    (given the residual, the forward's output for ReLU / ReLU6, or neither for the identity,
    whose residual gradient is dy)."""
    calls = {"forward": 0, "backward": 0, "backward from output": 0}
    for name in ("forward", "backward"):
        real = getattr(bn_act_cpu, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls[_name] += _name == "backward" or kw.get("residual") is not None
            calls["backward from output"] += kw.get("output") is not None
            return _real(*args, **kw)
        monkeypatch.setattr(bn_act_cpu, name, spy)
    return calls


class Swish(nn.Module):                # the sum read twice by a written-out SiLU
    def __init__(self, c=8):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        s = self.bn(x) + x
        return s * torch.sigmoid(s)


SPELLINGS = {
    "relu_inplace_add": lambda: Block(),
    "silu_torch_add_swapped": lambda: Block(act=nn.SiLU(), add="torch_add_swapped"),
    "gelu_method_add": lambda: Block(act=nn.GELU(), add="method"),
    "functional_relu6": lambda: Block(act=F.relu6),
    "no_act": lambda: Block(act=None),      # an inverted residual's projection
    "written_out_swish": Swish,
}


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_each_spelling_is_one_site_that_runs_the_kernel_and_matches_eager(name, layout,
                                                                           kernel_calls):
    model = _build(SPELLINGS[name])
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"bn_add_act": 1}, result.sites
    x = _x(layout=layout).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no silent fallback to aten's sequence
        assert_matches_eager(model, ref, (x,), call=lambda t: model(t))
    ref(xr).square().mean().backward()
    x.grad = None
    model(x).square().mean().backward()        # the residual's (the input's) gradient too
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-9, rtol=1e-9)
    from_output = 2 if name in ("relu_inplace_add", "functional_relu6") else 0
    assert kernel_calls == {"forward": 2, "backward": 2, "backward from output": from_output}
    for b, r in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, r)


def test_a_resnet_runs_every_block_end_in_the_kernel(kernel_calls):
    model = _build(tv_resnet.make)
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["bn_add_act"] == 5
    y = assert_matches_eager(model, ref, (_x(shape=(2, 3, 32, 32)),))
    # every block end's backward reads act' off its output (the other 15 BN sites: no residual)
    assert (kernel_calls["forward"], kernel_calls["backward from output"]) == (5, 5)
    names = [n.kernel.name for n in autograd_nodes(y)
             if type(n).__name__ == "ResidualOpFunctionBackward"]
    assert names == ["bn_add_act[bn_act_cpu:relu]"] * 5, names


def test_frozen_statistics_add_the_residual_to_the_running_affine():
    """BNs in eval mode inside a training run (a fine-tuned detection backbone): the site runs
    act(x * scale + shift + r) with the running statistics, which it leaves untouched."""
    model = random_running_stats(_build(tv_resnet.make), freeze=True)
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["bn_add_act"] == 5
    y = assert_matches_eager(model, ref, (_x(shape=(2, 3, 32, 32)),))
    names = {n.kernel.name for n in autograd_nodes(y)
             if type(n).__name__ == "ResidualOpFunctionBackward"}
    assert names == {"bn_eval_act[relu]"}, names
    for b, r in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, r)


class Broadcast(nn.Module):             # BN + a learned (C, 1, 1) map: no kernel residual
    def __init__(self, c=8):
        super().__init__()
        self.bn, self.offset = nn.BatchNorm2d(c), nn.Parameter(torch.randn(c, 1, 1))

    def forward(self, x):
        return F.relu(self.bn(x) + self.offset)


def test_a_broadcasting_residual_runs_atens_sequence_and_says_so(kernel_calls):
    model = _build(Broadcast)
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"bn_add_act": 1}
    with pytest.warns(UserWarning, match=r"does not take this input \(a residual of"):
        assert_matches_eager(model, ref, (_x(),))
    assert kernel_calls == {"forward": 0, "backward": 0, "backward from output": 0}


class TwiceUsed(nn.Module):             # the BN output also leaves the block
    def __init__(self, c=8):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        y = self.bn(x)
        return F.relu(y + x), y


class SumUsedTwice(nn.Module):          # the pre-activation sum also leaves the block
    def __init__(self, c=8):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        s = self.bn(x) + x
        return F.relu(s), s


class Scaled(nn.Module):                # torch.add(..., alpha=0.5): not a residual add
    def __init__(self, c=8):
        super().__init__()
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(torch.add(x, self.bn(x), alpha=0.5))


@pytest.mark.parametrize("cls, reason, sites", [
    (TwiceUsed, "the BatchNorm output is used elsewhere too", {"bn_train": 1}),
    (SumUsedTwice, None, {"bn_add_act": 1}),
    (Scaled, None, {"bn_train": 1})])
def test_what_does_not_fuse_is_a_reason_or_no_candidate(cls, reason, sites):
    """A sum used besides the act still fuses BN + add (the identity act); the act stays
    aten's."""
    model = _build(cls)
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == sites, result.sites
    said = [m for c, m in result.notes if c == "not_fused" and m.startswith("bn_add_act")]
    assert (reason in said[0]) if reason else not said, said
    y, yr = model(_x()), ref(_x())
    for a, b in zip(y, yr):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_the_triton_kernel_runs_the_residual_under_the_interpreter(layout, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from fusebench.kernels.bn_act import triton as bn_act_triton
    ok, why = bn_act_triton.available("cpu")
    if not ok:
        pytest.skip(why)
    model = _build(lambda: tv_resnet.make("tiny_basic"), torch.float32)
    ref = copy.deepcopy(model).double()
    result = fuse(model, "train", impls={"bn_act": "triton"})
    assert result.sites["bn_add_act"] == 5
    x = _x(torch.float32, layout, (2, 3, 32, 32))
    y = model(x)
    names = {n.kernel.name for n in autograd_nodes(y)
             if type(n).__name__ == "ResidualOpFunctionBackward"}
    assert names == {"bn_add_act[bn_act_triton:relu]"}, names
    torch.testing.assert_close(y.double(), ref(x.double()), atol=1e-4, rtol=1e-4)
    y.square().mean().backward()
    ref(x.double()).square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        err = ((p.grad.double() - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-3))
        assert err < 1e-3, (n, err.item())


def test_the_output_is_tagged_with_a_rebuild_that_adds_the_residual():
    """With recipes on (--fused-recompute), a consumer rebuilds the site's output from the BN
    input, the statistics and the residual: the same values."""
    model = _build(lambda: Block(act=nn.SiLU()))
    fuse(model, "train")
    x = _x().requires_grad_()
    y = model(x)
    recipe = recompute.recipe_of(y, "dwconv")
    assert recipe is not None and len(recipe.tensors) == 6
    torch.testing.assert_close(recipe(*recipe.tensors), y.detach(), atol=0, rtol=0)


@pytest.mark.slow
def test_resnet_parts_benchmark_runs_at_a_tiny_size(capsys):
    from tests.helpers import load_benchmark
    bench = load_benchmark("resnet_parts")
    assert bench.main(["--depth", "tiny", "--rounds", "2", "--img", "32", "--threads", "1",
                       "--skip-kernels"]) == 0
    out = capsys.readouterr().out
    assert out.count("without / with bn_add_act:") == 2 and "bn_add_act': 5" in out
