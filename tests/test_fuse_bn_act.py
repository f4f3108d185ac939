"""The bn_act kernel inside fused mode: bn_silu (zoo ConvBNAct) and the graph bn_act pattern
(BatchNorm2d -> SiLU / ReLU / GELU in user code) run the C++ kernel on CPU (its name on the
autograd node, its calls counted), match eager in both memory formats, update the running
statistics as eager does, and an unbuildable kernel is a kernel_fallback event."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from fusebench.kernels.bn_act import cpu as bn_act_cpu
from fusebench.measure.events import EventLog
from fusebench.models import create_model
from fusebench.modes import get_mode
from tests.helpers import assert_matches_eager, autograd_nodes


@pytest.fixture
def built():
    ok, reason = bn_act_cpu.build()
    if not ok:
        pytest.skip(reason)


def kernel_names(y) -> list[str]:
    """The fused Functions' kernels in y's graph (a residual's: an MBConv's skip added in its
    projection's BN kernel)."""
    return [n.kernel.name for n in autograd_nodes(y)
            if type(n).__name__ in ("MultiOpFunctionBackward", "ResidualOpFunctionBackward")]


def step(model, ref, x, tol):
    """assert_matches_eager, and the BN running statistics (buffers) agree too."""
    y = assert_matches_eager(model, ref, (x,), tol)
    for (n, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, atol=tol, rtol=tol, msg=n)
    return y


class BnActs(nn.Module):
    """BatchNorm2d -> act spelled as functions and modules, as user code writes them."""

    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)
        self.c2, self.b2 = nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6)
        self.c3, self.b3, self.a3 = nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6), nn.GELU("tanh")
        self.c4, self.b4 = nn.Conv2d(6, 6, 1), nn.BatchNorm2d(6, momentum=None)

    def forward(self, x):
        x = F.relu(self.b1(self.c1(x)))
        x = F.gelu(self.b2(self.c2(x)))
        x = self.a3(self.b3(self.c3(x)))
        return F.silu(self.b4(self.c4(x)))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_graph_bn_act_runs_the_kernel_per_activation(built, channels_last):
    torch.manual_seed(0)
    model = BnActs().double().train()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites == {"bn_act": 4, "conv1x1": 3}   # c2..c4 are pointwise
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    if channels_last:
        model, ref = (m.to(memory_format=torch.channels_last) for m in (model, ref))
        x = x.contiguous(memory_format=torch.channels_last)
    for _ in range(2):                 # second step: running statistics (and momentum=None)
        model.zero_grad()
        ref.zero_grad()
        y = step(model, ref, x, 1e-9)
    assert sorted(kernel_names(y)) == sorted(
        f"bn_act[bn_act_cpu:{a}]" for a in ("relu", "gelu", "gelu_tanh", "silu"))


@pytest.mark.parametrize("channels_last", [pytest.param(False, marks=pytest.mark.slow), True],
                         ids=["nchw", "channels_last"])   # NCHW: test_fuser counts the calls too
def test_efficientnet_bn_silu_calls_the_kernel(built, channels_last, monkeypatch):
    """Both layouts (float64: the float32 kernel is held to the reference in
    test_kernels_bn_act): every bn_silu site calls the C++ forward and backward once."""
    calls = {"forward": 0, "backward": 0}
    ext = bn_act_cpu.extension()
    for name in calls:
        real = getattr(ext, name)

        def counted(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)
        monkeypatch.setattr(ext, name, counted)
    torch.manual_seed(0)
    model = create_model("efficientnet_b0", num_classes=10).double().train()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)    # 64 px: see test_fuser.IMAGE_PX
    if channels_last:
        model, ref = (m.to(memory_format=torch.channels_last) for m in (model, ref))
        x = x.contiguous(memory_format=torch.channels_last)
    y = step(model, ref, x, 1e-9)
    assert kernel_names(y).count("bn_silu[bn_act_cpu:silu]") == res.sites["bn_silu"]
    # the projections' BN (no activation): bn_train, the same kernel with the identity act
    assert kernel_names(y).count("bn_train[bn_act_cpu:identity]") == res.sites["bn_train"] > 0
    n = res.sites["bn_silu"] + res.sites["bn_train"]
    assert calls == {"forward": n, "backward": n}


def test_kernel_is_named_and_a_failed_build_is_a_fallback_event(monkeypatch):
    model = create_model("efficientnet_b0", num_classes=10).train()
    events = EventLog()
    get_mode("fused").prepare(model, (torch.randn(1, 3, 32, 32),), {"bench": "train"}, events)
    info = [e.message for e in events.events() if e.category == "info"]
    if bn_act_cpu.build()[0]:
        assert "bn_act: kernel = 'cpu'" in info, info
    monkeypatch.setattr(bn_act_cpu, "build", lambda: (False, "cannot build: no g++"))
    model = create_model("efficientnet_b0", num_classes=10).train()
    events = EventLog()
    get_mode("fused").prepare(model, (torch.randn(1, 3, 32, 32),), {"bench": "train"}, events)
    fb = [e.message for e in events.events() if e.category == "kernel_fallback"]
    assert any("bn_act 'cpu'" in m and "no g++" in m and "ran 'aten'" in m for m in fb), fb
    y = model(torch.randn(2, 3, 32, 32))
    assert "bn_silu[function]" in kernel_names(y)
    assert not any("bn_act_cpu" in n for n in kernel_names(y))


