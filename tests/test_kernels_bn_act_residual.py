"""The bn_act kernels with a residual: y = act(BN(x) + r), a ResNet block's end (`bn3 -> +=
identity -> ReLU`) and an inverted residual's projection (`bn + x`, the identity act). Forward
output and every gradient, r's included, against the float64 reference, per activation x
layout x dtype; C++ on CPU and Triton under TRITON_INTERPRET=1. r may come in the other
layout than x (a downsample branch's output) and is read as it is."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch

from fusebench.kernels.bn_act import cpu, triton
from fusebench.kernels.bn_act.reference import ACTS, bn_act_reference
from test_kernels_bn_act import EPS, LAYOUTS, MOMENTUM, TOL, WIDE, _inputs, _rel, assert_close


def _residual(x, layout, seed=1):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(x.shape, generator=g).to(x.dtype)
    return r.contiguous(memory_format=torch.channels_last) if layout == "channels_last" else r


def compare(mod, shape, dtype, layout, act, r_layout=None, w_scale=1.0):
    x, w, b, dy, rm, rv = _inputs(shape, dtype, layout, w_scale=w_scale)
    r = _residual(x, r_layout or layout)
    rm_ref, rv_ref = rm.double().clone(), rv.double().clone()
    y, mean, invstd = mod.forward(x, w, b, rm, rv, MOMENTUM, EPS, act, residual=r)
    assert y.shape == x.shape and y.dtype == x.dtype and y.stride() == x.stride()
    dx, dw, db, dr = mod.backward(dy, x, w, b, mean, invstd, act, residual=r)
    assert dx.stride() == x.stride() and dr.shape == r.shape and dr.dtype == r.dtype
    z = mod.apply(x, w, b, mean, invstd, act, residual=r)
    xr, wr, br, rr = (t.double().requires_grad_() for t in (x, w, b, r))
    yr = bn_act_reference(xr, wr, br, EPS, act, rm_ref, rv_ref, MOMENTUM, residual=rr)
    gx, gw, gb, gr = torch.autograd.grad(yr, (xr, wr, br, rr), dy.double())
    return {"y": _rel(y, yr), "apply": _rel(z, yr), "running_mean": _rel(rm, rm_ref),
            "running_var": _rel(rv, rv_ref), "dx": _rel(dx, gx), "dweight": _rel(dw, gw),
            "dbias": _rel(db, gb), "dresidual": _rel(dr, gr)}


def _built():
    ok, reason = cpu.build()
    if not ok:
        pytest.skip(reason)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", sorted(ACTS))
@pytest.mark.parametrize("shape", [(3, 5, 7, 6), (2, 40, 37, 3)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cpu_residual_matches_float64_reference(shape, act, layout, dtype):
    _built()
    wide = WIDE if act in ("relu6", "hardswish") else 1.0
    assert_close(compare(cpu, shape, dtype, layout, act, w_scale=wide), TOL[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_residual_in_the_other_layout(layout):
    """A downsample branch's output may come NCHW into a channels-last block (or back)."""
    _built()
    other = "nchw" if layout == "channels_last" else "channels_last"
    assert_close(compare(cpu, (2, 24, 5, 7), torch.float32, layout, "relu", other),
                 TOL[torch.float32])


def test_cpu_residual_of_another_shape_is_refused():
    _built()
    x, w, b, dy, _, _ = _inputs((2, 4, 3, 3), torch.float32, "nchw")
    with pytest.raises(RuntimeError, match="residual"):
        cpu.forward(x, w, b, None, None, MOMENTUM, EPS, "relu", residual=torch.ones(4, 1, 1))


TRITON_CASES = [("relu", "nchw"), ("relu", "channels_last"), ("identity", "channels_last"),
                ("silu", "nchw")]


@pytest.mark.parametrize("act, layout", TRITON_CASES)
def test_triton_residual_matches_float64_reference(act, layout, monkeypatch):
    """(2, 70, 3, 5): 2 channel blocks of 64 (a masked tail), ragged row blocks."""
    ok, reason = triton.available("cpu")
    if not ok:
        pytest.skip(reason)
    monkeypatch.setattr(triton, "BLOCK_R", 8)
    monkeypatch.setattr(triton, "TARGET_SPLITS", 2)
    assert_close(compare(triton, (2, 70, 3, 5), torch.float32, layout, act), 2e-5)


