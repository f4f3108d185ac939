"""The gn_act family (a diffusion UNet's GroupNorm -> SiLU, GroupNorm alone with the identity):
every registered impl and every pure pair against the float64 reference in both layouts, for
each activation and group count; gradcheck; what each impl saves for backward; clear errors
for what an impl does not take."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch

from fusebench.kernels import PROBLEMS, get_impl, list_impls
from fusebench.kernels.gn_act import cpu, function, triton
from fusebench.kernels.gn_act.reference import gn_act_reference
from fusebench.kernels.bn_act.cpu import ACT_CODES
from tests.test_kernels_act import _saved

PAIRS = {"function": (function.gn_act_fwd, function.gn_act_bwd),
         "cpu": (cpu.forward, cpu.backward), "triton": (triton.forward, triton.backward)}
GROUPS, EPS = PROBLEMS["gn_act"].consts


def _usable(name: str) -> None:
    ok, reason = get_impl("gn_act", name).available("cpu")
    if ok and name == "cpu":
        ok, reason = cpu.build()
    if not ok:
        pytest.skip(f"gn_act {name}: {reason}")


def _ref(x, w, b, groups, eps, act, dy):
    """float64 reference output and (dx, dw, db)."""
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = gn_act_reference(xr, wr, br, groups, eps, act)
    return yr.detach(), torch.autograd.grad(yr, (xr, wr, br), dy.double())


def _close(got, ref, tol):
    scale = ref.abs().max().clamp_min(1.0)
    assert ((got.double() - ref).abs().max() / scale).item() < tol


def _inputs(shape, channels_last: bool, dtype, offset=0.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.randn(shape, generator=g, dtype=torch.float64) + offset
    w = 1 + 0.5 * torch.randn(shape[1], generator=g, dtype=torch.float64)
    b = 0.5 * torch.randn(shape[1], generator=g, dtype=torch.float64)
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return [t.to(dtype).contiguous(memory_format=fmt) if t.dim() == 4 else t.to(dtype)
            for t in (x, w, b, dy)]


@pytest.mark.parametrize("name", list_impls("gn_act"))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_every_impl_matches_float64_at_the_problems_groups(name, layout):
    _usable(name)
    x, w, b, dy = _inputs((2, 64, 5, 3), layout == "channels_last", torch.float32)
    x, w, b = (t.requires_grad_() for t in (x, w, b))
    y = get_impl("gn_act", name).fn(x, w, b, GROUPS, EPS)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    yr, gr = _ref(x, w, b, GROUPS, EPS, "silu", dy)
    for got, ref in ((y, yr), *zip(grads, gr)):
        _close(got, ref, 2e-5)
    if name in PAIRS:       # y and dx in x's layout: the convs after it keep theirs
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        assert y.is_contiguous(memory_format=fmt) and grads[0].is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("act", sorted(ACT_CODES))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_pure_pairs_every_act_layout_and_group_count(name, act, layout):
    """The pairs the fuser binds, at 1 group (LayerNorm over C, H, W), 3 channels a group and
    one channel a group (InstanceNorm), odd H*W (a tail after the vector loops)."""
    _usable(name)
    dtypes = (torch.float32,) if name == "triton" else (torch.float32, torch.float64)
    fwd, bwd = PAIRS[name]
    for dtype in dtypes:
        for groups in (1, 4, 12):
            x, w, b, dy = _inputs((3, 12, 7, 5), layout == "channels_last", dtype, seed=groups)
            y, mean, rstd = fwd(x, w, b, groups, EPS, act)
            assert mean.shape == rstd.shape == (3, groups)
            dx, dw, db = bwd(dy, x, w, b, mean, rstd, groups, act)
            yr, (dxr, dwr, dbr) = _ref(x, w, b, groups, EPS, act, dy)
            tol = 1e-12 if dtype == torch.float64 else 3e-5
            for got, ref in ((y, yr), (dx, dxr), (dw, dwr), (db, dbr)):
                _close(got, ref, tol)


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_a_large_mean_keeps_float32_precision(name, layout):
    """x = 1000 + O(1): E[x^2] - E[x]^2 in float32 would lose the variance; the shifted sums
    keep it."""
    _usable(name)
    x, w, b, dy = _inputs((2, 8, 16, 16), layout == "channels_last", torch.float32,
                          offset=1000.0)
    fwd, bwd = PAIRS[name]
    y, mean, rstd = fwd(x, w, b, 4, EPS, "silu")
    dx, dw, db = bwd(dy, x, w, b, mean, rstd, 4, "silu")
    yr, (dxr, dwr, dbr) = _ref(x, w, b, 4, EPS, "silu", dy)
    # float32 x itself carries 1000 * 2^-24 of rounding: relative to x's spread of ~2, 3e-5
    for got, ref in ((y, yr), (dx, dxr), (dw, dwr), (db, dbr)):
        _close(got, ref, 5e-4)


@pytest.mark.parametrize("name", ["function", "cpu"])
def test_gradcheck_float64(name):
    _usable(name)
    fn = get_impl("gn_act", name).fn
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 3, 2, generator=g, dtype=torch.float64)
    w, b = (torch.randn(6, generator=g, dtype=torch.float64) for _ in range(2))
    inputs = tuple(t.requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: fn(x, w, b, 3, EPS), inputs)


def test_what_each_impl_saves():
    """function / cpu: x and the (N, G) mean and rstd (and the (C,) parameters, left out of
    the count as inputs); aten's group_norm + silu also keeps the GroupNorm output."""
    _usable("cpu")
    x = torch.randn(4, 64, 8, 8)
    w, b = torch.randn(64), torch.randn(64)
    stats = 2 * 4 * GROUPS * 4
    for name in ("function", "cpu"):
        total, not_x = _saved(lambda x, w, b: get_impl("gn_act", name).fn(x, w, b, GROUPS, EPS),
                              x, w, b)
        assert not_x == stats, (name, total, not_x)
    _, not_x = _saved(lambda x, w, b: get_impl("gn_act", "aten").fn(x, w, b, GROUPS, EPS),
                      x, w, b)
    assert not_x >= x.numel() * 4


@pytest.mark.parametrize("name", ["cpu", "triton"])
def test_what_an_impl_does_not_take_is_a_clear_error(name):
    _usable(name)
    fwd = PAIRS[name][0]
    x, w, b = torch.randn(2, 6, 3, 3), torch.randn(6), torch.randn(6)
    with pytest.raises((RuntimeError, ValueError), match="not divisible by groups=4"):
        fwd(x, w, b, 4, EPS, "silu")
    with pytest.raises((RuntimeError, TypeError), match="unsupported dtype"):
        fwd(x.to(torch.float64 if name == "triton" else torch.float16), w, b, 3, EPS, "silu")
    if name == "cpu":
        with pytest.raises(TypeError, match="divisible by groups=4"):
            cpu.gn_act_cpu(x, w, b, 4, EPS)