def test_bfloat16_runs_eagers_batch_norm_and_act_and_says_so(built):
    """A dtype the kernel does not compute runs eager's own ops (no Function of ours around
    aten's: under CPU autocast that cast and copied, thirty-fourth session): eager's numbers,
    bit for bit, and the warning says what ran."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.SiLU()).train()
    eager = copy.deepcopy(model).bfloat16()
    fuse(model, "train")
    x = torch.randn(2, 3, 4, 4, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="does not take this input .* ran eager's batch norm"):
        y = model.bfloat16()(x)
    assert not kernel_names(y)
    torch.testing.assert_close(y, eager(x), rtol=0, atol=0)
    torch.testing.assert_close(model[1].running_var, eager[1].running_var, rtol=0, atol=0)


class PointNetish(nn.Module):
    """BatchNorm1d as point-cloud and audio code writes it: Conv1d -> BatchNorm1d -> act over
    (N, C, L); over a transposed (N, L, C) ("nlc": channels-last rows); and on (N, C) rows
    after a max over the points (F.relu(bn(x)) as PointNet's head writes it, the Linear after)."""

    def __init__(self, layout: str):
        super().__init__()
        self.layout = layout
        self.c1, self.b1 = nn.Conv1d(3, 8, 1), nn.BatchNorm1d(8)
        self.c2, self.b2 = nn.Conv1d(8, 12, 3, padding=1), nn.BatchNorm1d(12)
        if layout == "nlc":
            self.lin, self.b3 = nn.Linear(12, 12), nn.BatchNorm1d(12)
        self.b4, self.head = nn.BatchNorm1d(12), nn.Linear(12, 5)

    def forward(self, x):                                    # (N, 3, L)
        x = F.relu(self.b1(self.c1(x)))
        x = F.silu(self.b2(self.c2(x)))
        if self.layout == "nlc":
            x = F.gelu(self.b3(self.lin(x.transpose(1, 2)).transpose(1, 2)))
        x = F.relu(self.b4(x.amax(-1)))                      # (N, C) rows
        return self.head(x)


@pytest.mark.parametrize("layout", ["ncl", "nlc"])
def test_batchnorm1d_runs_the_kernel_over_its_input_viewed_as_an_image(built, layout):
    """(N, C, L) as (N, C, L, 1), a transposed one as channels-last rows, (N, C) as (1, C, N,
    1): the kernel's own statistics are the batch norm's over N [and L]; outputs, gradients and
    running statistics as eager's for two steps."""
    torch.manual_seed(0)
    model = PointNetish(layout).double().train()
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm1d)):
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    ref = copy.deepcopy(model)
    n = 3 + (layout == "nlc")
    assert fuse(model, "train").sites == {"bn_act": n}
    x = torch.randn(4, 3, 10, dtype=torch.float64)
    for _ in range(2):
        model.zero_grad()
        ref.zero_grad()
        y = step(model, ref, x, 1e-9)
    acts = ["relu", "silu", "relu", *(["gelu"] if layout == "nlc" else [])]
    assert sorted(kernel_names(y)) == sorted(f"bn_act[bn_act_cpu:{a}]" for a in acts)


def test_a_batchnorm1d_after_a_linear_is_left_to_aten_with_the_reason():
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    result = fuse(model, "train")
    assert not result.sites
    assert any(k == "not_fused" and "a BatchNorm1d on a Linear's (N, C) rows" in m
               for k, m in result.notes), result.notes


def test_batchnorm1d_on_the_triton_kernel_interpreted(monkeypatch):
    """The same views through the Triton kernel (TRITON_INTERPRET=1): its strides come from
    the layout, so (N, C, L, 1) and (1, C, N, 1) index as NCHW planes and channels-last rows."""
    from tests.helpers import interpreted_triton
    interpreted_triton()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch.manual_seed(0)
    model = PointNetish("nlc").train()
    ref = copy.deepcopy(model).double()
    fuse(model, "train", impls={"bn_act": "triton"})
    x = torch.randn(4, 3, 10)
    y = model(x)
    r = ref(x.double())
    torch.testing.assert_close(y.double(), r, atol=1e-5, rtol=1e-5)
    y.square().mean().backward()
    r.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert sorted(kernel_names(y)) == sorted(
        f"bn_act[bn_act_triton:{a}]" for a in ("relu", "silu", "gelu", "relu"))