def _from_output_errs(mod, act, layout, dtype=torch.float32):
    """backward with the forward's output in place of the residual against the residual's."""
    x, w, b, dy, _, _ = _inputs((2, 12, 5, 7), dtype, layout, w_scale=WIDE)
    r = 3 * _residual(x, layout)        # both sides of ReLU6's kinks at 0 and 6
    y, mean, invstd = mod.forward(x, w, b, None, None, MOMENTUM, EPS, act, residual=r)
    by_r = mod.backward(dy, x, w, b, mean, invstd, act, residual=r)
    by_y = mod.backward(dy, x, w, b, mean, invstd, act, output=y)
    return {name: _rel(a, e) for name, a, e in zip(("dx", "dweight", "dbias", "dresidual"),
                                                    by_y, by_r)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("act", cpu.FROM_OUTPUT)
def test_cpu_relu_backward_reads_act_prime_off_the_output(act, layout):
    """What the fused site keeps for ReLU (its output, which eager's ReLU keeps too) gives the
    residual's gradients: g = dy * act' (the residual's gradient) and its sum (the bias's)
    exactly, the same mask read off either; the sums of g * x-hat (the weight's gradient, and
    dx through it) to float32 rounding, as the compiler may contract g * x-hat into an FMA in
    one instantiation and not the other (an AVX2 build's NCHW loops: 1.7e-8 and 5.8e-8)."""
    _built()
    errs = _from_output_errs(cpu, act, layout)
    assert_close({k: errs[k] for k in ("dresidual", "dbias")}, 0.0)
    assert_close(errs, 4 * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("act", ["silu", "gelu", "hardswish", "identity"])
def test_cpu_output_in_place_of_the_residual_is_refused_for_other_acts(act):
    _built()
    x, w, b, dy, _, _ = _inputs((2, 4, 3, 3), torch.float32, "nchw")
    y, mean, invstd = cpu.forward(x, w, b, None, None, MOMENTUM, EPS, act, residual=x)
    with pytest.raises(RuntimeError, match="relu or relu6"):
        cpu.backward(dy, x, w, b, mean, invstd, act, output=y)


def test_triton_relu_backward_reads_act_prime_off_the_output(monkeypatch):
    ok, reason = triton.available("cpu")
    if not ok:
        pytest.skip(reason)
    monkeypatch.setattr(triton, "BLOCK_R", 8)
    for act in triton.FROM_OUTPUT:
        assert_close(_from_output_errs(triton, act, "channels_last"), 0.0)
    x, w, b, dy, _, _ = _inputs((2, 4, 3, 3), torch.float32, "nchw")
    y, mean, invstd = triton.forward(x, w, b, None, None, MOMENTUM, EPS, "silu", residual=x)
    with pytest.raises(ValueError, match="relu"):
        triton.backward(dy, x, w, b, mean, invstd, "silu", output=y)


def test_kernel_cell_rechecks_a_kinked_problem_once_on_other_inputs():
    """A ReLU on a sum: a float32 element on the other side of the kink than float64 flips
    one gradient value; the cell repeats a failed check once, and the repeat decides."""
    from fusebench.cell.kernel_cell import KernelCheck, kink_recheck
    from fusebench.kernels import get_problem
    bad, good = KernelCheck(False, 1e-7, 0.14, "over tolerance: dx 1.4e-01"), \
        KernelCheck(True, 1e-7, 1e-6, None)
    kinked, smooth = get_problem("bn_add_act"), get_problem("bn_act")
    assert kinked.kinks and not smooth.kinks
    again = kink_recheck(bad, kinked, lambda: good)
    assert again.passed and "dx 1.4e-01" in again.detail and "did not repeat" in again.detail
    failed = kink_recheck(bad, kinked, lambda: bad)
    assert not failed.passed and "failed again" in failed.detail
    assert kink_recheck(bad, smooth, lambda: good) is bad
    wrong = KernelCheck(False, None, None, "modified its input x in place")
    assert kink_recheck(wrong, kinked, lambda: good) is wrong


@pytest.mark.parametrize("name", ["aten", "cpu", "triton"])
def test_registered_bn_add_act_impls_through_autograd(name, monkeypatch):
    """What `fusebench kernel bn_add_act` runs: y and every gradient, the residual's included."""
    from fusebench.kernels import get_impl
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    impl = get_impl("bn_add_act", name)
    ok, reason = impl.available("cpu")
    if not ok:
        pytest.skip(reason)
    if name == "cpu":
        _built()
    x, w, b, dy, _, _ = _inputs((2, 6, 5, 5), torch.float32, "channels_last")
    r = _residual(x, "channels_last")
    x, r, w, b = (t.requires_grad_() for t in (x, r, w, b))
    impl.fn(x, r, w, b, EPS).backward(dy)
    xr, rr, wr, br = (t.detach().double().requires_grad_() for t in (x, r, w, b))
    bn_act_reference(xr, wr, br, EPS, "relu", residual=rr).backward(dy.double())
    assert_close({k: _rel(a.grad, e.grad) for k, a, e in
                  (("dx", x, xr), ("dr", r, rr), ("dw", w, wr), ("db", b, br))}, 2e-5)
