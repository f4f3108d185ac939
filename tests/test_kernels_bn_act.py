"""The bn_act kernels (BatchNorm2d with training statistics + SiLU / ReLU / GELU / ReLU6 /
hardswish) against the float64 reference: forward output, batch statistics, running
statistics and every gradient, per activation x memory format x dtype, C++ on CPU and Triton
under TRITON_INTERPRET=1."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch

from fusebench.kernels import get_impl, list_impls
from fusebench.kernels.bn_act import cpu, triton
from fusebench.kernels.bn_act.reference import ACTS, bn_act_reference

MOMENTUM, EPS = 0.1, 1e-5
TOL = {torch.float32: 2e-5, torch.float64: 1e-12}
LAYOUTS = ("nchw", "channels_last")


def _built():
    ok, reason = cpu.build()
    if not ok:
        pytest.skip(reason)


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-3)).item()


def _inputs(shape, dtype, layout, shift=3.0, seed=0, w_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (2 * torch.randn(shape, generator=g) + shift).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    C = shape[1]
    w = (w_scale * (1 + 0.5 * torch.randn(C, generator=g))).to(dtype)
    b = (0.5 * torch.randn(C, generator=g)).to(dtype)
    dy = torch.randn(shape, generator=g).to(dtype)
    rm, rv = 0.1 * torch.randn(C, generator=g).to(dtype), (1 + torch.rand(C, generator=g)).to(dtype)
    return x, w, b, dy, rm, rv


def compare(mod, shape, dtype, layout, act, shift=3.0, w_scale=1.0):
    """Errors of mod.forward / mod.backward vs the float64 reference (autograd of it)."""
    x, w, b, dy, rm, rv = _inputs(shape, dtype, layout, shift, w_scale=w_scale)
    rm_ref, rv_ref = rm.double().clone(), rv.double().clone()
    y, mean, invstd = mod.forward(x, w, b, rm, rv, MOMENTUM, EPS, act)
    assert y.shape == x.shape and y.dtype == x.dtype and y.stride() == x.stride()
    dx, dw, db = mod.backward(dy, x, w, b, mean, invstd, act)
    assert dx.stride() == x.stride() and dw.dtype == w.dtype and db.dtype == b.dtype
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    yr = bn_act_reference(xr, wr, br, EPS, act, rm_ref, rv_ref, MOMENTUM)
    gx, gw, gb = torch.autograd.grad(yr, (xr, wr, br), dy.double())
    xd = x.double()
    mean_r = xd.mean((0, 2, 3))
    inv_r = torch.rsqrt(xd.var((0, 2, 3), unbiased=False) + EPS)
    return {"y": _rel(y, yr), "mean": _rel(mean, mean_r), "invstd": _rel(invstd, inv_r),
            "running_mean": _rel(rm, rm_ref), "running_var": _rel(rv, rv_ref),
            "dx": _rel(dx, gx), "dweight": _rel(dw, gw), "dbias": _rel(db, gb)}


def assert_close(errs, tol):
    bad = {k: e for k, e in errs.items() if not e <= tol}
    assert not bad, f"errors over {tol}: {bad}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("shape", [(3, 5, 7, 6), (2, 40, 37, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cpu_matches_float64_reference(shape, act, layout, dtype):
    """(2, 40, 37, 3): 222 rows span more than one float block (kBlock 256 values with 2 parts)."""
    _built()
    assert_close(compare(cpu, shape, dtype, layout, act), TOL[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_large_mean_keeps_precision(layout):
    """x = 1e4 + noise: the shifted sums keep the variance (E[x^2]-E[x]^2 in float would not)."""
    _built()
    assert_close(compare(cpu, (4, 6, 9, 9), torch.float32, layout, "silu", shift=1e4), 2e-4)


PIECEWISE = ("relu", "relu6", "hardswish")
# z's spread (the BN output is about N(b, w)) at which every piece of these is hit: ReLU6's
# clamp at 6 and hardswish's two kinks at -3 and 3 (at w ~ 1 few values pass 6)
WIDE = 5.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", PIECEWISE)
def test_cpu_piecewise_acts_on_every_piece(act, layout, dtype):
    _built()
    x, w, b, _, _, _ = _inputs((2, 40, 37, 3), dtype, layout, w_scale=WIDE)
    z = torch.nn.functional.batch_norm(x.double(), None, None, w.double(), b.double(), True,
                                       0.0, EPS)
    assert (z > 6).any() and (z < -3).any() and ((z > -3) & (z < 3)).any()
    assert_close(compare(cpu, (2, 40, 37, 3), dtype, layout, act, w_scale=WIDE), TOL[dtype])


# every act once, silu in both layouts (the interpreter is slow: keep the cases few)
TRITON_CASES = [("silu", "nchw"), ("silu", "channels_last"), ("relu", "channels_last"),
                ("gelu", "nchw"), ("gelu_tanh", "channels_last"), ("identity", "nchw"),
                ("relu6", "nchw"), ("hardswish", "channels_last")]


@pytest.mark.parametrize("act, layout", TRITON_CASES)
def test_triton_matches_float64_reference(act, layout, monkeypatch):
    """Under the interpreter. (2, 70, 3, 5): 2 channel blocks of 64 (a masked tail); BLOCK_R 8
    and 2 target splits make each reduction program loop over 2 row blocks, the last ragged."""
    ok, reason = triton.available("cpu")
    if not ok:
        pytest.skip(reason)
    monkeypatch.setattr(triton, "BLOCK_R", 8)
    monkeypatch.setattr(triton, "TARGET_SPLITS", 2)
    wide = WIDE if act in PIECEWISE else 1.0
    assert_close(compare(triton, (2, 70, 3, 5), torch.float32, layout, act, w_scale=wide), 2e-5)


@pytest.mark.parametrize("name", list_impls("bn_act"))
def test_registered_impls_through_autograd(name):
    """Every impl `fusebench kernel bn_act` can run: y and all grads vs the reference."""
    impl = get_impl("bn_act", name)
    ok, reason = impl.available("cpu")
    if not ok:
        pytest.skip(reason)
    if name == "cpu":
        _built()
    x, w, b, dy, _, _ = _inputs((2, 6, 5, 5), torch.float32, "channels_last")
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    y = impl.fn(x, w, b, EPS)
    y.backward(dy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = bn_act_reference(xr, wr, br, EPS, "silu")
    yr.backward(dy.double())
    errs = {"y": _rel(y, yr), "dx": _rel(x.grad, xr.grad), "dw": _rel(w.grad, wr.grad),
            "db": _rel(b.grad, br.grad)}
    assert_close(errs, 2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cpu_unsupported_dtype_is_a_clear_error(dtype):
    x = torch.randn(2, 3, 4, 4, dtype=dtype)
    with pytest.raises(TypeError, match="float32/float64"):
        get_impl("bn_act", "cpu").fn(x, torch.ones(3, dtype=dtype), torch.zeros(3, dtype=dtype),
                                     EPS)
    assert not cpu.runs_on(x)


def test_cpu_one_value_per_channel_is_refused():
    """nn.BatchNorm2d refuses training on one value per channel; so does the kernel."""
    _built()
    with pytest.raises(RuntimeError, match="more than 1 value per channel"):
        cpu.forward(torch.randn(1, 3, 1, 1), torch.ones(3), torch.zeros(3), None, None,
                    MOMENTUM, EPS, "silu")


def _apply_errs(mod, dtype, layout, act):
    """apply (the write pass from saved statistics) against forward's own y and the float64
    reference: what a consumer's backward rebuilds instead of saving."""
    x, w, b, _, _, _ = _inputs((2, 40, 5, 3), dtype, layout)
    y, mean, invstd = mod.forward(x, w, b, None, None, MOMENTUM, EPS, act)
    z = mod.apply(x, w, b, mean, invstd, act)
    assert z.stride() == x.stride() and z.dtype == x.dtype
    return {"vs_forward": _rel(z, y), "vs_reference": _rel(z, bn_act_reference(x, w, b, EPS, act))}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", sorted(ACTS))
def test_cpu_apply_rebuilds_the_forward_output(act, layout, dtype):
    _built()
    assert_close(_apply_errs(cpu, dtype, layout, act), TOL[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_apply_rebuilds_the_forward_output(layout):
    ok, reason = triton.available("cpu")
    if not ok:
        pytest.skip(reason)
    assert_close(_apply_errs(triton, torch.float32, layout, "silu"), 2e-5)
