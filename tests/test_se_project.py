"""The SE folded into the 1x1 conv after it (fusions/se_project.py): the zoo's MBConv rule and
the graph se_gate site that absorbs a pointwise conv, against eager float64 in both layouts,
with and without a projection bias; where H*W < the conv's out channels the site runs the SE
gate and the conv instead (`folds`); the gated tensor is not saved; the 1x1 convs around it
are GEMMs on channels-last views (conv1x1.run_conv)."""
import copy
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import conv1x1, fuse
from fusebench.fuse.fusions.se_project import FusedMBConv, folds
from fusebench.measure.memory import SavedTensorBytes
from fusebench.models.layers import MBConv
from tests.helpers import assert_matches_eager, autograd_nodes

LAYOUTS = {"channels_last": torch.channels_last, "nchw": torch.contiguous_format}


def kernels(y) -> Counter:
    return Counter(n.kernel.name.split("[")[0] for n in autograd_nodes(y)
                   if type(n).__name__ == "MultiOpFunctionBackward")


class GraphSEProject(nn.Module):
    """An SE spelled with adaptive_avg_pool2d and a ReLU, then a 1x1 conv (with a bias)."""

    def __init__(self, c, r, out, bias):
        super().__init__()
        self.pool, self.act, self.gate = nn.AdaptiveAvgPool2d(1), nn.ReLU(), nn.Sigmoid()
        self.fc1, self.fc2 = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)
        self.proj = nn.Conv2d(c, out, 1, bias=bias)

    def forward(self, x):
        return self.proj(x * self.gate(self.fc2(self.act(self.fc1(self.pool(x))))))


def _inputs(layout, c=16, hw=(6, 5)):
    x = torch.randn(3, c, *hw, dtype=torch.float64).contiguous(memory_format=LAYOUTS[layout])
    return (x.requires_grad_(),)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out, fold", [(12, True), (70, False)])    # H*W = 30
def test_graph_site_folds_where_it_pays_and_matches_float64(layout, bias, out, fold):
    torch.manual_seed(0)
    model = GraphSEProject(16, 4, out, bias).double().train()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert res.sites == Counter({"se_gate": 1, "se_project": 1}), res.sites
    x = _inputs(layout)[0]
    xa, xb = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    y, r = model(xa), ref(xb)
    torch.testing.assert_close(y, r, atol=1e-12, rtol=1e-10)
    dy = torch.randn_like(r)
    y.backward(dy), r.backward(dy)
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-12, rtol=1e-10)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-12, rtol=1e-10, msg=n)
    assert kernels(y) == Counter({"se_project" if fold else "se_gate": 1}), kernels(y)
    assert y.is_contiguous(memory_format=LAYOUTS[layout])


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_zoo_mbconv_rule_matches_float64_eager_with_residual(layout):
    torch.manual_seed(0)
    model = nn.Sequential(MBConv(8, 8, 3, 1, 4), MBConv(8, 24, 5, 2, 4)).double().train()
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    res = fuse(model, "train")
    assert res.sites["se_project"] == 2 and all(isinstance(b, FusedMBConv) for b in model)
    assert params == dict(model.named_parameters())         # same Parameters, same names
    for _ in range(2):                                       # BN running statistics alike
        model.zero_grad(), ref.zero_grad()
        y = assert_matches_eager(model, ref, _inputs(layout, c=8, hw=(12, 12)))
    # 12x12 -> 144 >= 8 (first), 6x6 = 36 >= 24 (second): both fold
    assert kernels(y)["se_project"] == 2 and kernels(y)["se_gate"] == 0, kernels(y)
    # the first block's skip: added in its projection's BN kernel (one Function, no add)
    skips = [n.kernel.name for n in autograd_nodes(y)
             if type(n).__name__ == "ResidualOpFunctionBackward"]
    assert skips == ["bn_train[bn_act_cpu:identity]"], skips
    assert not any(type(n).__name__ == "AddBackward0" for n in autograd_nodes(y))
    for (n, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, msg=n)


def test_a_live_drop_path_keeps_the_skip_add_outside_the_kernel():
    """Stochastic depth drops the branch per sample while training: the add stays aten's
    there; a rate of 0, or eval, is the identity and folds."""
    from fusebench.fuse.fusions.se_project import _drops_nothing
    from fusebench.models.layers import DropPath
    live = DropPath(0.2)
    assert not _drops_nothing(live.train()) and _drops_nothing(live.eval())
    assert _drops_nothing(DropPath(0.0).train()) and _drops_nothing(nn.Identity())
    torch.manual_seed(0)
    model = MBConv(8, 8, 3, 1, 4, drop_path=0.5).double().train()
    fuse(model, "train")
    y = model(_inputs("nchw", c=8, hw=(12, 12))[0])
    assert not any(type(n).__name__ == "ResidualOpFunctionBackward" for n in autograd_nodes(y))


def test_the_gated_tensor_is_not_saved():
    """Folded, the SE + projection saves x (or its recipe) and (N, C)-sized tensors only: one
    x-sized tensor fewer than the SE gate + conv (the conv saves the gated tensor)."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 16, 16).contiguous(memory_format=torch.channels_last)
    sizes = {}
    for name, only in (("folded", None), ("gate+conv", ["se_gate"])):
        model = GraphSEProject(32, 8, 16, False).train()
        fuse(model, "train", only=only)
        counter = SavedTensorBytes(exclude=list(model.parameters()))
        with counter.track():
            model(x.clone().requires_grad_())
        sizes[name] = counter.bytes
    assert sizes["gate+conv"] - sizes["folded"] >= x.numel() * x.element_size()


@pytest.mark.parametrize("threads, room", [(1, 1), (2, 2)])
def test_folds_only_where_the_per_image_weights_are_not_much_larger_than_x(threads, room):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x, w = torch.randn(2, 8, 4, 4), torch.randn(16 * room, 8, 1, 1)
        assert folds(x, w) and not folds(x, torch.randn(16 * room + 1, 8, 1, 1))
    finally:
        torch.set_num_threads(before)
    x, w = torch.randn(2, 8, 4, 4), torch.randn(16, 8, 1, 1)
    assert not folds(x.half(), w)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not folds(x, w)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_run_conv_is_a_gemm_on_channels_last_only(layout, monkeypatch):
    """The fused blocks' 1x1 convs: a GEMM on a channels-last input's view (no conv2d call),
    the conv itself on NCHW, a strided conv or a hooked one; values and grads as the conv's."""
    calls = Counter()
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: calls.update(["conv2d"]) or real(*a, **k))
    torch.manual_seed(0)
    conv = nn.Conv2d(6, 10, 1, bias=False).double()
    x = torch.randn(2, 6, 4, 3, dtype=torch.float64).contiguous(
        memory_format=LAYOUTS[layout]).requires_grad_()
    y = conv1x1.run_conv(conv, x)
    assert calls["conv2d"] == (layout == "nchw")
    y.square().sum().backward()
    xr = x.detach().clone().requires_grad_()
    wr = conv.weight.detach().clone().requires_grad_()
    real(xr, wr).square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(conv.weight.grad, wr.grad)
    calls.clear()
    conv.register_forward_hook(lambda *a: None)
    conv1x1.run_conv(conv, x)
    assert calls["conv2d"] == 1                          # the hook still sees its call
    with conv1x1.aten_convs():
        conv1x1.run_conv(nn.Conv2d(6, 10, 1).double(), x)
    assert calls["conv2d"] == 2
