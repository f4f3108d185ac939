"""The fuser's graph pass on models fusebench did not write: an official-ConvNeXt-like, a
nanoGPT-like and a torchvision-like EfficientNet (tests/assets, our own code with their
layouts), and each LayerNorm-over-channels spelling on its own. Per model: the sites per
pattern, the fused kernels really in the autograd graph (one node per site), the same
Parameters under the same names, forward and gradients equal to float64 eager, and the
candidates that did not fuse (or a failed trace) reported as events with a reason."""
from __future__ import annotations

import copy
import functools
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from fusebench.measure.events import EventLog
from fusebench.modes import get_mode
from tests.helpers import (assert_close_to_float64, assert_matches_eager, autograd_nodes,
                           random_running_stats)

sys.path.insert(0, str(Path(__file__).parent))
from assets import (conformer, convnext_official, convnext_v2, diffusion_unet,  # noqa: E402
                    hf_efficientnet,
                    hf_gpt2, hf_llama, llama, pointnet,
                    nano_gpt, timm_efficientnet, torch_transformer, tv_efficientnet,
                    tv_mobilenet, tv_resnet, tv_vit)

LN2D_NODES = {"GeneratedBackwardFor_fusebench_ln2d_cpu_forward_defaultBackward",
              "LN2dFunctionBackward", "LN2dTritonFunctionBackward",
              "LN2dCpuFunctionBackward"}
IMAGE = (2, 3, 32, 32)


def image():
    return torch.randn(*IMAGE, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def tokens():
    return (torch.randint(0, nano_gpt.VOCAB, (2, nano_gpt.CONTEXT),
                          generator=torch.Generator().manual_seed(1)),)


def unet_inputs():
    return diffusion_unet.make_plain().example_inputs(2, "cpu", torch.float64)


# GroupNorm -> SiLU: two diffusers ResnetBlock2Ds and four ResBlocks (in / out layers), 2 each,
# and the VAE-style norm_out with a written-out swish; the attention block's GroupNorm has no
# act (group_norm: the kernel with the identity); the time embedding's Linear -> SiLU -> Linear
# (mlp); the SiLUs before the blocks' time projections (silu_me)
UNET = {"gn_act": 13, "group_norm": 1, "mlp": 1, "silu_me": 4}


def llama_tokens():
    return (torch.randint(0, llama.VOCAB, (2, llama.CONTEXT),
                          generator=torch.Generator().manual_seed(1)),)


LLAMA = {"rms_norm": 5, "glu_mlp": 2}


def TORCH_POST_RELU():                   # noqa: N802 - a factory, named like the others
    return torch_transformer.make(norm_first=False, activation="relu")


def torch_inputs(factory):
    torch.manual_seed(1)
    return factory().example_inputs(2, "cpu", torch.float64)


# every SE's H*W >= its projection's channels at 32 px: all fold into the projection;
# the expand convs and the head's: pointwise convs no other site took (conv1x1);
# the projections' BNs without an activation: + the block input where the block keeps its
# shape (bn_add_act, the identity act), alone where it does not (bn_train)
EFFNET = {"bn_act": 9, "se_gate": 4, "se_project": 4, "dwconv": 4, "conv1x1": 4, "bn_train": 2,
          "bn_add_act": 2}
# ResNet (Bottleneck, 5 blocks): every block's bn3 -> += identity -> ReLU (bn_add_act), the
# other BN -> ReLUs and the stem's (bn_act), the 4 downsample BNs (bn_train), the 1x1 convs
# that feed a BN at stride 1 (conv1x1; a downsample's at stride 2 is no GEMM here)
RESNET = {"bn_act": 11, "bn_add_act": 5, "bn_train": 4, "conv1x1": 11}
# model -> (factory, inputs, sites expected in train)
ASSETS = {
    # the stem and the downsamples: kernel == stride convs (patchify)
    "convnext_official": (convnext_official.make, lambda: (image(),),
                          {"ln2d": 9, "mlp": 5, "dwconv": 5, "patchify": 4}),
    # ConvNeXt V2: fc1 -> GELU -> GRN -> fc2 + the residual (grn_mlp), in three spellings of
    # the GRN; GRN's gamma / beta live (make_trained); norms as timm's LayerNorm2d (ln2d)
    **{f"convnext_v2_{k}": (functools.partial(convnext_v2.make_trained, grn=k),
                            lambda: (image(),),
                            {"ln2d": 9, "grn_mlp": 5, "dwconv": 5, "patchify": 4})
       for k in convnext_v2.SPELLINGS},
    # the causal attention written out (a sliced mask buffer: traced with buffers as values)
    "nano_gpt": (nano_gpt.make, tokens, {"mlp": 2, "attention": 2}),
    "nano_gpt_new_gelu": (nano_gpt.make_new_gelu, tokens, {"mlp": 2, "attention": 2}),
    # Conv1D: addmm on a weight stored (in, out), between two views
    "hf_gpt2": (hf_gpt2.make, tokens, {"mlp": 2}),
    # RMSNorm written out (HF: casts to float32 and back; Meta: .float() / .type_as) or
    # nn.RMSNorm, SwiGLU MLPs; the attention (RoPE slicing by a traced length) is not traced
    "llama_hf": (llama.make, llama_tokens, LLAMA),
    "llama_meta": (llama.make_meta, llama_tokens, LLAMA),
    "llama_torch_rmsnorm": (llama.make_torch_rmsnorm, llama_tokens, LLAMA),
    # HF's current layout: heads shaped by `(*input_shape, -1, head_dim)`, **kwargs passed on,
    # the attention written out in a function (grouped k/v heads, float32 softmax), the rotary
    # angles under autocast(enabled=False), a causal mask made with `torch.ones(T, T)`
    "hf_llama": (hf_llama.make, llama_tokens, {**LLAMA, "attention": 2}),
    "tv_efficientnet": (tv_efficientnet.make, lambda: (image(),), EFFNET),
    # EfficientNetV2: FusedMBConv's full 3x3 conv -> BN -> SiLU (bn_act; + x after it where
    # the expand ratio is 1), its 1x1 conv -> BN alone (conv1x1, bn_train / bn_add_act); then
    # MBConv as V1's
    "tv_efficientnet_v2": (tv_efficientnet.make_v2, lambda: (image(),),
                           {"bn_act": 9, "se_gate": 2, "se_project": 2, "dwconv": 2,
                            "conv1x1": 5, "bn_train": 2, "bn_add_act": 2}),
    "diffusion_unet": (diffusion_unet.make_plain, unet_inputs, UNET),
    # `out += identity; relu(out)` and `F.relu(torch.add(identity, out))`; BasicBlocks
    "tv_resnet": (tv_resnet.make, lambda: (image(),), RESNET),
    "tv_resnet_functional": (lambda: tv_resnet.make(spelling="functional"), lambda: (image(),),
                             RESNET),
    "tv_resnet_basic": (lambda: tv_resnet.make("tiny_basic"), lambda: (image(),),
                        {"bn_act": 6, "bn_add_act": 5, "bn_train": 3}),
    "tv_efficientnet_relu_linear_se": (tv_efficientnet.make_relu_linear_se, lambda: (image(),),
                                       EFFNET),
    # BatchNormAct2d: F.batch_norm inside an nn.BatchNorm2d subclass, an nn.Identity before
    # its act; the buffer check below holds the batch counter and (cumulative) averages
    "timm_efficientnet": (timm_efficientnet.make, lambda: (image(),), EFFNET),
    "timm_efficientnet_cumulative": (timm_efficientnet.make_cumulative, lambda: (image(),),
                                     EFFNET),
    # 1x1 convs with padding="same", an nn.Conv2d subclass for the depthwise convs: the two
    # at stride 2 ("valid" after a ZeroPad2d) are not the kernel's padding (a reason)
    "hf_efficientnet": (hf_efficientnet.make, lambda: (image(),), {**EFFNET, "dwconv": 2}),
    # BN -> ReLU6 (in-place, in nn.Sequential); the projections' BNs alone (bn_train) or
    # + x (`x + self.conv(x)`: bn_add_act)
    "tv_mobilenet_v2": (tv_mobilenet.make_v2, lambda: (image(),),
                        {"bn_act": 9, "bn_train": 3, "bn_add_act": 1, "dwconv": 4,
                         "conv1x1": 8}),
    # written out as pre-1.6 code did: HSwish / HSigmoid modules (x * relu6(x + 3) / 6), an SE
    # on Linear layers after `pool(x).view(b, c)`, its gate before a HSwish (no projection)
    "mobilenet_v3_written_out": (tv_mobilenet.make_written_out, lambda: (image(),),
                                 {"bn_act": 3, "bn_train": 2, "bn_add_act": 2, "dwconv": 2,
                                  "conv1x1": 4, "se_gate": 2}),
    # BN -> hardswish / ReLU; the classifier's Linear -> hardswish -> Linear (mlp); the SEs'
    # hardsigmoid gates, each folded into the projection after it (se_project)
    "tv_mobilenet_v3": (tv_mobilenet.make_v3, lambda: (image(),),
                        {"bn_act": 7, "bn_train": 2, "bn_add_act": 1, "dwconv": 3,
                         "conv1x1": 4, "mlp": 1, "se_gate": 2, "se_project": 2}),
    # torch.nn's own transformer modules (a leaf each to fx): the encoder layers traced through
    # their training path, the decoder layers through their own forward; one mlp per layer
    # their attentions without MultiheadAttention's copies (mha; the decoder's cross-attention
    # on the memory too)
    "torch_encoder": (torch_transformer.make, lambda: torch_inputs(torch_transformer.make),
                      {"mlp": 2, "mha": 2}),
    "torch_encoder_post_relu": (TORCH_POST_RELU, lambda: torch_inputs(TORCH_POST_RELU),
                                {"mlp": 2, "mha": 2}),
    # torchvision's ViT: `x, _ = self_attention(...)` (mha), MLPBlock's Sequential (mlp)
    "tv_vit": (tv_vit.make, lambda: (image(),), {"mha": 2, "mlp": 2, "patchify": 1}),
    # torchaudio's layout: SiLU feed-forwards (mlp, fc1's bias in its GEMM), a time-major
    # MultiheadAttention with a key-padding mask (mha), the convolution module's BatchNorm1d ->
    # SiLU over (N, C, L) (bn_act; the GLU and Conv1ds are left as they are)
    "conformer": (lambda: conformer.make("tiny"),
                  lambda: conformer.features(2, 20, 12, dtype=torch.float64),
                  {"mlp": 4, "mha": 2, "bn_act": 2}),
    # T-Nets and per-point MLPs: 1x1 Conv1d -> BatchNorm1d -> ReLU over (N, C, points) and one
    # on the (N, C) rows of a max (bn_act), the last conv's BN alone (bn_train); the heads'
    # BatchNorm1d after a Linear: not_fused
    "pointnet": (lambda: pointnet.make("tiny", dropout=0.0),
                 lambda: (pointnet.clouds(4, 24, dtype=torch.float64),),
                 {"bn_act": 9, "bn_train": 1}),
    "torch_seq2seq": (torch_transformer.make_seq2seq,
                      lambda: torch_inputs(torch_transformer.make_seq2seq),
                      {"mlp": 4, "mha": 6}),
}
FUSED_NODES = ("MultiOpFunctionBackward", "ResidualOpFunctionBackward")   # engine, fx/residual
# the MultiOpKernel name prefix each graph pattern's Function carries
KERNEL_PREFIX = {"mlp": "mlp[", "bn_act": "bn_act[", "bn_add_act": "bn_add_act[",
                 "se_gate": "se_gate[",
                 "se_project": "se_project[", "bn_train": "bn_train[", "glu_mlp": "glu_mlp[",
                 "grn_mlp": "grn_mlp["}
SITE_NAME = {"se_gate": "fused_se"}


# sites without a MultiOpFunction: counted by site calls (gn_act's nodes: test_fuse_gn_act)
BY_CALLS = ("ln2d", "conv1x1", "patchify", "rms_norm", "gn_act", "group_norm", "mha", "attention")
MODULE_RULES = ("dwconv", "silu_me")        # module swaps, not graph sites: no site calls


def runs(expected: dict) -> dict:
    """The fused Functions a forward runs per pattern: a folded SE + projection site counts as
    both patterns but runs one se_project Function (BY_CALLS: counted by site calls instead)."""
    return {k: n for k, n in expected.items()
            if k not in BY_CALLS and not (k == "se_gate" and "se_project" in expected)}


def ran(y: torch.Tensor) -> Counter:
    """Fused nodes in y's autograd graph, per pattern (a MultiOpFunction's ctx is its node).
    ln2d's nodes are not MultiOpFunctions (binding.resolve_ln2d binds the kernel's own
    autograd.Function): ln2d is counted by site calls (site_calls) instead."""
    out: Counter = Counter()
    for node in autograd_nodes(y):
        name = type(node).__name__
        if name in FUSED_NODES:
            out.update(p for p, pre in KERNEL_PREFIX.items() if node.kernel.name.startswith(pre))
        out["dwconv"] += name == "DwConvCpuFunctionBackward"
        out["silu_me"] += name == "SiLUFunctionBackward"
    return +out


def build(factory, **kw) -> nn.Module:
    torch.manual_seed(0)
    model = factory(**kw).double()
    for m in model.modules():          # non-trivial norm / layer-scale parameters
        for name, p in m.named_parameters(recurse=False):
            if name in ("bias", "gamma") or (name == "weight" and p.dim() == 1):
                with torch.no_grad():
                    p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_asset_sites_fuse_and_match_float64_eager(name, site_calls):
    factory, inputs, expected = ASSETS[name]
    model = build(factory).train()
    ref = copy.deepcopy(model)
    params = dict(model.named_parameters())
    result = fuse(model, "train")
    assert dict(result.sites) == expected, result.sites
    assert list(dict(model.named_parameters()).items()) == list(params.items())
    assert all(params[n] is p for n, p in model.named_parameters())
    graph_sites = {SITE_NAME.get(k, f"fused_{k}"): n for k, n in expected.items()
                   if k not in MODULE_RULES and (k in runs(expected) or k in BY_CALLS)}
    for _ in range(2):                 # second step: BN running statistics updated alike
        model.zero_grad()
        ref.zero_grad()
        site_calls.clear()
        y = assert_matches_eager(model, ref, inputs())
        assert ran(y) == Counter(runs(expected)), ran(y)
        assert dict(site_calls) == graph_sites
    for (n, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, msg=n)


class PermuteLN(nn.Module):            # permute -> nn.LayerNorm -> permute
    def __init__(self, c):
        super().__init__()
        self.ln = nn.LayerNorm(c, eps=1e-5)

    def forward(self, x):
        return self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ChannelsLastViewLN(nn.Module):   # F.layer_norm on a channels-last view, used NHWC
    def __init__(self, c):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.rand(c))

    def forward(self, x):
        y = F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), self.w, self.b, 1e-6)
        return y.sum(-1)


