"""The MLP's row-block schedule (fuse/mlp_blocks.py, kernels/act/mlp_blocks.h): the kernel against
torch in float64 at any row / block / thread split, the MLP sites of the zoo's ConvMlp and of
models written as other projects write them (the official ConvNeXt's Linear MLP with layer
scale and residual, nanoGPT's MLP with exact and written-out tanh GELU) against eager with
the blocks really run, the rule `auto` follows, --fused-mlp, and the event fused mode
reports."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fusebench.fuse import fuse, mlp_blocks
from fusebench.kernels.act import cpu
from fusebench.models import create_model
from tests.helpers import (assert_close_to_float64, assert_matches_eager, autograd_nodes,
                           channels_last_image, load_benchmark, moved)

sys.path.insert(0, str(Path(__file__).parent))
from assets import convnext_official, nano_gpt  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu.available("cpu")[0] or not cpu.build()[0],
                                reason=f"no MLP kernel here: {cpu.build()[1]}")


@pytest.fixture(autouse=True)
def _fresh_tally(monkeypatch):
    monkeypatch.setattr(mlp_blocks, "_ran", {})


def _reference(x, w1, b1, w2, b2, res, approximate):
    y = F.linear(F.gelu(F.linear(x, w1, b1), approximate=approximate), w2, b2)
    return y if res is None else y + res


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), c=st.integers(1, 9), h=st.integers(1, 17), o=st.integers(1, 9),
       block=st.integers(1, 8), has_b2=st.booleans(), has_res=st.booleans(),
       tanh=st.booleans(), threads=st.sampled_from([1, 2]))
def test_the_kernel_is_torchs_mlp_in_float64(rows, c, h, o, block, has_b2, has_res, tanh,
                                             threads):
    g = torch.Generator().manual_seed(rows * 1000 + c * 100 + h)
    x, w1, b1, w2 = (torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
                     for s in ((rows, c), (h, c), (h,), (o, h)))
    b2 = torch.randn(o, dtype=torch.float64, generator=g, requires_grad=True) if has_b2 else None
    res = torch.randn(rows, o, dtype=torch.float64, generator=g) if has_res else None
    dout = torch.randn(rows, o, dtype=torch.float64, generator=g)
    approximate = "tanh" if tanh else "none"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, h0 = cpu.extension().mlp_forward(x.detach(), w1.detach(), b1.detach(), w2.detach(),
                                          None if b2 is None else b2.detach(), res, tanh, block)
        got = cpu.extension().mlp_backward(dout, x.detach(), h0, b1.detach(), w1.detach(),
                                       w2.detach(), tanh, block, has_b2)
    finally:
        torch.set_num_threads(before)
    ref = _reference(x, w1, b1, w2, b2, res, approximate)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h0, F.linear(x, w1).detach(), rtol=1e-12, atol=1e-12)
    wrt = [x, w1, b1, w2] + ([b2] if has_b2 else [])
    exp = torch.autograd.grad(ref, wrt, dout)
    for name, a, b in zip(("dx", "dw1", "db1", "dw2", "db2"), got, exp):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11, msg=name)
    assert (got[4] is None) == (not has_b2)


@pytest.mark.parametrize("bad, says", [
    (lambda x, w1, w2: (x.t(), w1, w2), "x must be contiguous"),
    (lambda x, w1, w2: (x, w1[:, :-1], w2), "w1 must be (H, C)"),
    (lambda x, w1, w2: (x.half(), w1.half(), w2.half()), "float32 or float64 only"),
])
def test_the_kernel_refuses_operands_it_does_not_take(bad, says):
    x, w1, w2 = torch.randn(6, 4), torch.randn(8, 4), torch.randn(4, 8)
    x, w1, w2 = bad(x, w1, w2)
    with pytest.raises(RuntimeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        cpu.extension().mlp_forward(x, w1, torch.zeros(8, dtype=w1.dtype), w2, None, None, False, 4)


# model -> (factory, input, MLP sites, the kernel names that must have run)
MODELS = {
    "zoo convnext_atto (ConvMlp, 1x1 convs)": (
        lambda: create_model("convnext_atto"), channels_last_image, 12,
        {"mlp_blocks[cpu,conv1x1,none]"}),
    "official ConvNeXt (Linear, layer scale, residual)": (
        convnext_official.make, channels_last_image, 5, {"mlp_blocks[cpu,linear,none]"}),
    "nanoGPT (Linear, residual)": (nano_gpt.make, nano_gpt.tokens, 2,
                                   {"mlp_blocks[cpu,linear,none]"}),
    "nanoGPT, NewGELU written out (tanh)": (nano_gpt.make_new_gelu, nano_gpt.tokens, 2,
                                            {"mlp_blocks[cpu,linear,tanh]"}),
}


def _kernels_run(y) -> list[str]:
    return [n.kernel.name for n in autograd_nodes(y) if hasattr(n, "kernel")]


def _blocks_run(y) -> int:
    """How many MLP sites behind y ran in row blocks (their Function on the autograd graph)."""
    return sum(name.startswith("mlp_blocks[") for name in _kernels_run(y))


@pytest.mark.parametrize("name", list(MODELS))
def test_user_models_mlps_in_blocks_match_eager_in_float64(name):
    factory, inputs, sites, kernels = MODELS[name]
    ref = moved(factory()).double().train()
    model = copy.deepcopy(ref)
    fuse(model, "train")
    x = inputs()
    with mlp_blocks.using("blocks"):
        y = assert_matches_eager(model, ref, (x,), tol=1e-9)
    assert kernels <= set(_kernels_run(y))
    assert _blocks_run(y) == sites and not mlp_blocks.tally()["layers"]


def test_blocks_in_float32_are_as_close_to_float64_as_the_layers():
    ref = moved(convnext_official.make()).double().train()
    errs, ran = {}, {}
    for schedule in ("layers", "blocks"):
        model = copy.deepcopy(ref).float()
        fuse(model, "train")
        x = channels_last_image()
        with mlp_blocks.using(schedule):
            y = assert_close_to_float64(model, copy.deepcopy(ref), (x.float(),), 1e-4, 1e-4,
                                        1e-4, (x,))
        errs[schedule], ran[schedule] = (y.double() - ref(x)).abs().max().item(), _blocks_run(y)
    assert ran == {"layers": 0, "blocks": 5}
    assert errs["blocks"] < 4 * errs["layers"] + 1e-6


# A transformer's MLP with its residual: the module benchmarks/mlp_blocks.py measures the rule on
Mlp = load_benchmark("mlp_blocks").Residual


@pytest.mark.parametrize("rows, c, dtype, schedule, runs", [
    (1024, 96, torch.float32, "auto", True),      # 1.5 MiB of fc1 output, narrow: blocks
    (512, 96, torch.float32, "auto", False),      # 0.75 MiB: stays in L2 layer by layer
    (1024, 384, torch.float32, "auto", False),    # wide GEMMs: the FMAs bound them
    (1024, 96, torch.bfloat16, "blocks", False),  # the kernel is float32 / float64
    (8, 4, torch.float32, "blocks", True),        # asked for: wherever the operands allow
    (1024, 96, torch.float32, "layers", False),
])
def test_auto_runs_blocks_where_they_were_measured_to_pay(rows, c, dtype, schedule, runs):
    model = Mlp(c).to(dtype)
    fuse(model, "train")
    with mlp_blocks.using(schedule):
        model(torch.randn(rows // 8, 8, c, dtype=dtype)).sum().backward()
    assert dict(mlp_blocks.tally()) == ({"blocks": 1} if runs else {"layers": 1})


def test_blocks_keep_out_of_autocast():
    model = Mlp(96)
    fuse(model, "train")
    with torch.autocast("cpu", dtype=torch.bfloat16), mlp_blocks.using("blocks"):
        model(torch.randn(128, 8, 96)).float().sum().backward()
    assert dict(mlp_blocks.tally()) == {"layers": 1}


@pytest.mark.parametrize("fmt, runs", [(torch.channels_last, "blocks"),
                                         (torch.contiguous_format, "layers")])
def test_a_1x1_conv_mlp_runs_in_blocks_on_channels_last_input_only(fmt, runs):
    from fusebench.models.layers import ConvMlp
    model = nn.Sequential(ConvMlp(16, 64)).train()
    fuse(model, "train")
    with mlp_blocks.using("blocks"):           # NCHW x: its rows are no view of it
        model(torch.randn(2, 16, 8, 8).contiguous(memory_format=fmt)).sum().backward()
    assert dict(mlp_blocks.tally()) == {runs: 1}


def test_an_unknown_schedule_is_a_usage_error():
    from fusebench.errors import UsageError
    with pytest.raises(UsageError, match="MLP schedule 'tiles': valid: auto, blocks, layers"):
        with mlp_blocks.using("tiles"):
            pass


def test_the_fused_mode_says_how_many_mlp_call_shapes_ran_in_blocks():
    import re

    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    model = nn.Sequential(Mlp(96)).train()
    mode, events = get_mode("fused"), EventLog()
    x = torch.randn(128, 8, 96)                 # 1.5 MiB of fc1 output: blocks
    call = mode.prepare(model, (x,), {"bench": "train"}, events)
    for _ in range(3):                          # calls of a shape seen before add nothing
        call(x).sum().backward()
    call(x[:16]).sum().backward()               # a shape small enough for L2: layers
    mode.finish(events)
    lines = [m for e in events.events()
             if (m := re.match(r"mlp: (\d+) of (\d+) MLP call shapes ran in 512-row blocks",
                               e.message))]
    assert [m.groups() for m in lines] == [("1", "2")]


@pytest.mark.parametrize("value, runs", [("layers", "0 of 1"), ("blocks", "1 of 1")])
def test_the_fused_mlp_option_picks_the_schedule(value, runs):
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    model = nn.Sequential(Mlp(8)).train()
    mode, events = get_mode("fused"), EventLog()
    x = torch.randn(4, 8, 8)                    # far below auto's threshold: blocks only asked
    try:
        call = mode.prepare(model, (x,), {"bench": "train", "fused_mlp": value}, events)
        call(x).sum().backward()
        mode.finish(events)
    finally:
        mlp_blocks.set_default("auto")          # the worker's process-wide choice
    assert [e.message for e in events.events() if " MLP call shapes " in e.message] == [
        f"mlp: {runs} MLP call shapes ran in 512-row blocks kept in L2 (fuse/mlp_blocks.py, "
        f"--fused-mlp {value})"]
