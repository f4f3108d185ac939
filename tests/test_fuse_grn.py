"""The grn_mlp graph site (ConvNeXt V2's fc1 -> GELU -> GRN -> fc2) beyond the asset tests in
test_fuse_patterns.py: it saves fc1's output and the norms only, folds the block's residual
into fc2's GEMM on channels-last data, matches float64 eager where a GRN's norm is zero and
where the input is not 4-D (its eager path), and says why where it does not fuse."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from tests.helpers import assert_close_to_float64, assert_matches_eager, autograd_nodes
from tests.test_fuse_patterns import saved_bytes

sys.path.insert(0, str(Path(__file__).parent))
from assets import convnext_v2  # noqa: E402


class GrnMlp(nn.Module):
    """fc1 -> act -> GRN (any spelling) -> fc2; `leak`: GRN's output is returned too."""

    def __init__(self, c: int, grn: str = "official", act=None, leak: bool = False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.act = act or nn.GELU()
        self.grn = convnext_v2.SPELLINGS[grn](4 * c)
        self.leak = leak
        with torch.no_grad():
            for p in self.grn.parameters():
                p.copy_(torch.linspace(-1.0, 1.5, p.numel()).reshape(p.shape))

    def forward(self, x):
        g = self.grn(self.act(self.fc1(x)))
        y = self.fc2(g)
        return (y, g) if self.leak else y


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def kernels(y) -> list[str]:
    return [n.kernel.name for n in autograd_nodes(y) if hasattr(n, "kernel")]


@pytest.mark.parametrize("grn", sorted(convnext_v2.SPELLINGS))
@pytest.mark.parametrize("act, bound", [(nn.GELU(), 0.35), (nn.SiLU(), 0.35),
                                        (nn.ReLU(), 0.45)], ids=["gelu", "silu", "relu"])
def test_grn_mlp_saves_a_third_of_eager_and_matches_float64(grn, act, bound):
    torch.manual_seed(0)
    model = GrnMlp(6, grn, act).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"grn_mlp": 1}
    x = _x(4, 8, 8, 6)
    y = assert_matches_eager(model, ref, (x,))
    assert kernels(y) == ["grn_mlp[cpu]"]                    # GRN in the C++ kernel (grn.h)
    # eager keeps x, fc1's output, the act's, g * n and GRN's output (ReLU: its output, not
    # its input); the site x, fc1's output (ReLU: the act's) and the (N, 1, 1, C) norms
    assert saved_bytes(model, (x,)) < bound * saved_bytes(ref, (x,))


@pytest.mark.parametrize("impl", ["function", "cpu", "triton"])
@pytest.mark.parametrize("act", [nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU(), nn.ReLU()],
                         ids=["gelu", "gelu_tanh", "silu", "relu"])
def test_each_grn_impl_in_the_site_matches_float64(impl, act):
    """The site on each bound grn impl (fuse(impls=...)): fc1's bias in the kernel's pass, the
    block's values and every gradient as eager's in float64 (Triton: interpreted, computing in
    float32), and the kernel it names is the one that ran ("function": the site's torch path,
    GRN in torch ops after the act's own pair)."""
    if impl == "triton":
        from tests.helpers import interpreted_triton
        interpreted_triton()
    torch.manual_seed(0)
    model = GrnMlp(6, "timm", act).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train", impls={"grn": impl}).sites) == {"grn_mlp": 1}
    x = _x(3, 5, 4, 6)
    if impl == "triton":
        y = assert_close_to_float64(model.float(), ref, (x.float(),), 1e-5, 1e-4, 1e-4,
                                    ref_inputs=(x,))
    else:
        y = assert_matches_eager(model, ref, (x,))
    if impl == "function":
        assert len(kernels(y)) == 1 and kernels(y)[0] not in ("grn_mlp[cpu]", "grn_mlp[triton]")
    else:
        assert kernels(y) == [f"grn_mlp[{impl}]"]


def test_a_dtype_the_bound_grn_kernel_does_not_take_runs_the_torch_site_and_says_so():
    """float64 with the Triton pair bound (it computes in float32, as on a CUDA device): the
    site runs GRN in torch ops after the act's own pair, with a warning, and matches float64
    eager exactly rather than to float32's precision."""
    from tests.helpers import interpreted_triton
    interpreted_triton()
    torch.manual_seed(0)
    model = GrnMlp(6).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train", impls={"grn": "triton"}).sites) == {"grn_mlp": 1}
    with pytest.warns(UserWarning, match="grn_mlp: the grn triton kernel does not take "
                                         "torch.float64; ran GRN in torch ops"):
        y = assert_matches_eager(model, ref, (_x(2, 4, 4, 6),))
    assert len(kernels(y)) == 1 and kernels(y)[0] not in ("grn_mlp[cpu]", "grn_mlp[triton]")