class TwoPassRsqrt(nn.Module):         # (x - u) * rsqrt(var + eps), weight via view
    def __init__(self, c):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.rand(c))

    def forward(self, x):
        u = torch.mean(x, dim=1, keepdim=True)
        d = x - u
        n = (x - u) * torch.rsqrt((d * d).mean(dim=[1], keepdim=True) + 1e-6)
        return self.b.view(1, -1, 1, 1) + n * self.w.view(1, -1, 1, 1)


class OnePass(nn.Module):              # E[x^2] - E[x]^2, parameters shaped (C, 1, 1)
    def __init__(self, c):
        super().__init__()
        self.w = nn.Parameter(torch.rand(c, 1, 1) + 0.5)
        self.b = nn.Parameter(torch.rand(c, 1, 1))

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        var = (x * x).mean(1, keepdim=True) - u.pow(2)
        return (x - u) / torch.sqrt(var + 1e-5) * self.w + self.b


@pytest.mark.parametrize("cls", [PermuteLN, ChannelsLastViewLN, TwoPassRsqrt, OnePass,
                                 lambda c: convnext_official.LayerNorm(
                                     c, data_format="channels_first")],
                         ids=["permute", "channels_last_view", "two_pass_rsqrt", "one_pass",
                              "official_channels_first"])
def test_each_ln_over_channels_spelling_is_one_ln2d_site(cls, site_calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), cls(6)).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"ln2d": 1}, (result.sites, result.notes)
    assert not result.unfused.get("LayerNorm"), result.unfused
    y = assert_matches_eager(model, ref, (image() * 3 + 2,))
    assert site_calls == {"fused_ln2d": 1}
    assert {type(n).__name__ for n in autograd_nodes(y)} & LN2D_NODES     # NCHW x: our kernel's node


@pytest.mark.parametrize("cls", [PermuteLN, lambda c: convnext_official.LayerNorm(
    c, data_format="channels_first")], ids=["permute", "official_channels_first"])
def test_ln2d_site_on_channels_last_x_runs_the_kernel(cls, site_calls):
    """A channels-last x (every LN after ConvNeXt's stem) runs the C++ kernel's per-row path
    too, not aten's layer_norm, and matches float64 eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 80, 1), cls(80)).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"ln2d": 1}, (result.sites, result.notes)
    x = (image() * 3 + 2).contiguous(memory_format=torch.channels_last)
    y = assert_matches_eager(model, ref, (x,))
    assert site_calls == {"fused_ln2d": 1}
    assert {type(n).__name__ for n in autograd_nodes(y)} & LN2D_NODES


class ValueBranch(nn.Module):
    """Branches on a tensor's value: fx cannot trace it (the module it wraps still can)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x) if bool(x.abs().sum() > 0) else x


def test_events_say_what_did_not_fuse_and_where_tracing_failed():
    events = EventLog()
    model = build(nano_gpt.make).float()
    model.transformer.h[0].attn = ValueBranch(model.transformer.h[0].attn)
    get_mode("fused").prepare(model, tokens(), {"bench": "train"}, events)
    msgs = {e.category: [] for e in events.events()}
    for e in events.events():
        msgs[e.category].append(e.message)
    assert "mlp: 2 sites" in msgs["fusion"]
    # that module's trace fails and says so; the attention inside it is traced on its own
    assert any("transformer.h.0.attn (ValueBranch) failed" in m for m in msgs["fx_fallback"])
    assert "attention: 2 sites" in msgs["fusion"], msgs["fusion"]
    # ln_2 -> c_fc twice, ln_f -> lm_head, ln_1 -> c_attn in the block whose attention traced
    assert any(m.startswith("ln_linear: 4 candidate(s) not fused: off by default")
               for m in msgs["not_fused"]), msgs["not_fused"]


def saved_bytes(model, inputs) -> int:
    """Bytes of the distinct tensors autograd saves in one forward (activations and params)."""
    seen: dict = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(*inputs)
    return sum(seen.values())


