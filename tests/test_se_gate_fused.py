"""The fused squeeze-excitation (module rule se_gate.py and graph pattern fx_se.py) against eager
float64 in channels-last and NCHW: forward, dx (the gate's dx with the mean's gradient added in
place) and the reduce / expand gradients; the fused Function really ran."""
import copy

import pytest
import torch
import torch.nn as nn

from fusebench.fuse import fuse
from fusebench.models.layers import SqueezeExcite
from tests.helpers import autograd_nodes


class GraphSE(nn.Module):
    """The same SE spelled with adaptive_avg_pool2d and a sigmoid module: the graph pattern."""

    def __init__(self, c, r):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1, self.fc2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
        self.act, self.gate = nn.SiLU(), nn.Sigmoid()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))


class HardGraphSE(GraphSE):
    """torchvision's MobileNetV3 SqueezeExcitation: ReLU inside, a Hardsigmoid gate, `scale * x`
    (binding.hard_gate)."""

    def __init__(self, c, r):
        super().__init__(c, r)
        self.act, self.gate = nn.ReLU(), nn.Hardsigmoid()
        with torch.no_grad():              # logits on both clamps (|g| > 3) and between
            self.fc2.bias.copy_(torch.linspace(-5, 5, c))

    def forward(self, x):
        return self.gate(self.fc2(self.act(self.fc1(self.pool(x))))) * x


class SENetSE(nn.Module):
    """SENet's: Linear layers on `pool(x).view(b, c)`, the gate viewed back. Its Linear -> ReLU
    -> Linear is the SE's, not an mlp site (fx_mlp._gates_an_se)."""

    def __init__(self, c, r):
        super().__init__()
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Sequential(nn.Linear(c, r), nn.ReLU(inplace=True), nn.Linear(r, c),
                                nn.Sigmoid())

    def forward(self, x):
        b, c = x.shape[:2]
        return x * self.fc(self.avg_pool(x).view(b, c)).view(b, c, 1, 1)


@pytest.mark.parametrize("make, site, kernel", [(SqueezeExcite, "se_gate", "se_gate[cpu,"),
                                                (GraphSE, "se_gate", "se_gate[cpu,"),
                                                (HardGraphSE, "se_gate", "se_gate[cpu:hard,"),
                                                (SENetSE, "se_gate", "se_gate[cpu,")])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_fused_se_matches_eager_float64(make, site, kernel, layout):
    torch.manual_seed(0)
    model = nn.Sequential(make(24, 6)).double()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {site: 1}
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(2, 24, 5, 7, dtype=torch.float64).contiguous(memory_format=fmt)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, r = model(xa), ref(xb)
    names = [n.kernel.name for n in autograd_nodes(y)
             if type(n).__name__ == "MultiOpFunctionBackward"]
    assert len(names) == 1 and names[0].startswith(kernel), names
    torch.testing.assert_close(y, r, atol=1e-12, rtol=1e-10)
    dy = torch.randn(y.shape, dtype=torch.float64)
    y.backward(dy), r.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-12, rtol=1e-10)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-12, rtol=1e-10)


class _OpLog(torch.utils._python_dispatch.TorchDispatchMode):
    """The aten overload packets dispatched while active."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.overloadpacket)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make", [SqueezeExcite, GraphSE])
def test_fused_se_reduce_expand_are_matrix_products(make):
    """reduce/expand on the (N, C) means: no convolution forward or backward (oneDNN's 1x1 conv
    on (N, C, 1, 1) cost 0.1-0.5 ms a call for microseconds of work); the eager SE does."""
    torch.manual_seed(0)
    model = nn.Sequential(make(24, 6))
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = torch.randn(2, 24, 5, 5).contiguous(memory_format=torch.channels_last)
    convs = {torch.ops.aten.convolution, torch.ops.aten.convolution_backward}
    logs = {}
    for name, m in (("fused", model), ("eager", ref)):
        with _OpLog() as log:
            m(x.clone().requires_grad_()).sum().backward()
        logs[name] = log.ops
    assert not logs["fused"] & convs
    assert logs["fused"] & {torch.ops.aten.mm, torch.ops.aten.addmm}
    assert logs["eager"] & convs          # the probe sees convs where they run