def test_an_act_the_grn_kernels_do_not_take_runs_the_torch_site():
    """Hardswish is no grn kernel's act: the site still fuses, GRN in torch ops after the act's
    own pair, as eager in float64."""
    torch.manual_seed(0)
    model = GrnMlp(6, act=nn.Hardswish()).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"grn_mlp": 1}
    y = assert_matches_eager(model, ref, (_x(2, 4, 4, 6),))
    assert [k.split("[")[0] for k in kernels(y)] == ["grn_mlp"] and kernels(y) != ["grn_mlp[cpu]"]


@pytest.mark.parametrize("channels_last, folded", [(True, True), (False, False)])
def test_the_v2_blocks_residual_folds_into_fc2_on_channels_last_data(channels_last, folded):
    torch.manual_seed(0)
    model = convnext_v2.Block(8).double().train()
    with torch.no_grad():
        model.grn.gamma.normal_()
        model.grn.beta.normal_()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"grn_mlp": 1, "ln2d": 1, "dwconv": 1}
    x = _x(2, 8, 6, 6)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    y = assert_matches_eager(model, ref, (x,))
    kinds = {type(n).__name__ for n in autograd_nodes(y)}
    assert ("ResidualOpFunctionBackward" in kinds) == folded
    assert ("MultiOpFunctionBackward" in kinds) == (not folded)


def test_a_channel_whose_norm_is_zero_has_eager_gradients():
    """fc1's weight and bias zero on some outputs: GELU(0) = 0 there, so G = 0 and eager's norm
    backward gives 0 (not a NaN); the site's too."""
    torch.manual_seed(0)
    model = GrnMlp(6).double().train()
    with torch.no_grad():
        model.fc1.weight[:5] = 0
        model.fc1.bias[:5] = 0
    ref = copy.deepcopy(model)
    fuse(model, "train")
    y = assert_matches_eager(model, ref, (_x(2, 3, 3, 6),))
    assert kernels(y) and all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_3d_input_takes_the_eager_grn():
    """dims (1, 2) of an (N, L, C) tensor include the channels: not the site's GRN, so it runs
    the GRN as written (and still matches)."""
    torch.manual_seed(0)
    model = GrnMlp(6).double().train()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    y = assert_matches_eager(model, ref, (_x(2, 7, 6),))
    assert [k.split("[")[0] for k in kernels(y)] == ["act"]


class ChannelsFirstGrn(nn.Module):
    """timm's conv MLP: 1x1 convs, the GRN over dims (2, 3) of NCHW and the mean over dim 1."""

    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)
        self.w, self.b = nn.Parameter(torch.ones(4 * c)), nn.Parameter(torch.zeros(4 * c))

    def forward(self, x):
        g = F.gelu(self.fc1(x))
        n = g.norm(p=2, dim=(2, 3), keepdim=True)
        n = n / (n.mean(dim=1, keepdim=True) + 1e-6)
        return self.fc2(g + torch.addcmul(self.b.view(1, -1, 1, 1), self.w.view(1, -1, 1, 1),
                                          g * n))


@pytest.mark.parametrize("model, reason", [
    (lambda: GrnMlp(6, leak=True), "grn_mlp: 1 candidate(s) not fused: an intermediate output "
                                   "is used elsewhere too"),
    (lambda: GrnMlp(6, act=nn.Tanh()), "grn_mlp: 1 candidate(s) not fused: GRN whose input is "
                                       "not an activation"),
])
def test_a_grn_that_does_not_fuse_says_why(model, reason):
    result = fuse(model().double().train(), "train")
    assert "grn_mlp" not in result.sites
    assert any(m.startswith(reason) for k, m in result.notes if k == "not_fused"), result.notes


def test_a_channels_first_grn_is_not_this_site():
    """Over NCHW the norm's dims are (2, 3): not GRN over an (N, H, W, C) tensor, left alone
    (its 1x1 convs and GELU are other sites' business)."""
    result = fuse(ChannelsFirstGrn(6).double().train(), "train")
    assert "grn_mlp" not in result.sites
    assert not any("grn_mlp" in m for _, m in result.notes)


def test_hooks_on_every_grn_are_one_note_with_eager_values():
    """A user's hook on each GRN (activation statistics) keeps the MLPs unfused: one note for
    all five, and the model still computes eager's values with the hooks run."""
    model, seen = convnext_v2.make_trained().double(), []
    ref = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, convnext_v2.GRN):
            m.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    result = fuse(model, "train")
    assert "grn_mlp" not in result.sites
    assert ("not_fused", "grn_mlp: 5 candidate(s) not fused: a hook on its GRN module (at "
            "stages.0.0.grn, stages.1.0.grn, stages.2.0.grn and 2 more)") in result.notes
    assert seen == []
    assert_matches_eager(model, ref, (_x(2, 3, 32, 32),))
    assert len(seen) >= 5