@pytest.mark.parametrize("factory", [nano_gpt.make, nano_gpt.make_new_gelu],
                         ids=["gelu", "new_gelu"])
def test_ln_linear_on_request_saves_the_normalised_tensor(factory, site_calls):
    """Opt-in (the fused mode's --fused-ln-linear): each pre-norm LayerNorm -> Linear runs in
    one Function (inside the mlp site where the Linear is fc1), gradients equal float64 eager,
    and a step saves less than the default fusion; off, each is a not_fused note."""
    model, plain = build(factory).train(), build(factory).train()
    ref = copy.deepcopy(model)
    events = EventLog()
    get_mode("fused").prepare(model, tokens(), {"bench": "train", "fused_ln_linear": True},
                              events)
    # ln_1 -> c_attn too: the attention's `x.size()` of the normed x asks ln_1's input
    assert {e.message for e in events.events() if e.category == "fusion"} == {
        "mlp: 2 sites", "ln_linear: 5 sites", "attention: 2 sites"}
    fuse(plain, "train")
    assert saved_bytes(model, tokens()) < saved_bytes(plain, tokens())
    for _ in range(2):
        model.zero_grad()
        ref.zero_grad()
        site_calls.clear()
        y = assert_matches_eager(model, ref, tokens())
    kernels = Counter(n.kernel.name.split("[")[0] for n in autograd_nodes(y)
                      if type(n).__name__ in FUSED_NODES)
    assert kernels == {"ln_linear": 5, "mlp": 2} and site_calls == {
        "fused_mlp": 2, "fused_ln_linear": 3, "fused_attention": 2}
    residual = [n for n in autograd_nodes(y) if type(n).__name__ == "ResidualOpFunctionBackward"]
    assert len(residual) == 2                     # each block's `x + mlp(...)` add is folded


class ResidualMlp(nn.Module):          # x + dropout(fc2(gelu(fc1(x)))), a GPT block's second half
    def __init__(self, c, p=0.0):
        super().__init__()
        self.fc1, self.fc2, self.drop = nn.Linear(c, 4 * c), nn.Linear(4 * c, c), nn.Dropout(p)

    def forward(self, x):
        return x + self.drop(self.fc2(F.gelu(self.fc1(x))))


@pytest.mark.parametrize("p, layout, folded", [(0.0, "contiguous", True),
                                               (0.1, "contiguous", False),
                                               (0.0, "transposed", False)])
def test_the_residual_add_folds_into_the_mlp_site(p, layout, folded, site_calls):
    """The add after an MLP runs inside its Function (res + fc2 bias as the GEMM accumulator)
    where nothing sits between them but an identity dropout and res has the output's layout;
    a dropout with p > 0 keeps aten's add, a transposed res takes it at run time."""
    torch.manual_seed(0)
    model = ResidualMlp(6, p).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mlp": 1}
    x = torch.randn(5, 3, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x = x.transpose(0, 1) if layout == "transposed" else x
    torch.manual_seed(2)                          # the same dropout masks in both
    y = model(x)
    torch.manual_seed(2)
    torch.testing.assert_close(y, ref(x), atol=1e-9, rtol=1e-9)
    torch.manual_seed(2)
    assert_matches_eager(model, ref, (x,)) if p == 0 else None
    kinds = {type(n).__name__ for n in autograd_nodes(y)}
    assert ("ResidualOpFunctionBackward" in kinds) == folded
    assert ("AddBackward0" in kinds) == (not folded)


class TimmMlp(nn.Module):              # timm's Mlp: fc1, act, drop1, norm (Identity), fc2, drop2
    def __init__(self, c, p=0.0):
        super().__init__()
        self.fc1, self.act, self.drop1 = nn.Linear(c, 4 * c), nn.GELU(), nn.Dropout(p)
        self.norm, self.fc2, self.drop2 = nn.Identity(), nn.Linear(4 * c, c), nn.Dropout(p)

    def forward(self, x):
        x = self.drop1(self.act(self.fc1(x)))
        return self.drop2(self.fc2(self.norm(x)))


class SequentialMlp(nn.Sequential):    # torchvision's ViT MLPBlock: an nn.Sequential subclass
    def __init__(self, c, p=0.0):
        super().__init__(nn.Linear(c, 4 * c), nn.GELU(), nn.Dropout(p), nn.Linear(4 * c, c),
                         nn.Dropout(p))


class MlpBlock(nn.Module):             # a ViT block's second half on tokens: x + mlp(x)
    def __init__(self, c, p=0.0, mlp=TimmMlp):
        super().__init__()
        self.mlp = mlp(c, p)

    def forward(self, x):
        return x + self.mlp(x)


@pytest.mark.parametrize("mlp", [TimmMlp, SequentialMlp])
def test_identity_dropouts_between_the_activation_and_fc2_are_skipped(mlp, site_calls):
    """timm's Mlp puts a dropout (p=0) and an nn.Identity norm between its act and fc2,
    torchvision's ViT MLPBlock a dropout: one mlp site all the same, its residual folded,
    forward and gradients as float64 eager."""
    torch.manual_seed(0)
    model = MlpBlock(6, mlp=mlp).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 1}, (result.sites, result.notes)
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = assert_matches_eager(model, ref, (x,))
    kinds = {type(n).__name__ for n in autograd_nodes(y)}
    assert "ResidualOpFunctionBackward" in kinds and "AddBackward0" not in kinds, kinds
    assert site_calls == {"fused_mlp": 1}


@pytest.mark.parametrize("mlp", [TimmMlp, SequentialMlp])
def test_a_live_dropout_before_fc2_joins_the_site_with_eagers_mask(mlp, site_calls):
    """A live dropout between the act and fc2 (p > 0, training) runs inside the mlp site,
    drawn as F.dropout draws it: from one seed, the fused and the eager step drop the same
    values (forward and gradients as float64 eager), another seed drops others, and the site
    saves the mask in place of eager's dropout output."""
    torch.manual_seed(0)
    model = MlpBlock(6, p=0.3, mlp=mlp).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 1}, (result.sites, result.notes)
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)
    y, r = model(x), None
    torch.manual_seed(7)
    r = ref(x)
    torch.testing.assert_close(y, r, atol=1e-12, rtol=1e-12)
    y.square().mean().backward()
    r.square().mean().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-12, rtol=1e-12, msg=n)
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert names == ["mlp[linear,gelu[none],dropout 0.3]"], names
    torch.manual_seed(8)
    assert not torch.equal(model(x), y)
    assert saved_bytes(model, (x,)) < saved_bytes(ref, (x,))


def test_a_classifier_dropout_is_no_mlp_candidate():
    """`Dropout(p) -> Linear` after a pooled feature (torchvision's classifier) is no MLP:
    no reason reported for it."""
    head = nn.Sequential(nn.Linear(6, 6), nn.Flatten(), nn.Dropout(0.2), nn.Linear(6, 3))
    result = fuse(head.train(), "train")
    assert not result.sites and not any("mlp" in str(n) for n in result.notes), result.notes


@pytest.mark.parametrize("layout, folded", [(torch.channels_last, True),
                                            (torch.contiguous_format, False)])
@pytest.mark.parametrize("block", ["conv_mlp_gamma", "official_convnext"])
def test_an_mlp_folds_its_residual_on_channels_last(block, layout, folded, site_calls):
    """x + gamma * fc2(act(fc1(x))) with 1x1 convs, or the official ConvNeXt block's Linears on
    (N, H, W, C) rows permuted back before `shortcut + ...`: on channels-last x the residual is
    fc2's GEMM accumulator (its (N, H, W, C) view is the GEMM's rows); NCHW keeps aten's add."""
    torch.manual_seed(0)
    inner = ConvMlpGamma(6) if block == "conv_mlp_gamma" \
        else convnext_official.Block(6, layer_scale=0.5)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), inner).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites)["mlp"] == 1
    y = assert_matches_eager(model, ref, (image().contiguous(memory_format=layout),))
    kinds = {type(n).__name__ for n in autograd_nodes(y)}
    assert ("ResidualOpFunctionBackward" in kinds) == folded, kinds
    assert ("AddBackward0" in kinds) == (not folded), kinds


class ReluGammaMlp(nn.Module):          # Linears on (N, H, W, C) rows, ReLU, a layer scale
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        return self.gamma * self.fc2(F.relu(self.fc1(x.permute(0, 2, 3, 1))))


LAYER_SCALED = {"conv_mlp_gamma": lambda c: ConvMlpGamma(c), "relu_linear": ReluGammaMlp,
                "official_convnext": lambda c: convnext_official.Block(c, layer_scale=0.5)}


@pytest.mark.parametrize("hw, on_rows", [(32, False), (2, True)], ids=["fold", "rows"])
@pytest.mark.parametrize("layout", [torch.channels_last, torch.contiguous_format],
                         ids=["cl", "nchw"])
@pytest.mark.parametrize("block", list(LAYER_SCALED))
def test_the_layer_scale_goes_on_the_smaller_operand(block, layout, hw, on_rows, monkeypatch):
    """gamma is folded into fc2's weight where fc2's output is the larger (2048 rows), and
    scales fc2's output where the weight is (8 rows, as a late stage's few: layer_scale.on_rows);
    either way, with and without the residual in the Function, outputs and every gradient
    (gamma's too) match eager in float64. Which way ran is counted, not assumed."""
    from fusebench.fuse import layer_scale
    scaled = []
    real = layer_scale.scaled
    monkeypatch.setattr(layer_scale, "scaled",
                        lambda *a, **k: scaled.append(a[0].shape) or real(*a, **k))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 1), LAYER_SCALED[block](16)).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites)["mlp"] == 1
    x = torch.randn(2, 3, hw, hw, dtype=torch.float64).contiguous(memory_format=layout)
    assert_matches_eager(model, ref, (x,))
    assert bool(scaled) == on_rows, scaled


