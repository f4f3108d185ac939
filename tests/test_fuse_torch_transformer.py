"""The graph pass inside torch.nn's own transformer modules (fx keeps them leaves:
fuse/fx/torch_modules.py): nn.TransformerEncoderLayer traced through its training path,
nn.TransformerDecoderLayer through its own forward, the stacks walked into. Each setting a
user picks (pre- / post-norm, ReLU / GELU, torch's default dropout 0.1, padding and causal
masks) fuses every layer's MLP, computes what eager computes in float64 (with the same
dropout draws from one seed), and says where a layer is left to torch."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from fusebench.fuse import fuse
from tests.helpers import autograd_nodes

sys.path.insert(0, str(Path(__file__).parent))
from assets import torch_transformer  # noqa: E402

FUSED = ("MultiOpFunctionBackward", "ResidualOpFunctionBackward")


def _pair(factory, **kw):
    torch.manual_seed(0)
    model = factory(**kw).double().train()
    return model, copy.deepcopy(model)


def _step(model, inputs, seed):
    torch.manual_seed(seed)                # the same dropout draws for both models
    y = model(*inputs)
    y.square().mean().backward()
    return y


def _assert_same_step(model, ref, inputs, seed=5):
    y, r = _step(model, inputs, seed), _step(ref, inputs, seed)
    torch.testing.assert_close(y, r, atol=1e-10, rtol=1e-10)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-10, rtol=1e-10, msg=n)
    return y


def _kernels(y) -> list[str]:
    return sorted(n.kernel.name for n in autograd_nodes(y) if type(n).__name__ in FUSED)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["p0", "p0.1"])
@pytest.mark.parametrize("activation", ["relu", "gelu", nn.GELU(approximate="tanh")],
                         ids=["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre", "post"])
def test_encoder_layers_fuse_their_mlps_and_match_float64_eager(norm_first, activation,
                                                                dropout):
    model, ref = _pair(torch_transformer.make, norm_first=norm_first, activation=activation,
                       dropout=dropout)
    params = dict(model.named_parameters())
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 2, "mha": 2}, (result.sites, result.notes)
    assert all(params[n] is p for n, p in model.named_parameters())   # the user's own
    inputs = model.example_inputs(3, "cpu", torch.float64)    # a key-padding mask inside
    y = _assert_same_step(model, ref, inputs)
    act = {"relu": "relu", "gelu": "gelu[none]"}.get(activation, "gelu[tanh]")
    tail = f",dropout {dropout}" if dropout else ""
    assert _kernels(y) == [f"mlp[linear,{act}{tail}]"] * 2, _kernels(y)


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre", "post"])
def test_seq2seq_decoder_layers_fuse_too_under_a_causal_mask(norm_first):
    """nn.Transformer: its encoder and decoder stacks are walked into, the decoder layers
    (self-attention under tgt_mask / tgt_is_causal, cross-attention on the memory) traced as
    they are: every attention a site, the cross-attentions too."""
    model, ref = _pair(torch_transformer.make_seq2seq, norm_first=norm_first, dropout=0.1)
    result = fuse(model, "train")
    assert dict(result.sites) == {"mlp": 4, "mha": 6}, (result.sites, result.notes)
    assert not any("mha" in m for _, m in result.notes)
    y = _assert_same_step(model, ref, model.example_inputs(2, "cpu", torch.float64))
    assert len(_kernels(y)) == 4


def test_another_seed_draws_another_dropout_mask():
    model, _ = _pair(torch_transformer.make, dropout=0.3)
    fuse(model, "train")
    inputs = model.example_inputs(2, "cpu", torch.float64)
    torch.manual_seed(1)
    a = model(*inputs)
    torch.manual_seed(2)
    assert not torch.equal(model(*inputs), a)


def test_the_site_saves_less_than_eager_with_dropout_and_no_more_with_relu():
    """GELU + dropout: fc1's output and the dropout's noise, where eager also keeps the
    activation and the dropout's output. ReLU: its output, as eager's ReLU keeps."""
    from fusebench.measure.memory import SavedTensorBytes

    def saved(m, inputs):
        counter = SavedTensorBytes(exclude=list(m.parameters()))
        with counter.track():
            m(*inputs)
        return counter.bytes
    for kw, less in ((dict(activation="gelu", dropout=0.1), True),
                     (dict(activation="relu", dropout=0.0), False)):
        model, ref = _pair(torch_transformer.make, **kw)
        fuse(model, "train", only=["mlp"])              # the MLP sites' own saving
        inputs = model.example_inputs(4, "cpu", torch.float64)
        got, eager = saved(model, inputs), saved(ref, inputs)
        assert (got < eager) if less else (got == eager), (kw, got, eager)


def test_eval_leaves_encoder_layers_to_torchs_fast_path_and_says_so():
    model, ref = _pair(torch_transformer.make)
    result = fuse(model.eval(), "infer")
    assert not result.sites
    assert any(c == "not_fused" and "TransformerEncoderLayer: 2 module(s) left to torch in "
               "eval mode" in m for c, m in result.notes), result.notes
    inputs = model.example_inputs(2, "cpu", torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(result.model(*inputs), ref.eval()(*inputs))


def test_a_model_fused_in_training_runs_torchs_forward_in_eval():
    """The rewritten forward runs only in the mode it was traced in: in eval the class's own
    forward (and with it torch's fast path) runs, as in the unfused model."""
    model, ref = _pair(torch_transformer.make, dropout=0.1)
    fuse(model, "train")
    inputs = model.example_inputs(2, "cpu", torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(*inputs), ref.eval()(*inputs))


def test_a_post_norm_layers_ln_linear_candidate_says_why_it_cannot_fuse():
    """Post-norm: the LayerNorm before linear1 also feeds the residual add. The note says
    that, not that ln_linear is opt-in (turning it on would fuse nothing there)."""
    model, _ = _pair(torch_transformer.make, norm_first=False)
    notes = [m for c, m in fuse(model, "train").notes if m.startswith("ln_linear")]
    assert notes and all("LayerNorm output used elsewhere too" in m for m in notes), notes


def test_a_subclass_with_its_own_forward_is_not_read_as_torchs_layer():
    class Scaled(nn.TransformerEncoderLayer):
        def forward(self, src, *args, **kwargs):
            return 2 * super().forward(src, *args, **kwargs)
    torch.manual_seed(0)
    model = nn.Sequential(Scaled(8, 2, 16, dropout=0.0, batch_first=True)).double()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert "mlp" not in result.sites
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x))


@pytest.mark.slow
def test_the_benchmark_runs_at_a_tiny_size(capsys):
    from tests.helpers import load_benchmark
    bench = load_benchmark("torch_transformer")
    assert bench.main(["--size", "tiny", "--batch", "2", "--rounds", "2", "--threads", "1",
                       "--variants", "default,pre-gelu,vit"]) == 0
    out = capsys.readouterr().out
    assert out.count("sites {'mha': 2, 'mlp': 2}") == 3 and out.count("eager/fused") == 3, out
    assert "MultiheadAttention fwd+bwd (2, 12, 32)" in out and "eager/site" in out
