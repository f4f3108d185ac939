"""The depthwise conv kernel (kernels.dwconv: forward, grad input, grad weight) against float64
aten, and its fusion: the C++ passes really run where the rule takes them, aten's elsewhere with
a reason, and bad input is refused or said."""
import copy
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from fusebench.fuse.fusions import dwconv as dwconv_fusion
from fusebench.fuse.fusions.dwconv import FusedDepthwiseConv
from fusebench.kernels.dwconv import cpu
from fusebench.kernels.dwconv.cpu import ALL, Passes
from tests.helpers import autograd_nodes


@pytest.fixture(scope="module", autouse=True)
def built():
    ok, reason = cpu.build()
    if not ok:
        pytest.skip(reason)


def _errs(x, w, b, stride, passes=ALL):
    """Relative max errors of (y, dx, dw, db) of the kernel (x's dtype) vs float64 aten."""
    k = w.shape[-1]
    f64 = lambda t: t.to(torch.float64, copy=True).requires_grad_()   # noqa: E731  (a copy)
    xr, wr = f64(x), f64(w)
    br = f64(b) if b is not None else None
    yr = F.conv2d(xr, wr, br, stride, k // 2, 1, w.shape[0])
    dy = torch.randn(yr.shape, generator=torch.Generator().manual_seed(1), dtype=x.dtype)
    yr.backward(dy.double())
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    bg = b.clone().requires_grad_() if b is not None else None
    y = cpu.dwconv_cpu(xg, wg, bg, stride, passes)
    fmt = torch.channels_last if cpu.is_channels_last(x) else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)                  # the caller's layout back
    y.backward(dy)
    pairs = [(y, yr), (xg.grad, xr.grad), (wg.grad, wr.grad)]
    if b is not None:
        pairs.append((bg.grad, br.grad))
    return [((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
            for a, r in pairs]


def _inputs(shape, k, layout, dtype, bias):
    n, c, h, w_ = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w_, generator=g, dtype=dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = 0.2 * torch.randn(c, 1, k, k, generator=g, dtype=dtype)
    return x, w, (torch.randn(c, generator=g, dtype=dtype) if bias else None)


# C: two full 16-float vectors + a half + single lanes (41), 8 + lanes (9), one lane; H, W
# smaller than the kernel, odd / even (stride-2 phases), W past the 4-output register block;
# 120 rows of 4 columns: the weight gradient's 32-row chunks, crossing images; 37 columns:
# AVX-512's 8-output blocks with every column inside, edge blocks and 4- and 1-output tails
SHAPES = [(2, 41, 11, 13), (1, 9, 6, 5), (2, 1, 3, 2), (1, 17, 1, 9), (3, 20, 40, 4),
          (1, 24, 5, 37)]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("k", cpu.SIZES)
@pytest.mark.parametrize("stride", cpu.STRIDES)
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_matches_float64_reference(shape, k, stride, layout, dtype):
    x, w, b = _inputs(shape, k, layout, dtype, bias=True)
    errs = _errs(x, w, b, stride)
    assert max(errs) < TOL[dtype], errs


@pytest.mark.parametrize("passes", [Passes(False, False, True), Passes(False, True, False),
                                    Passes(True, False, False)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_each_pass_alone_matches(passes, bias):
    """The fusion mixes our passes with aten's: every split gives the same gradients."""
    x, w, b = _inputs((2, 9, 7, 6), 3, "channels_last", torch.float32, bias)
    assert max(_errs(x, w, b, 2, passes)) < 1e-5


@pytest.mark.parametrize("passes", [Passes(False, True, True), Passes(False, False, True)],
                         ids=str)
def test_aten_forward_under_autocast_stays_in_the_inputs_dtype(passes):
    """An fp32 input under bf16 autocast (ConvNeXt's dwconv after a LayerNorm) with aten's
    forward and any of our backward passes (AVX2 builds run 7x7 that way): the Function's
    output stays fp32 as our passes' is, so backward gets an fp32 dy beside the saved fp32 x
    and weight. A bf16 output crashed oneDNN's convolution backward on an AVX2 CPU."""
    x, w, b = (t.requires_grad_() for t in
               _inputs((2, 9, 7, 6), 7, "channels_last", torch.float32, True))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = cpu.dwconv_cpu(x, w, b, 1, passes)
    assert y.dtype == torch.float32
    y.square().sum().backward()
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    F.conv2d(x64, w64, b64, 1, 3, 1, 9).square().sum().backward()
    for got, ref in ((x.grad, x64.grad), (w.grad, w64.grad), (b.grad, b64.grad)):
        torch.testing.assert_close(got.double(), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("k, stride", [(3, 1), (3, 2), (5, 2), (7, 1)])
def test_gradcheck_float64(k, stride):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 1, k, k, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: cpu.dwconv_cpu(*a, stride), (x, w, b))


@pytest.mark.parametrize("conv, reason", [
    (nn.Conv2d(8, 8, 4, padding=2, groups=8), "kernel"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=4), "not depthwise"),
    (nn.Conv2d(8, 8, 3, padding=1, groups=8, stride=3), "stride"),
    (nn.Conv2d(8, 8, 3, padding=1, groups=8, stride=(1, 2)), "stride"),
    (nn.Conv2d(8, 8, 3, padding=1, groups=8, dilation=2), "dilation"),
    (nn.Conv2d(8, 8, 7, padding=2, groups=8), "padding"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=8, padding_mode="reflect"), "padding"),
])
def test_supports_says_why_not(conv, reason):
    assert reason in cpu.supports(conv)
    for k in cpu.SIZES:
        for s in cpu.STRIDES:
            assert cpu.supports(nn.Conv2d(8, 8, k, s, padding=k // 2, groups=8)) == ""


def test_unsupported_dtype_is_a_clear_error():
    x = torch.randn(1, 4, 5, 5, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float32/float64"):
        cpu.dwconv_cpu(x, torch.randn(4, 1, 7, 7, dtype=torch.bfloat16), None)


def _ran_ours(y) -> bool:
    return any(n.name() == "DwConvCpuFunctionBackward" for n in autograd_nodes(y))


@pytest.mark.parametrize("k, stride", [(3, 1), (3, 2), (5, 1), (5, 2), (7, 1)])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_fused_module_runs_the_kernel(k, stride, layout):
    """EfficientNet's convs (3x3/5x5, stride 1/2) and ConvNeXt's 7x7: fused; 5x5 and 7x7 run
    our kernel (which passes: the test below), 3x3 oneDNN's (passes_for);
    gradients match the unfused model either way."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(6, 6, k, stride, padding=k // 2, groups=6), nn.Conv2d(6, 4, 1))
    model = nn.Sequential(*(nn.Conv2d(6, 6, k, stride, k // 2, groups=6), nn.Conv2d(6, 4, 1)))
    model.load_state_dict(ref.state_dict())
    res = fuse(model, "train")
    assert res.sites == {"dwconv": 1} and isinstance(model[0], FusedDepthwiseConv)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(2, 6, 9, 9).contiguous(memory_format=fmt)
    y, yr = model(x), ref(x)
    assert _ran_ours(y) == (k != 3)
    y.sum().backward(), yr.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)


class _Calls:
    """The kernel's extension, noting which entry points a step called."""

    def __init__(self, ext):
        self._ext, self.names = ext, set()

    def __getattr__(self, name):
        self.names.add(name)
        return getattr(self._ext, name)


@pytest.fixture
def fresh_rule():
    """A rule read under a patched build is not kept, nor the shapes earlier tests ran."""
    dwconv_fusion._rule.cache_clear()
    dwconv_fusion._taken.clear()
    yield
    dwconv_fusion._rule.cache_clear()
    dwconv_fusion._taken.clear()


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse_blocks", "per_tap"])
@pytest.mark.parametrize("k", [3, 5, 7])
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
def test_each_pass_runs_where_the_rule_takes_it(monkeypatch, fresh_rule, reuse, k, layout):
    """A build with AVX-512's reuse blocks runs all three passes of a channels-last 5x5 / 7x7
    ours; one without (or NCHW input) our grad weight alone; 3x3 none. The calls that reach the
    extension are what is counted, and the gradients match the unfused model's."""
    monkeypatch.setattr(cpu, "reuse_blocks", lambda: reuse)
    calls = _Calls(cpu.extension())
    monkeypatch.setattr(cpu, "extension", lambda: calls)
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(8, 8, k, padding=k // 2, groups=8), nn.Conv2d(8, 4, 1))
    model = copy.deepcopy(ref)
    fuse(model, "train")
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(2, 8, 12, 12).contiguous(memory_format=fmt).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # 3x3's "aten kept", tested below
        y = model(x)
    y.sum().backward()
    ref(xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-5, rtol=1e-5)
    every = {"forward", "backward_input", "backward_weight"}
    want = set() if k == 3 else every if reuse and layout == "channels_last" \
        else {"backward_weight"}
    assert calls.names & every == want
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("reuse", [True, False], ids=["reuse_blocks", "per_tap"])
def test_the_fused_mode_says_which_passes_ran(monkeypatch, fresh_rule, reuse):
    """One event line per cell: the conv shapes by the passes they ran, and the build read."""
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    monkeypatch.setattr(cpu, "reuse_blocks", lambda: reuse)
    model = nn.Sequential(nn.Conv2d(8, 8, 7, padding=3, groups=8), nn.Conv2d(8, 8, 1),
                          nn.Conv2d(8, 8, 5, padding=2, groups=8),
                          nn.Conv2d(8, 8, 3, padding=1, groups=8)).train()
    mode, events = get_mode("fused"), EventLog()
    x = torch.randn(2, 8, 12, 12).contiguous(memory_format=torch.channels_last)
    call = mode.prepare(model, (x,), {"bench": "train"}, events)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call(x).sum().backward()
    mode.finish(events)
    ours = "all three passes ours" if reuse else \
        "our grad weight with oneDNN's forward and grad input"
    build = "AVX-512 column-reuse build" if reuse else "build without AVX-512"
    assert [e.message for e in events.events() if e.message.startswith("dwconv: of ")] == [
        f"dwconv: of 3 conv shapes, {ours} at 2, oneDNN's three at 1 ({build}; "
        f"fuse/fusions/dwconv.py passes_for)"]


def test_reuse_blocks_follow_the_cpu():
    """The flag the rule reads says what the build compiled: -march=native, so AVX-512's
    blocks exactly where the CPU has avx512f."""
    flags = Path("/proc/cpuinfo")
    if not flags.exists():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    assert cpu.reuse_blocks() == ("avx512f" in flags.read_text().split())


@pytest.mark.parametrize("fmt", [torch.contiguous_format, torch.channels_last])
def test_aten_kept_where_measured_faster_and_said(fmt):
    """3x3 in either layout: aten's conv runs, with a warning (an event in a cell)."""
    dwconv_fusion._rule.cache_clear()
    model = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1, groups=2))
    fuse(model, "train")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = model(torch.randn(1, 2, 30, 30, requires_grad=True).contiguous(memory_format=fmt))
    assert not _ran_ours(y)
    assert any("aten's depthwise conv kept for 3x3" in str(w.message) for w in caught)


def test_fused_module_says_when_it_cannot_run_the_kernel():
    model = nn.Sequential(nn.Conv2d(6, 6, 7, padding=3, groups=6))
    fuse(model, "train")
    model[0].weight.data = model[0].weight.data.bfloat16()
    model[0].bias.data = model[0].bias.data.bfloat16()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model[0](torch.randn(2, 6, 9, 9, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert any("ran aten's depthwise conv instead" in str(w.message) for w in caught)


def test_unsupported_depthwise_conv_is_an_event():
    model = nn.Sequential(nn.Conv2d(6, 6, 3, stride=3, padding=1, groups=6))
    res = fuse(model, "train")
    assert "dwconv" not in res.sites
    assert any(c == "not_fused" and "dwconv" in m and "stride" in m for c, m in res.notes)


def test_not_fused_for_inference_or_cuda():
    for bench, device in (("infer", "cpu"), ("train", "cuda")):
        model = nn.Sequential(nn.Conv2d(6, 6, 7, padding=3, groups=6))
        assert "dwconv" not in fuse(model, bench, device).sites


def test_dwconv_is_a_registered_kernel_family():
    """`fusebench kernel dwconv` / `list kernels` / `env` see it: impls and a problem whose
    float64 reference is what the eager impl computes."""
    from fusebench.kernels import families, get_impl, get_problem, list_impls
    assert "dwconv" in families() and list_impls("dwconv")[:2] == ["cpu", "eager"]
    problem = get_problem("dwconv")
    g = torch.Generator().manual_seed(0)
    params = problem.make_params([2, 8, 9, 9], g)
    x = torch.randn(2, 8, 9, 9, generator=g)
    args = [params[n] for n in problem.params]
    ref = problem.reference(x, *args)
    for impl in list_impls("dwconv"):
        if get_impl("dwconv", impl).available("cpu")[0]:
            y = get_impl("dwconv", impl).fn(x, *args)
            torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