class BroadcastShortcut(nn.Module):   # the official block's permute back, a (C, 1, 1) "shortcut"
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.shift = nn.Parameter(torch.rand(c, 1, 1))

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(x.permute(0, 2, 3, 1))))
        return self.shift + y.permute(0, 3, 1, 2)


def test_a_residual_that_only_broadcasts_keeps_eagers_add(site_calls):
    torch.manual_seed(0)
    model = BroadcastShortcut(6).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mlp": 1}
    x = image()[:, :1].expand(2, 6, 32, 32).contiguous(memory_format=torch.channels_last)
    y = assert_matches_eager(model, ref, (x,))
    kinds = {type(n).__name__ for n in autograd_nodes(y)}
    assert "AddBackward0" in kinds and "ResidualOpFunctionBackward" not in kinds, kinds


def test_a_hooked_module_is_a_candidate_not_fused():
    model = build(tv_efficientnet.make)
    model.features[0][1].register_forward_hook(lambda m, i, o: None)    # the stem's BN
    result = fuse(model, "train")
    assert result.sites["bn_act"] == 8
    assert any(k == "not_fused" and "bn_act: 1 candidate(s)" in m and "a hook on" in m
               for k, m in result.notes), result.notes


def _hook_on(model, path: str, calls: list):
    model.get_submodule(path).register_forward_hook(lambda m, i, o: calls.append(path))


# a custom module with a hook stays a call in its parent's graph: the pattern across it is
# found on a second trace that goes into it (fx/hidden.py) and reported, not silently skipped
@pytest.mark.parametrize("factory, path, pattern, sites", [
    (functools.partial(convnext_v2.make_trained, grn="official"), "stages.0.0.grn", "grn_mlp",
     {"grn_mlp": 4}),
    (functools.partial(convnext_v2.make_trained, grn="timm"), "stages.2.1.grn", "grn_mlp",
     {"grn_mlp": 4}),
    (nano_gpt.make_new_gelu, "transformer.h.0.mlp.gelu", "mlp", {"mlp": 1}),
    (convnext_official.make, "stages.1.0.norm", "ln2d", {"ln2d": 8, "mlp": 5}),
], ids=["GRN", "timm GRN", "GPT's GELU class", "official LayerNorm"])
def test_a_hooked_custom_module_inside_a_candidate_is_a_reason(factory, path, pattern, sites):
    model, calls = build(factory), []
    _hook_on(model, path, calls)
    result = fuse(model, "train")
    assert {k: result.sites[k] for k in sites} == sites
    kind = type(model.get_submodule(path)).__name__
    assert (("not_fused", f"{pattern}: 1 candidate(s) not fused: a hook on its {kind} module "
                          f"(at {path})") in result.notes), result.notes
    assert calls == []                              # not called by the traces (with Proxies)
    model(*(tokens() if factory is nano_gpt.make_new_gelu else (image(),)))
    assert calls == [path]                          # and still runs, once per forward


def test_a_hooked_block_is_fused_inside_without_a_note():
    """Hooks on whole blocks (feature extraction) keep each block a call; its own graph is still
    fused, and no pattern spans a block's boundary, so nothing is reported."""
    plain = fuse(build(convnext_official.make), "train")
    model, calls = build(convnext_official.make), []
    paths = [p for p, m in model.named_modules() if type(m).__name__ == "Block"]
    for p in paths:
        _hook_on(model, p, calls)
    result = fuse(model, "train")
    assert result.sites == plain.sites and result.sites["mlp"] == len(paths)
    assert not [m for k, m in result.notes if "hook" in m], result.notes
    ref = build(convnext_official.make)
    calls.clear()
    model(image())
    assert sorted(calls) == sorted(paths)
    assert_matches_eager(model, ref, (image(),))


def test_unsupported_activation_is_a_reason():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Hardsigmoid())
    result = fuse(model, "train")
    assert dict(result.sites) == {"bn_train": 1}      # the BN alone, the activation left as is
    assert any("activation hardsigmoid" in m for k, m in result.notes if k == "not_fused")


@pytest.mark.parametrize("act", [nn.ReLU6(inplace=True), nn.Hardswish(), F.relu6, F.hardswish],
                         ids=["ReLU6", "Hardswish", "F.relu6", "F.hardswish"])
@pytest.mark.parametrize("frozen", [False, True], ids=["train", "frozen"])
def test_mobilenet_activations_run_in_the_bn_act_kernel(act, frozen, site_calls):
    """BN -> ReLU6 / hardswish (module or function): the C++ kernel with that activation in
    training (its node names it); frozen BN statistics: the eval Function with aten's act."""
    from fusebench.kernels.bn_act import cpu
    if not frozen and not cpu.build()[0]:
        pytest.skip(cpu.build()[1])

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.act = act                 # a module is a child; a function an attribute

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))
    torch.manual_seed(0)
    model = Block().double().train()
    with torch.no_grad():                  # z spread over every piece: ReLU6's 6, hardswish's +-3
        model.bn.weight.uniform_(4.0, 6.0)
    model.bn.train(not frozen)
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"bn_act": 1}
    y = assert_matches_eager(model, ref, (image(),))
    name = "relu6" if act in (F.relu6,) or isinstance(act, nn.ReLU6) else "hardswish"
    kernels = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert kernels == ([f"bn_eval_act[{name}]"] if frozen else
                       [f"bn_act[bn_act_cpu:{name}]"]), kernels
    probe = copy.deepcopy(ref)             # its running statistics move: not ref's
    z = probe.bn(probe.conv(image()))
    assert (z > 6).any() and (z < -3).any()
    for (n, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, msg=n)


def test_an_unsupported_act_is_an_mlp_reason_only_after_an_fc():
    """Linear -> hardsigmoid -> Linear is an MLP no kernel computes (a reason); BN ->
    hardsigmoid -> 1x1 conv is no MLP at all (MobileNet's layout: no mlp note)."""
    mlp = nn.Sequential(nn.Linear(4, 8), nn.Hardsigmoid(), nn.Linear(8, 4))
    conv = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Hardsigmoid(),
                         nn.Conv2d(8, 4, 1))
    notes = {name: [m for k, m in fuse(model, "train").notes if k == "not_fused"]
             for name, model in (("mlp", mlp), ("conv", conv))}
    assert any(m.startswith("mlp: 1 candidate(s)") and "hardsigmoid" in m
               for m in notes["mlp"]), notes
    assert not any(m.startswith("mlp") for m in notes["conv"]), notes


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_written_out_hardswish_and_hard_sigmoid_run_the_kernels(layout, site_calls):
    """HSwish (x * relu6(x + 3) / 6) after a BN is the bn_act kernel's hardswish; HSigmoid
    (relu6(e + 3) / 6) on an SE's Linear output is the se_gate kernel's hard gate with the exact
    1/6 slope (autograd of the division, not aten's float one)."""
    model = build(tv_mobilenet.make_written_out).train()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    y = assert_matches_eager(model, ref, (image().contiguous(memory_format=layout),), tol=1e-12)
    names = Counter(n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES)
    assert names["bn_act[bn_act_cpu:hardswish]"] == 3, names
    assert names["se_gate[cpu:hard,relu]"] == 2, names


def test_mobilenet_v3_se_runs_the_hard_gate(site_calls):
    """Its SEs' hardsigmoid gates fold into the projections (se_project[...,hard]); the same
    SE with no projection after it runs the se_gate kernel with the hard gate."""
    model = build(tv_mobilenet.make_v3).train()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    y = assert_matches_eager(model, ref, (image(),))
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert sum(n.startswith("se_project[") and n.endswith(",hard]") for n in names) == 2, names
    se = build(tv_mobilenet.make_v3).features[1].block[1]       # an SqueezeExcitation alone
    model, ref = nn.Sequential(se), nn.Sequential(copy.deepcopy(se))
    assert dict(fuse(model, "train").sites) == {"se_gate": 1}
    y = assert_matches_eager(model, ref, (torch.randn(2, 8, 6, 6, dtype=torch.float64),))
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert len(names) == 1 and ":hard," in names[0], names


def test_frozen_batchnorm_and_a_flipped_training_flag():
    """BN in eval mode inside a training run fuses too (running statistics); a model switched
    to eval after fusing runs its own forward (fx specialised the training branches)."""
    model = random_running_stats(build(tv_efficientnet.make).train(), freeze=True)
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["bn_act"] == 9
    y = assert_matches_eager(model, ref, (image(),))
    assert any(n.kernel.name.startswith("bn_eval_act[") for n in autograd_nodes(y)
               if type(n).__name__ == "MultiOpFunctionBackward")
    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(image()), ref(image()), atol=1e-10, rtol=1e-9)


class FunctionalBN(nn.BatchNorm2d):   # F.batch_norm on its own state, then an activation
    def __init__(self, c, act, eps=None):
        super().__init__(c)
        self.act, self.call_eps = act, self.eps if eps is None else eps

    def forward(self, x):
        self.num_batches_tracked.add_(1)
        return self.act(F.batch_norm(x, self.running_mean, self.running_var, self.weight,
                                     self.bias, self.training, self.momentum, self.call_eps))


