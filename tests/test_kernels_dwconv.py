"""The depthwise conv backward kernel (kernels.dwconv) against a float64 reference, and its
fusion: the C++ backward really runs, and bad input is refused or said."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.kernels.dwconv import cpu
from fusebench.fuse import fuse
from fusebench.fuse.fusions.dwconv import FusedDepthwiseConv


@pytest.fixture(scope="module", autouse=True)
def built():
    ok, reason = cpu.build()
    if not ok:
        pytest.skip(reason)


def _errs(x, w, b, dy):
    """Relative max errors of (y, dx, dw, db) of the kernel (x's dtype) vs float64 aten."""
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    bg = b.clone().requires_grad_() if b is not None else None
    y = cpu.dwconv_cpu(xg, wg, bg)
    y.backward(dy)
    k = w.shape[-1]
    xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
    br = b.double().requires_grad_() if b is not None else None
    yr = F.conv2d(xr, wr, br, padding=k // 2, groups=w.shape[0])
    yr.backward(dy.double())
    pairs = [(y, yr), (xg.grad, xr.grad), (wg.grad, wr.grad)]
    if b is not None:
        pairs.append((bg.grad, br.grad))
    return [((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-12)).item()
            for a, r in pairs]


# C: a full vector, a half vector and single lanes (16 / 8 / 1 floats); H, W smaller and larger
# than the kernel; W not a multiple of the 8- and 4-position register blocks
SHAPES = [(2, 40, 13, 11, 7), (1, 5, 9, 9, 5), (2, 17, 3, 2, 7), (1, 25, 6, 19, 5),
          (3, 1, 7, 7, 7)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("bias", [True, False])
def test_matches_float64_reference(shape, layout, bias):
    n, c, h, w_, k = shape
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, h, w_, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w = 0.2 * torch.randn(c, 1, k, k, generator=g)
    b = torch.randn(c, generator=g) if bias else None
    dy = torch.randn(n, c, h, w_, generator=g)
    errs = _errs(x, w, b, dy)
    assert max(errs) < 1e-5, errs


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    for (n, c, h, w_, k) in [(1, 3, 4, 5, 7), (2, 2, 5, 3, 5)]:
        x = torch.randn(n, c, h, w_, dtype=torch.float64, generator=g, requires_grad=True)
        w = torch.randn(c, 1, k, k, dtype=torch.float64, generator=g, requires_grad=True)
        b = torch.randn(c, dtype=torch.float64, generator=g, requires_grad=True)
        assert torch.autograd.gradcheck(cpu.dwconv_cpu, (x, w, b))


@pytest.mark.parametrize("conv, reason", [
    (nn.Conv2d(8, 8, 3, padding=1, groups=8), "kernel"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=4), "not depthwise"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=8, stride=2), "stride"),
    (nn.Conv2d(8, 8, 7, padding=2, groups=8), "padding"),
    (nn.Conv2d(8, 8, 7, padding=3, groups=8, padding_mode="reflect"), "padding"),
])
def test_supports_says_why_not(conv, reason):
    assert reason in cpu.supports(conv)
    assert cpu.supports(nn.Conv2d(8, 8, 7, padding=3, groups=8)) == ""


def test_unsupported_dtype_is_a_clear_error():
    x = torch.randn(1, 4, 5, 5, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="float32/float64"):
        cpu.dwconv_cpu(x, torch.randn(4, 1, 7, 7, dtype=torch.bfloat16), None)


def test_fused_module_runs_the_kernel_and_says_when_it_cannot():
    model = nn.Sequential(nn.Conv2d(6, 6, 7, padding=3, groups=6), nn.Conv2d(6, 6, 1))
    res = fuse(model, "train")
    assert res.sites == {"dwconv": 1} and isinstance(model[0], FusedDepthwiseConv)
    y = model(torch.randn(2, 6, 9, 9))
    assert y.grad_fn.next_functions[0][0].name() == "DwConvCpuFunctionBackward"
    model[0].weight.data = model[0].weight.data.bfloat16()
    model[0].bias.data = model[0].bias.data.bfloat16()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model[0](torch.randn(2, 6, 9, 9, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert any("ran aten's depthwise conv instead" in str(w.message) for w in caught)


def test_not_fused_for_inference_or_cuda():
    for bench, device in (("infer", "cpu"), ("train", "cuda")):
        model = nn.Sequential(nn.Conv2d(6, 6, 7, padding=3, groups=6))
        assert "dwconv" not in fuse(model, bench, device).sites


def test_dwconv_is_a_registered_kernel_family():
    """`fusebench kernel dwconv` / `list kernels` / `env` see it: impls and a problem whose
    float64 reference is what the eager impl computes."""
    from fusebench.kernels import families, get_impl, get_problem, list_impls
    assert "dwconv" in families() and list_impls("dwconv") == ["cpu", "eager"]
    problem = get_problem("dwconv")
    g = torch.Generator().manual_seed(0)
    params = problem.make_params([2, 8, 9, 9], g)
    x = torch.randn(2, 8, 9, 9, generator=g)
    args = [params[n] for n in problem.params]
    ref = problem.reference(x, *args)
    for impl in ("eager", "cpu"):
        y = get_impl("dwconv", impl).fn(x, *args)
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
