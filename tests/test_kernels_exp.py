"""cpu_math.h's inline exp_nonpos and float sigmoid (every SiLU loop; issue 15.2), and the erf
GELU kernel beside aten's, against float64 over the whole float range that matters: where sigmoid and
Phi saturate, where exp underflows (x < -87) and is clamped (x < -100), and at the special
values, which must come out as aten's do: NaN stays NaN, silu(+inf) and gelu(+inf) are +inf."""
import math

import pytest
import torch

from fusebench.kernels.act import cpu as act_cpu


@pytest.fixture(scope="module")
def ext():
    ok, reason = act_cpu.build()
    if not ok:
        pytest.skip(reason)
    return act_cpu.extension()


def _grid() -> torch.Tensor:
    dense = torch.linspace(-30, 30, 60_001)                  # every 0.001: the polynomial's range
    wide = torch.linspace(-200, 200, 4_001)                   # saturation, underflow, the clamp
    tiny = torch.tensor([1e-30, -1e-30, 1e-40, -1e-40, 0.0, -0.0])   # subnormals and zeros
    return torch.cat([dense, wide, tiny]).reshape(1, 1, 1, -1)


def test_silu_matches_float64_to_float_rounding(ext):
    x = _grid()
    ref = torch.nn.functional.silu(x.double())
    # 3 ulp relative; absolute, 88 * 1.2e-38: exp_nonpos flushes results under 2^-126 to 0
    # (documented), and silu multiplies that by x (-88 < x < -87)
    torch.testing.assert_close(ext.silu_forward(x).double(), ref, rtol=3.6e-7, atol=1.1e-36)


def test_silu_backward_matches_float64(ext):
    x = _grid()
    dy = torch.ones_like(x)
    xd = x.double()
    s = torch.sigmoid(xd)
    ref = s * (1 + xd * (1 - s))
    # silu' = s (1 + x (1 - s)) has a root near x = -1.28: absolute error there, 2 float ulps of 1
    torch.testing.assert_close(ext.silu_backward(dy, x).double(), ref, rtol=1e-6, atol=2.4e-7)


def test_special_values_as_aten(ext):
    x = torch.tensor([math.nan, math.inf, 1e30, -1e30, 100.0, -100.0]).reshape(1, 1, 1, -1)
    y = ext.silu_forward(x)
    assert torch.isnan(y[..., 0]).all()                       # NaN stays NaN
    assert y[..., 1].item() == math.inf and y[..., 2].item() == x[..., 2].item()
    assert y[..., 4].item() == 100.0
    assert y[..., 3].item() == 0.0 and y[..., 5].item() == 0.0     # -x * exp(-huge): flushed
    g = ext.silu_backward(torch.ones_like(x), x)
    ref = torch.ops.aten.silu_backward(torch.ones_like(x), x)   # NaN at NaN and inf, as ours
    torch.testing.assert_close(g, ref, equal_nan=True, rtol=0, atol=0)


def _gelu64(x):
    return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def _worst(ours, aten, ref, x):
    """The largest error relative to max(|x|, 1) of ours and of aten's float32, vs float64."""
    scale = x.double().abs().clamp_min(1.0)
    return [((t.double() - ref).abs() / scale).max().item() for t in (ours, aten)]


def test_gelu_matches_float64_as_closely_as_aten(ext):
    # a GELU kernel's erf may be any float erf (libmvec's today) as long as it is as close
    x = _grid()
    ours, aten = _worst(ext.bias_gelu_forward(x, torch.zeros(1), False),
                        torch.nn.functional.gelu(x), _gelu64(x.double()), x)
    assert ours <= 1.5 * aten + 1e-8, (ours, aten)


def test_gelu_backward_matches_float64_as_closely_as_aten(ext):
    x = _grid()
    xd = x.double()
    ref = 0.5 * (1 + torch.erf(xd / math.sqrt(2))) + xd * torch.exp(-xd * xd / 2) / math.sqrt(2 * math.pi)
    dx, _ = ext.bias_gelu_backward(torch.ones_like(x), x, torch.zeros(1), False)
    aten = torch.ops.aten.gelu_backward(torch.ones_like(x), x)
    ours, theirs = _worst(dx, aten, ref, x)
    assert ours <= 1.5 * theirs + 1e-8, (ours, theirs)


def test_gelu_special_values_as_float64(ext):
    # against aten's float64 GELU, not its float32: aten's vectorised float erf path depends on
    # the CPU (on an AVX-512 Xeon it gives gelu(inf) = nan, on AVX2 inf; float64 says inf)
    x = torch.tensor([math.nan, math.inf, -math.inf, 1e30, -1e30]).reshape(1, 1, 1, -1)
    ours = ext.bias_gelu_forward(x, torch.zeros(1), False)
    ref = torch.nn.functional.gelu(x.double()).float()
    torch.testing.assert_close(ours, ref, equal_nan=True, rtol=0, atol=0)


def _gelu_tanh64(x):
    k = math.sqrt(2 / math.pi)
    th = torch.tanh(k * (x + 0.044715 * x ** 3))
    dth = (1 - th * th) * k * (1 + 3 * 0.044715 * x * x)
    return 0.5 * x * (1 + th), 0.5 * (1 + th) + 0.5 * x * dth


def test_gelu_tanh_matches_float64_as_closely_as_aten(ext):
    # the tanh is inline ((1 - e) / (1 + e)): absolute, not relative, accuracy near 0 is its claim
    x = _grid()
    ref_y, ref_d = _gelu_tanh64(x.double())
    ours_y, aten_y = _worst(ext.bias_gelu_forward(x, torch.zeros(1), True),
                            torch.nn.functional.gelu(x, approximate="tanh"), ref_y, x)
    assert ours_y <= 1.5 * aten_y + 1e-7, (ours_y, aten_y)
    dx, _ = ext.bias_gelu_backward(torch.ones_like(x), x, torch.zeros(1), True)
    aten_d = torch.ops.aten.gelu_backward(torch.ones_like(x), x, approximate="tanh")
    ours_d, theirs_d = _worst(dx, aten_d, ref_d, x)
    assert ours_d <= 1.5 * theirs_d + 1e-7, (ours_d, theirs_d)


def test_gelu_tanh_special_values_as_float64(ext):
    x = torch.tensor([math.nan, math.inf, -math.inf, 1e30, -1e30, 0.0]).reshape(1, 1, 1, -1)
    ours = ext.bias_gelu_forward(x, torch.zeros(1), True)
    ref = torch.nn.functional.gelu(x.double(), approximate="tanh").float()
    torch.testing.assert_close(ours, ref, equal_nan=True, rtol=0, atol=0)