def test_a_frozen_functional_bn_before_an_unfused_act_runs_the_norm_once(site_calls):
    """The BN alone is a bn_train site (no kernel computes hardsigmoid); frozen (eval) inside
    a training run, the site runs the norm only: calling the module would apply its act twice."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1),
                          FunctionalBN(4, nn.Hardsigmoid())).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"bn_train": 1}, result.notes
    model[1].eval()
    ref[1].eval()
    assert_matches_eager(model, ref, (image(),))
    assert site_calls == {"fused_bn_train": 1}


def test_a_functional_bn_with_other_settings_than_its_module_is_a_reason():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), FunctionalBN(4, nn.SiLU(), eps=1e-3))
    result = fuse(model.train(), "train")
    assert "bn_act" not in result.sites and "bn_train" not in result.sites
    assert any("bn_act: 1 candidate(s)" in m and "eps, momentum or training flag" in m
               for k, m in result.notes if k == "not_fused"), result.notes


class ReshapedConv1D(hf_gpt2.Conv1D):  # the same addmm, viewed back to a shape it wrote out
    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(2, 16, self.nf)


def test_conv1d_is_an_mlp_fc_only_in_hf_spelling(site_calls):
    """HF's Conv1D is an mlp fc (the asset test); an addmm viewed back to another shape
    expression is not read as one (nothing fuses, nothing breaks)."""
    model = hf_gpt2.make().double().train()
    for block in model.h:
        for name in ("c_fc", "c_proj"):
            old = getattr(block.mlp, name)
            new = ReshapedConv1D(old.nf, old.weight.shape[0]).double()
            new.load_state_dict(old.state_dict())
            setattr(block.mlp, name, new)
    ref = copy.deepcopy(model)
    assert "mlp" not in fuse(model, "train").sites
    assert_matches_eager(model, ref, tokens())
    assert "fused_mlp" not in site_calls


class DefaultsConv(nn.Conv2d):         # HF's EfficientNetDepthwiseConv2d: only its defaults
    def __init__(self, c, k):
        super().__init__(c, c, k, padding="same", groups=c, bias=False)


class OwnForwardConv(DefaultsConv):    # a forward of its own: it may compute anything
    def forward(self, x):
        return super().forward(x) * 1.0


@pytest.mark.parametrize("conv, dw_sites", [(DefaultsConv, 1), (OwnForwardConv, 0)],
                         ids=["keeps_forward", "own_forward"])
def test_hf_spellings_same_padding_and_conv2d_subclasses(conv, dw_sites, site_calls):
    """HF transformers' EfficientNet: 1x1 convs with padding="same" (no padding at K = 1) are
    pointwise; its depthwise conv is an nn.Conv2d subclass that only sets defaults, which
    computes what nn.Conv2d computes (rule.computes_as). A subclass with its own forward is
    not matched as a conv."""
    model = nn.Sequential(nn.Conv2d(3, 8, 1, padding="same", bias=False), nn.BatchNorm2d(8),
                          nn.SiLU(), conv(8, 3), nn.BatchNorm2d(8), nn.SiLU(),
                          nn.Conv2d(8, 4, 1, padding="same", bias=False),
                          nn.BatchNorm2d(4)).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"bn_act": 2, "conv1x1": 2, "bn_train": 1,
                                  **({"dwconv": 1} if dw_sites else {})}, result.sites
    assert_matches_eager(model, ref, (image(),))
    infer = build(lambda: copy.deepcopy(ref)).eval()
    folded = fuse(infer, "infer")
    left = [m for m in folded.model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(left) == 1 - dw_sites, folded.model      # every BN after a conv folded in
    with torch.no_grad():
        torch.testing.assert_close(folded.model(image()), infer(image()), atol=1e-9, rtol=1e-9)


def test_tracing_leaves_the_models_buffers_as_they_were():
    """Tracing a BatchNorm2d subclass's forward counts a batch on the real buffer; fuse puts
    it back, so the fused model's state is the state it was given."""
    model = build(timm_efficientnet.make).train()
    state = copy.deepcopy(model.state_dict())
    fuse(model, "train")
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_parameters_are_read_at_call_time():
    """What FSDP does between steps: swap a Parameter on the module; the fused site uses it."""
    model = build(convnext_official.make).train()
    fuse(model, "train")
    copied = copy.deepcopy(model)
    block = model.stages[0][0]
    block.pwconv2.weight = nn.Parameter(torch.zeros_like(block.pwconv2.weight))
    block.pwconv2.bias = nn.Parameter(torch.zeros_like(block.pwconv2.bias))
    x = image()
    stem = model.downsample_layers[0](x)
    torch.testing.assert_close(block(stem), stem)                # the MLP branch is now zero
    assert copied(x).shape == (2, 10)                            # a deep copy still runs


INFER_SITES = {"convnext_official": {"ln2d": 9, "mlp": 5},
               **{f"convnext_v2_{k}": {"ln2d": 9, "grn_mlp": 5} for k in convnext_v2.SPELLINGS},
               **dict.fromkeys(("nano_gpt", "nano_gpt_new_gelu"), {"mlp": 2, "attention": 2}),
               **dict.fromkeys(("llama_hf", "llama_meta", "llama_torch_rmsnorm"), LLAMA),
               "hf_gpt2": {"mlp": 2},
               "hf_llama": {**LLAMA, "attention": 2},
               "tv_efficientnet_relu_linear_se": {"conv_bn_fold": 13, "se_gate": 4},
               "tv_efficientnet_v2": {"conv_bn_fold": 13, "se_gate": 2, "silu_me": 9},
               **dict.fromkeys(("tv_efficientnet", "timm_efficientnet",
                                "timm_efficientnet_cumulative", "hf_efficientnet"),
                               {"conv_bn_fold": 13, "se_gate": 4, "silu_me": 9}),
               "tv_mobilenet_v2": {"conv_bn_fold": 7, "conv_bn_fold_seq": 6},
               # conv_bn_fold_seq counts Sequentials: the stem's and each block's
               "mobilenet_v3_written_out": {"conv_bn_fold_seq": 3, "se_gate": 2},
               "tv_mobilenet_v3": {"conv_bn_fold": 5, "conv_bn_fold_seq": 5, "mlp": 1,
                                   "se_gate": 2},
               "diffusion_unet": UNET,
               # every BN folds into its conv: the stem's and the blocks' (conv_bn_fold), the
               # downsample Sequentials' (conv_bn_fold_seq)
               **dict.fromkeys(("tv_resnet", "tv_resnet_functional"),
                               {"conv_bn_fold": 16, "conv_bn_fold_seq": 4}),
               "tv_resnet_basic": {"conv_bn_fold": 11, "conv_bn_fold_seq": 3},
               # in eval the encoder layers are left to torch's one-op fast path (a note);
               # the decoder layers have none: their MLPs fuse
               "torch_encoder": {}, "torch_encoder_post_relu": {}, "tv_vit": {"mlp": 2},
               "torch_seq2seq": {"mlp": 2}, "conformer": {"mlp": 4, "silu_me": 2}, "pointnet": {}}


def test_hf_llama_in_float32_runs_sdpa_and_a_call_with_extra_keywords_runs_as_written(site_calls):
    """The current-HF layout in float32 (float64 runs the code's float32 softmax as written):
    the whole model traces, its attentions run SDPA, forward and gradients close to float64
    eager. A call that gives keywords the model's **kwargs passes on runs its own forward; one
    whose keyword the forward's decorator takes runs the graph under the decorator."""
    ref = build(hf_llama.make)
    model = copy.deepcopy(ref).float()
    res = fuse(model, "train")
    assert res.sites == {**LLAMA, "attention": 2}
    assert not [t for k, t in res.notes if k == "fx_fallback"], res.notes   # the whole model
    ids = llama_tokens()
    y = assert_close_to_float64(model, ref, ids, atol=1e-4, rtol=1e-4, grad_tol=1e-4)
    assert "ScaledDotProductFlashAttentionForCpuBackward0" in {
        type(n).__name__ for n in autograd_nodes(y)}
    assert site_calls["fused_attention"] == 2
    site_calls.clear()
    torch.testing.assert_close(model(*ids, output_attentions=False), y)
    assert site_calls["fused_attention"] == 0
    # the forward's decorator runs at call time, around the graph: it takes its keyword
    (again,) = model(*ids, return_tuple=True)
    torch.testing.assert_close(again, y)
    assert site_calls["fused_attention"] == 2


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_asset_infer_fuses_a_copy_that_matches_eager(name):
    factory, inputs, _ = ASSETS[name]
    model = random_running_stats(build(factory).eval())
    state = copy.deepcopy(model.state_dict())
    result = fuse(model, "infer")
    assert dict(result.sites) == INFER_SITES[name], result.sites
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())  # untouched
    assert "Identity" not in result.unfused and "BatchNorm2d" not in result.unfused
    with torch.no_grad():
        x = inputs()
        torch.testing.assert_close(result.model(*x), model(*x), atol=1e-9, rtol=1e-9)


class ConvMlpGamma(nn.Module):         # 1x1 convs, SiLU, layer scale shaped (C, 1, 1)
    def __init__(self, c):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 4 * c, 1), nn.Conv2d(4 * c, c, 1)
        self.gamma = nn.Parameter(torch.rand(c, 1, 1) + 0.5)

    def forward(self, x):
        return x + self.gamma * self.fc2(F.silu(self.fc1(x)))


class FunctionalTanhMlp(nn.Module):    # F.linear with module parameters, tanh GELU, gamma[:, ...]
    def __init__(self, c):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(4 * c, c) / c), nn.Parameter(torch.rand(4 * c))
        self.w2 = nn.Parameter(torch.randn(c, 4 * c) / c)
        self.gamma = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):             # (N, C, H, W) -> NHWC MLP without fc2 bias -> NCHW
        h = F.gelu(F.linear(x.permute(0, 2, 3, 1), self.w1, self.b1), approximate="tanh")
        return (F.linear(h, self.w2) * self.gamma).permute(0, 3, 1, 2)


class NoBiasGeluMlp(nn.Module):        # nanoGPT with bias=False
    def __init__(self, c):
        super().__init__()
        self.c_fc, self.c_proj = nn.Linear(c, 4 * c, bias=False), nn.Linear(4 * c, c, bias=False)

    def forward(self, x):
        return self.c_proj(nn.functional.gelu(self.c_fc(x.permute(0, 2, 3, 1))))


class SpelledActMlp(nn.Module):       # Linear -> a hand-written activation -> Linear
    def __init__(self, c, act):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(c, 4 * c), nn.Linear(4 * c, c), act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x.permute(0, 2, 3, 1))))


SPELLED = {   # written-out activation -> the fused Function's kernel name
    "erf_gelu": (lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))), "mlp[linear,gelu"),
    "tanh_gelu_cubed": (lambda x: (1 + (0.7978845608 * (0.044715 * x * x * x + x)).tanh())
                        * (x * 0.5), "mlp[linear,gelu"),
    "quick_gelu": (lambda x: x * torch.sigmoid(1.702 * x), "mlp[linear,quick_gelu"),
    "silu": (lambda x: torch.sigmoid(x) * x, "mlp[linear,"),
    "hardswish": (lambda x: x * F.relu6(x + 3) / 6, "mlp[linear,hardswish"),
    "hardswish_grouped": (lambda x: x * (F.relu6(3.0 + x) / 6.0), "mlp[linear,hardswish"),
}


@pytest.mark.parametrize("name", sorted(SPELLED))
def test_hand_written_activations_are_one_mlp_site(name, site_calls):
    act, kernel = SPELLED[name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), SpelledActMlp(6, act)).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 1}, (result.sites, result.notes)
    y = assert_matches_eager(model, ref, (image(),))
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert site_calls == {"fused_mlp": 1} and len(names) == 1 and names[0].startswith(kernel)


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class _BiasAdds(torch.utils._python_dispatch.TorchDispatchMode):
    """How many aten.add calls read `bias`'s storage while active."""

    def __init__(self, bias):
        super().__init__()
        self.ptr, self.count = bias.data_ptr(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.add:
            self.count += any(isinstance(a, torch.Tensor) and a.data_ptr() == self.ptr
                              for a in args)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", ["silu", "quick_gelu", "hardswish"])
def test_an_mlp_with_no_bias_kernel_keeps_fc1s_bias_in_fc1s_gemm(name):
    """With no bias_gelu kernel to add fc1's bias in its own pass, `h0 + b1` was a pass over the
    hidden activation in forward and two more in backward (the rebuild, the derivative's
    input): a Conformer's SiLU MLPs made its fused step 0.92x eager's (docs/fused.md,
    forty-fifth session). The bias goes into fc1's GEMM instead, as eager's addmm has it."""
    torch.manual_seed(0)
    act = SPELLED[name][0]
    model = nn.Sequential(nn.Linear(6, 24), Lambda(act), nn.Linear(24, 6)).train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"mlp": 1}
    x = torch.randn(2, 16, 6, generator=torch.Generator().manual_seed(1))
    with _BiasAdds(model[0].bias) as log:
        y = model(x)
        y.backward(torch.ones_like(y))
    assert log.count == 0
    ref(x).backward(torch.ones_like(y))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)


def test_an_activation_not_computed_here_is_not_matched():
    model = SpelledActMlp(6, lambda x: x * torch.sigmoid(2.0 * x))
    assert not fuse(model, "train").sites


@pytest.mark.parametrize("cls", [ConvMlpGamma, FunctionalTanhMlp, NoBiasGeluMlp])
def test_each_mlp_spelling_is_one_mlp_site(cls, site_calls):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 1), cls(6)).double().train()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 1}, (result.sites, result.notes)
    y = assert_matches_eager(model, ref, (image(),))
    assert site_calls == {"fused_mlp": 1} and ran(y) == {"mlp": 1}


DIST_MODELS = {   # name -> (factory, input, sites)
    "convnext_official": (lambda: convnext_official.make(layer_scale=0.5),
                          lambda: torch.randn(2, 3, 32, 32,
                                              generator=torch.Generator().manual_seed(1)),
                          {"ln2d": 9, "mlp": 5, "dwconv": 5}),
    "llama": (llama.make, lambda: llama_tokens()[0], LLAMA),
    # the written-out causal attention as SDPA (reads no parameters), the MLPs with their adds
    "nano_gpt": (nano_gpt.make, lambda: tokens()[0], {"mlp": 2, "attention": 2}),
    # BN sites (bn_act, bn_add_act with the residual's gradient, bn_train) read the BNs'
    # parameters at call time: FSDP's flat views. float64: a float32 ResNet's gradients differ
    # from eager's by more than the tolerance below through the BNs alone (rounding)
    "tv_resnet": (lambda: tv_resnet.make().double(), lambda: image(), RESNET),
    # torch.nn's TransformerEncoderLayers, traced through a stand-in of their training path
    "torch_encoder": (torch_transformer.make, lambda: torch_inputs(torch_transformer.make)[0],
                      {"mlp": 2, "mha": 2})}


def _dist_rank(rank: int, init_file: str, out_dir: str, name: str) -> None:
    import json

    import torch.distributed as dist

    from fusebench.cell.rank_cell import RankRun
    from fusebench.run.distributed import DistSettings
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    make, inputs, _ = DIST_MODELS[name]
    x = inputs()

    def fresh():
        torch.manual_seed(0)
        return make()
    ref = fresh()
    ref(x).square().mean().backward()
    expected = {n: p.grad for n, p in ref.named_parameters()}
    out = {}
    for kind in ("ddp", "fsdp1", "fsdp2"):
        model = fresh()
        sites = dict(fuse(model, "train").sites)
        run = RankRun(DistSettings(kind, 2))
        wrapped = run.wrap(None, model, (), {}, EventLog())
        wrapped(x).square().mean().backward()
        got = run.full_grads(model)
        out[kind] = {"sites": sites, "names_same": sorted(got) == sorted(expected),
                     "mismatch": [n for n, g in expected.items()
                                  if not torch.allclose(got[n], g, atol=1e-5, rtol=1e-4)]}
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DIST_MODELS))
def test_graph_sites_train_under_ddp_and_fsdp(tmp_path, name):
    """The graph pass keeps the param-count-in-forward invariant: the official-ConvNeXt-like
    model, the LLaMA-like one (rms_norm and glu_mlp sites) and the ResNet (BN sites with a
    residual), fused, get the single-process gradients under DDP, FSDP1 and FSDP2."""
    import json
    import os

    import torch.multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_dist_rank, args=(str(tmp_path / "init"), str(tmp_path), name), nprocs=2,
             join=True)
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for kind, r in out.items():
            assert r["sites"] == DIST_MODELS[name][2], kind
            assert r["names_same"] and r["mismatch"] == [], (kind, r["mismatch"])


@pytest.mark.parametrize("name", ["convnext_official", "nano_gpt"])
def test_linear_mlp_runs_the_cpu_bias_gelu_kernel(name, monkeypatch):
    """A Linear -> GELU -> Linear MLP hands bias + GELU to the C++ kernel (its channels-last
    row path, through a (1, C, 1, M) view), forward and backward, and gradients still match
    float64 eager. It used to run aten's add + gelu there: the (M, C, 1, 1) view it passed
    counted as NCHW for the 'cpu|function' layout pick."""
    from fusebench.fuse import binding
    from fusebench.kernels.act import cpu as act_cpu
    ok, reason = act_cpu.build()
    if not ok:
        pytest.skip(reason)
    calls: Counter = Counter()
    real = binding.PAIRS["cpu"]

    def counted():
        pairs = dict(real())
        fwd, bwd, bwd_y = pairs["bias_gelu"]
        pairs["bias_gelu"] = (lambda *a: calls.update(["fwd"]) or fwd(*a),
                              lambda *a: calls.update(["bwd"]) or bwd(*a),
                              lambda *a: calls.update(["bwd_y"]) or bwd_y(*a))
        return pairs
    monkeypatch.setitem(binding.PAIRS, "cpu", counted)
    factory, inputs, sites = ASSETS[name]
    model = build(factory).train()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["mlp"] == sites["mlp"]
    assert_matches_eager(model, ref, inputs())
    # the forward, and the backward that also recomputes the GELU output: once each per site
    assert calls == {"fwd": sites["mlp"], "bwd_y": sites["mlp"]}, calls


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("has_bias", [True, False])
def test_split_1x1_conv_backward_matches_aten(layout, has_bias):
    """The MLP's fc2 backward in two steps (dx, then dw / db once the GELU output is rebuilt):
    GEMMs on channels-last views, aten's convolution_backward otherwise; both as aten's one call,
    against float64, with dx in x's layout."""
    from fusebench.fuse.engine import conv_bwd
    from fusebench.fuse.fusions.fx_mlp import FC
    torch.manual_seed(0)
    g = torch.randn(2, 12, 5, 3).contiguous(memory_format=layout)
    w, dy = torch.randn(4, 12, 1, 1), torch.randn(2, 4, 5, 3).contiguous(memory_format=layout)
    dx, weight_grads = FC["conv2d"].bwd(dy, g, w, has_bias)
    dw, db = weight_grads(g)
    ref = conv_bwd(dy.double(), g.double(), w.double(), has_bias)
    torch.testing.assert_close(dx.double(), ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), ref[1], rtol=1e-5, atol=1e-5)
    assert (db is None) == (not has_bias)
    if has_bias:
        torch.testing.assert_close(db.double(), ref[2], rtol=1e-5, atol=1e-5)
    assert dx.is_contiguous(memory_format=layout) and dw.shape == w.shape


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_conv1x1_is_a_gemm_on_channels_last_and_f_conv2d_otherwise(layout, monkeypatch):
    """The fused MLP's 1x1 convs: a GEMM on a channels-last x's free view (no F.conv2d call),
    F.conv2d on NCHW; y as the conv's (values vs float64, channels-last out for channels-last in)."""
    import torch.nn.functional as F
    from fusebench.fuse.conv1x1 import conv1x1
    calls = Counter()
    real = F.conv2d
    monkeypatch.setattr(F, "conv2d", lambda *a, **k: calls.update(["conv2d"]) or real(*a, **k))
    torch.manual_seed(0)
    x = torch.randn(2, 6, 4, 3).contiguous(memory_format=layout)
    w, b = torch.randn(10, 6, 1, 1), torch.randn(10)
    y = conv1x1(x, w, b)
    torch.testing.assert_close(y.double(), real(x.double(), w.double(), b.double()),
                               rtol=1e-5, atol=1e-5)
    assert calls["conv2d"] == (layout == torch.contiguous_format)
    assert y.is_contiguous(memory_format=layout)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_a_pointwise_conv_into_batch_norm_is_a_conv1x1_site(layout, site_calls):
    """A user's 1x1 nn.Conv2d feeding a BatchNorm (fused or not) is a conv1x1 site; a 3x3
    conv, a strided or grouped 1x1 conv, and a 1x1 conv feeding something else are not.
    Gradients match float64 eager in both layouts."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(),    # 3x3: aten
        nn.Conv2d(8, 12, 1), nn.BatchNorm2d(12), nn.SiLU(),             # -> bn_act site
        nn.Conv2d(12, 6, 1, bias=False), nn.BatchNorm2d(6),             # BN alone
        nn.Conv2d(6, 6, 1, stride=2), nn.BatchNorm2d(6),                # strided: aten
        nn.Conv2d(6, 6, 1, groups=2), nn.BatchNorm2d(6),                # grouped: aten
        nn.Conv2d(6, 5, 1)).double().train()                            # into nothing
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert result.sites["conv1x1"] == 2, result.sites
    assert_matches_eager(model, ref, (image().contiguous(memory_format=layout),))
    assert site_calls["fused_conv1x1"] == 2


# --- LLaMA's pieces: RMSNorm spellings and gated (GLU) MLPs ---------------------------------
class T5RMSNorm(nn.Module):            # casts only the squared x; x / sqrt(...) form
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        ms = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return self.weight * (x / torch.sqrt(ms + 1e-6))


class FunctionalRMSNorm(nn.Module):    # F.rms_norm on the module's own weight; nn default eps
    def __init__(self, c):
        super().__init__()
        self.w = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.w)


class SquaredByMul(nn.Module):         # torch.mean(x * x, dim=-1), weight on the right
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + 1e-5) * self.g


RMS_SPELLINGS = {"hf": lambda c: llama.HFRMSNorm(c), "meta": lambda c: llama.MetaRMSNorm(c),
                 "torch": lambda c: nn.RMSNorm(c), "t5": T5RMSNorm,
                 "functional": FunctionalRMSNorm, "squared_by_mul": SquaredByMul}


def _rms_nodes(y) -> int:
    return sum(type(n).__name__ == "RMSNormCpuFunctionBackward" for n in autograd_nodes(y))


@pytest.mark.parametrize("name", sorted(RMS_SPELLINGS))
def test_each_rms_norm_spelling_is_one_site_running_the_kernel(name, site_calls):
    """float32 against a float64 reference of the same module: one site, the C++ kernel ran
    (its autograd node is in the graph), forward and gradients within float32 rounding."""
    torch.manual_seed(0)
    model = RMS_SPELLINGS[name](24).train()
    with torch.no_grad():
        model.get_parameter(next(n for n, _ in model.named_parameters())).uniform_(0.5, 1.5)
    ref = copy.deepcopy(model).double()
    assert dict(fuse(model, "train").sites) == {"rms_norm": 1}
    x = 3 * torch.randn(2, 5, 24)
    xr = x.double().requires_grad_()
    y = model(x.requires_grad_())
    assert _rms_nodes(y) == 1 and site_calls["fused_rms_norm"] == 1
    y.backward(torch.ones_like(y))
    yr = ref(xr)
    yr.backward(torch.ones_like(yr))
    torch.testing.assert_close(y.double(), yr, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=2e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, atol=1e-4, rtol=1e-5)


def test_a_float64_x_under_float32_casts_computes_what_the_user_wrote(site_calls):
    """HF's spelling computes in float32 even for a float64 model: the site runs that spelling
    (the kernel would be float64 throughout), bit for bit as eager."""
    model = llama.HFRMSNorm(16).double()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x = torch.randn(3, 16, dtype=torch.float64, requires_grad=True)
    y = model(x)
    assert _rms_nodes(y) == 0 and site_calls["fused_rms_norm"] == 1
    assert torch.equal(y, ref(x))


class Unweighted(nn.Module):           # normalised, and then no weight multiplies it
    def __init__(self, c):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(c))

    def forward(self, x):
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return n + self.w


class GemmaNorm(nn.Module):
    """Gemma's RMSNorm, in our words: the weight stored as an offset from 1 and applied in
    float32, the result cast back at the end."""

    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(0.1 * torch.randn(c))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return (self._norm(x.float()) * (1.0 + self.weight.float())).type_as(x)


def test_gemmas_offset_weight_is_an_rms_norm_site(site_calls):
    model = GemmaNorm(16)
    ref = copy.deepcopy(model).double()
    result = fuse(model, "train")
    assert result.sites["rms_norm"] == 1
    assert not [m for cat, m in result.notes if cat == "not_fused"], result.notes
    x = torch.randn(3, 5, 16)
    y = assert_close_to_float64(model, ref, (x,), 1e-5, 1e-5, 1e-5, (x.double(),))
    assert _rms_nodes(y) == 1 and site_calls["fused_rms_norm"] == 1     # the kernel ran
    bf16 = copy.deepcopy(ref).to(torch.bfloat16)      # kernel would round 1 + w in bfloat16:
    eager = copy.deepcopy(bf16)                       # the site computes Gemma's spelling
    fuse(bf16, "train")
    xb = x.to(torch.bfloat16)
    assert torch.equal(bf16(xb), eager(xb)) and site_calls["fused_rms_norm"] == 2


def test_an_rms_norm_without_a_weight_multiply_is_a_reason():
    log_notes = fuse(Unweighted(8), "train").notes
    assert any(cat == "not_fused" and "rms_norm: 1 candidate(s)" in msg
               and "no 1-D weight Parameter" in msg for cat, msg in log_notes), log_notes
    r = fuse(nn.Sequential(nn.RMSNorm(8, elementwise_affine=False)), "train")
    assert not r.sites and any("elementwise_affine=False" in m for _, m in r.notes)


class GluMlp(nn.Module):               # act(gate(x)) * up(x) -> down, any operand order
    def __init__(self, c, act, bias=False, up_first=False):
        super().__init__()
        self.gate, self.up = nn.Linear(c, 3 * c, bias=bias), nn.Linear(c, 3 * c, bias=bias)
        self.down, self.act, self.up_first = nn.Linear(3 * c, c, bias=bias), act, up_first

    def forward(self, x):
        g, u = self.act(self.gate(x)), self.up(x)
        return x + self.down(u * g if self.up_first else g * u)


GLU_ACTS = {"swiglu": (nn.SiLU(), "silu"), "geglu": (nn.GELU(), "gelu"),
            "geglu_tanh": (lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh"),
            "reglu": (F.relu, "relu"),
            "swiglu_written": (lambda x: x * torch.sigmoid(x), "silu")}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("name", sorted(GLU_ACTS))
def test_gated_mlps_are_one_site_with_the_residual_folded(name, bias, site_calls):
    act, kind = GLU_ACTS[name]
    torch.manual_seed(0)
    model = GluMlp(8, act, bias, up_first=name == "reglu").double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"glu_mlp": 1}
    y = assert_matches_eager(model, ref, (torch.randn(2, 5, 8, dtype=torch.float64),))
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert names == [f"glu_mlp[{kind},cpu]"]
    assert [type(n).__name__ for n in autograd_nodes(y)].count("ResidualOpFunctionBackward") == 1


def test_a_gated_mlp_the_kernels_do_not_compute_is_a_reason():
    r = fuse(GluMlp(8, nn.Hardswish()), "train")
    assert not r.sites.get("glu_mlp")
    assert any("glu_mlp" in m and "activation hardswish" in m for _, m in r.notes), r.notes


class GluMlpTapped(GluMlp):            # the gate's activation is also returned
    def forward(self, x):
        g = self.act(self.gate(x))
        return self.down(g * self.up(x)), g


def test_a_gated_mlp_whose_gate_is_used_elsewhere_is_a_reason():
    r = fuse(GluMlpTapped(8, nn.SiLU()), "train")
    assert not r.sites.get("glu_mlp")
    assert any("glu_mlp" in m and "used elsewhere" in m for _, m in r.notes), r.notes


def test_the_glu_mlp_saves_x_and_the_two_projections_only():
    """Eager keeps silu(a) and the product as well: two hidden-sized tensors per MLP."""
    from fusebench.measure.memory import SavedTensorBytes
    torch.manual_seed(0)
    model = llama.MLP(32, 96)
    fused = copy.deepcopy(model)
    fuse(fused, "train")
    x = torch.randn(4, 16, 32, requires_grad=True)
    saved = {}
    for name, m in (("eager", model), ("fused", fused)):
        counter = SavedTensorBytes(exclude=[x, *m.parameters()])
        with counter.track():
            m(x)
        saved[name] = counter.bytes
    hidden = 4 * 16 * 96 * 4
    assert saved == {"eager": 4 * hidden, "fused": 2 * hidden}


class PackedGlu(nn.Module):            # one projection, its halves the gate and up
    def __init__(self, c, spelling):
        super().__init__()
        self.proj, self.down = nn.Linear(c, 6 * c), nn.Linear(3 * c, c)
        self.spelling = spelling

    def forward(self, x):
        ab = self.proj(x)
        if self.spelling == "phi3":        # gate, up = ...chunk(2, dim=-1); up * silu(gate)
            gate, up = ab.chunk(2, dim=-1)
            return x + self.down(up * F.silu(gate))
        if self.spelling == "geglu":       # diffusion models' GEGLU: the gate second
            h, gate = torch.chunk(ab, 2, dim=-1)
            return self.down(h * F.gelu(gate))
        a, b = ab.split(24, dim=-1)        # split(half, -1)
        return self.down(F.relu(a) * b)


PACKED = {"phi3": "glu_mlp[silu,cpu,packed gate,up]",
          "geglu": "glu_mlp[gelu,cpu,packed up,gate]",
          "split": "glu_mlp[relu,cpu,packed gate,up]"}


@pytest.mark.parametrize("spelling", sorted(PACKED))
def test_a_packed_gate_and_up_projection_is_one_site(spelling, site_calls):
    """`chunk(2, -1)` / `split(half, -1)` of one Linear: the kernel reads both halves in place
    and hands the projection its gradient packed; float64 forward and gradients as eager."""
    torch.manual_seed(0)
    model = PackedGlu(8, spelling).double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"glu_mlp": 1}
    y = assert_matches_eager(model, ref, (torch.randn(2, 5, 8, dtype=torch.float64),))
    names = [n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED_NODES]
    assert names == [PACKED[spelling]]


class ThirdsGlu(nn.Module):            # chunk(3): two of the thirds multiplied
    def __init__(self, c):
        super().__init__()
        self.proj, self.down = nn.Linear(c, 3 * c), nn.Linear(c, c)

    def forward(self, x):
        a, b, _ = self.proj(x).chunk(3, dim=-1)
        return self.down(F.silu(a) * b)


def test_a_projection_split_otherwise_is_a_reason_not_a_packed_gate():
    r = fuse(ThirdsGlu(8), "train")
    assert not r.sites.get("glu_mlp")
    assert any("glu_mlp" in m and "other than in two halves" in m for _, m in r.notes), r.notes


class WrittenSwish(nn.Module):         # timm's Swish module: x * x.sigmoid()
    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, x):
        return x.mul(x.sigmoid())


def test_a_written_out_act_after_batchnormact2d_drop_is_one_bn_act_site(site_calls):
    """The identity `drop` between timm's F.batch_norm and a written-out act has two users
    (the act reads it twice): still one site, float64 as eager, buffers too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                          timm_efficientnet.BatchNormAct2d(8, act_layer=WrittenSwish))
    model = model.double().train()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"bn_act": 1}
    for _ in range(2):
        y = assert_matches_eager(model, ref, (image(),))
    assert ran(y) == {"bn_act": 1}
    for b, c in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c)


# each asset benchmark at its tiny size: (the line naming the model and its sites, the site
# its third column leaves out, how many inputs it times: convnext_v2 NCHW and channels-last)
ASSET_BENCHMARKS = {
    "hf_llama": ("HF-layout LLaMA, b2, 16 tokens (sites {'rms_norm': 5, 'attention': 2, "
                 "'glu_mlp': 2})", "attention", 1),
    "conformer": ("Conformer (torchaudio's layout), b2, 20 frames (sites {'mlp': 4, 'mha': 2, "
                  "'bn_act': 2})", "mlp", 1),
    "pointnet": ("PointNet, b4, 24 points (sites {'bn_train': 1, 'bn_act': 9})", "bn_act", 1),
    "convnext_v2": ("ConvNeXt V2 (channels-last), b2, 32 px (sites {'dwconv': 5, 'ln2d': 9, "
                    "'grn_mlp': 5, 'patchify': 4})", "grn_mlp", 2)}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ASSET_BENCHMARKS))
def test_the_asset_benchmark_runs_at_a_tiny_size(name, capsys):
    from tests.helpers import load_benchmark
    head, site, runs = ASSET_BENCHMARKS[name]
    assert load_benchmark(name).main(["--size", "tiny", "--rounds", "3", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert head in out, out
    assert out.count("eager/fused") == runs and out.count(f"eager/no {site} site") == runs, out


def test_hf_llama_under_cpu_autocast_runs_sdpa(site_calls):
    """Under autocast HF's RoPE leaves q and k in float32 (cos / sin are cast to the hidden
    states' dtype) and v in bfloat16: SDPA casts them itself there, as eager's matmuls do."""
    torch.manual_seed(0)
    ref = hf_llama.make()
    model = copy.deepcopy(ref)
    assert fuse(model, "train").sites["attention"] == 2
    (ids,) = llama_tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, r = model(ids), ref(ids)
    assert y.dtype == r.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), r.float(), atol=5e-2, rtol=5e-2)
    assert site_calls["fused_attention"] == 2
    assert "ScaledDotProductFlashAttentionForCpuBackward0" in {
        type(n).__name__ for n in autograd_nodes(y)}


class BranchesOnValues(nn.Module):
    """An `if` on a traced value: the model is an fx_fallback, its RMSNorm traced alone."""

    def __init__(self):
        super().__init__()
        self.norm = hf_llama.RMSNorm(8)

    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return self.norm(x)


def test_a_norm_traced_on_its_own_is_not_listed_left_unfused():
    res = fuse(BranchesOnValues(), "train")
    assert res.sites == {"rms_norm": 1}
    assert [k for k, _ in res.notes].count("fx_fallback") == 1, res.notes
    assert "RMSNorm" not in res.unfused, res.unfused


class ActClass(nn.Module):
    """An activation class of the model's own, as timm's GELU and HF's NewGELUActivation /
    SiLUActivation: fx traces into it, so the site takes its F.gelu, not a module call."""

    def forward(self, x):
        return F.gelu(x)


class ActClassMlp(nn.Module):
    def __init__(self, p_inner: float = 0.0, p_out: float = 0.1):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 32), ActClass(), nn.Linear(32, 8)
        self.drop, self.live = nn.Dropout(p_inner), nn.Dropout(p_out)
        self.spare = ActClass()                   # never fused: its op stays in the graph

    def forward(self, x):
        return self.spare(self.live(self.fc2(self.drop(self.act(self.fc1(x))))))


@pytest.mark.parametrize("bench, listed", [("train", {"Dropout": 1, "ActClass": 1}),
                                           ("infer", {"ActClass": 1})])
def test_what_a_site_took_from_inlined_modules_and_dropouts_that_do_nothing_are_not_listed(
        bench, listed):
    # left unfused used to list the fused act (its op was inside the site) and every p=0 or
    # eval-mode dropout, which timm and HF models keep by the dozen
    res = fuse(ActClassMlp().train(bench == "train"), bench)
    assert res.sites.get("mlp") == 1, res.sites
    assert dict(res.unfused) == listed


class DropPath(nn.Module):
    """Stochastic depth as timm spells it (drop_prob)."""

    def __init__(self, drop_prob: float):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.shape[0], 1).bernoulli_(1 - self.drop_prob)
        return x * keep / (1 - self.drop_prob)


class StochasticDepth(DropPath):
    """... and as torchvision does (p, mode)."""

    def __init__(self, p: float, mode: str = "row"):
        super().__init__(p)
        self.p, self.mode = p, mode


class DeepBlocks(nn.Module):
    def __init__(self, prob: float):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.paths = nn.ModuleList([DropPath(prob), StochasticDepth(prob)])

    def forward(self, x):
        for path in self.paths:
            x = x + path(self.fc(x))
        return x


@pytest.mark.parametrize("prob, bench, listed", [
    (0.0, "train", {}), (0.1, "infer", {}),
    (0.1, "train", {"DropPath": 1, "StochasticDepth": 1})])
def test_stochastic_depth_that_returns_its_input_is_not_listed(prob, bench, listed):
    # the zoo's ConvNeXt at drop_path 0 read "left unfused: DropPath x12"
    res = fuse(DeepBlocks(prob).train(bench == "train"), bench)
    assert {k: v for k, v in res.unfused.items() if k != "Linear"} == listed


def test_hf_gpt2s_gelu_class_is_not_listed_once_its_mlp_fused():
    res = fuse(hf_gpt2.make().train(), "train")
    assert "NewGELUActivation" not in res.unfused and res.unfused["LayerNorm"] == 5
