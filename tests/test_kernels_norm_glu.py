"""The rms_norm and glu families (LLaMA's RMSNorm and SwiGLU gate): every registered impl
against the float64 reference in float32 and bfloat16, gradcheck, what each saves for backward,
the C++ op under opcheck, clear errors for what an impl does not take."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch

from fusebench.kernels import PROBLEMS, get_impl, list_impls
from fusebench.kernels.glu.function import glu_bwd, glu_fwd, glu_reference
from fusebench.kernels.rms_norm import cpu as rms_cpu
from fusebench.kernels.rms_norm.reference import rms_norm_reference
from tests.test_kernels_act import _impl, _saved, assert_close, run_and_compare

FAMILIES = ("rms_norm", "glu")
CASES = [(f, n) for f in FAMILIES for n in list_impls(f)]
# the last dim is RMSNorm's: odd widths leave a tail after the vector loop
SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 4, 3, 129), (2, 2, 1, 1000)]


def _ids(case):
    return "-".join(map(str, case))


def _with_consts(family, name):
    """The impl called as its kernel problem calls it: fn(x, *params, *consts)."""
    fn, consts = _impl(family, name), PROBLEMS[family].consts
    return lambda *a: fn(*a, *consts)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_matches_float64_reference(case, shape):
    fn = _with_consts(*case)
    x = 3 * torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare(case[0], fn, x), 1e-5)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_bfloat16(case):
    fn = _with_consts(*case)
    x = torch.randn(2, 6, 3, 40, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare(case[0], fn, x, dtype=torch.bfloat16), 3e-2)


@pytest.mark.parametrize("name", list_impls("rms_norm"))
def test_rms_norm_on_a_transformers_3d_activation_and_a_strided_view(name):
    fn = _impl("rms_norm", name)
    g = torch.Generator().manual_seed(2)
    base = torch.randn(3, 9, 2 * 48, generator=g)
    w = (1 + 0.5 * torch.randn(48, generator=g)).requires_grad_()
    for x in (base[..., :48], base[..., :48].contiguous()):     # a view, then dense rows
        x = x.detach().requires_grad_()
        dy = torch.randn(x.shape, generator=g)
        y = fn(x, w, 1e-5)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        yr = rms_norm_reference(xr, wr, 1e-5)
        dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
        for a, b in ((y, yr), (dx, dxr), (dw, dwr)):
            torch.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("act", ["silu", "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("name", ["function", "cpu", "triton"])
def test_glu_pure_pairs_every_act_and_the_rebuilt_product(name, act):
    """The pairs the fused MLP binds: bwd(..., want_p=True) also returns act(a) * b."""
    _impl("glu", name)
    from fusebench.fuse.binding import pure_pair
    pair = pure_pair("glu", name)
    g = torch.Generator().manual_seed(3)
    a, b, dp = (2 * torch.randn(4, 5, 33, generator=g) for _ in range(3))
    ad, bd = a.double().requires_grad_(), b.double().requires_grad_()
    pr = glu_reference(ad, bd, act)
    dar, dbr = torch.autograd.grad(pr, (ad, bd), dp.double())
    da, db, p = pair.bwd(dp, a, b, act, True)
    for got, ref in ((pair.fwd(a, b, act), pr), (da, dar), (db, dbr), (p, pr)):
        torch.testing.assert_close(got.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    assert len(pair.bwd(dp, a, b, act)) == 2


@pytest.mark.parametrize("case", [(f, n) for f in FAMILIES for n in ("function", "cpu")],
                         ids=_ids)
def test_gradcheck_float64(case):
    family, name = case
    fn = _impl(family, name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 1, 6, generator=g, dtype=torch.float64)
    params = PROBLEMS[family].make_params(list(x.shape), g)
    inputs = tuple(t.double().requires_grad_() for t in (x, *params.values()))
    call = (lambda x, w: fn(x, w, 1e-6)) if family == "rms_norm" else fn
    assert torch.autograd.gradcheck(call, inputs)


def test_what_each_rms_norm_impl_saves():
    """function / cpu: x and a float per row; aten's F.rms_norm and the written-out form also
    keep x-sized intermediates."""
    x = torch.randn(8, 16, 256)
    w = torch.ones(256)
    rows = 8 * 16 * 4
    for name in ("function", "cpu"):
        total, not_x = _saved(_with_consts("rms_norm", name), x, w)
        assert (total, not_x) == (x.numel() * 4 + rows, rows), name
    for name in ("eager", "naive"):
        _, not_x = _saved(_with_consts("rms_norm", name), x, w)
        assert not_x >= x.numel() * 4, name


def test_what_each_glu_impl_saves():
    """function / cpu: a and b; `silu(a) * b` as written keeps silu(a) as well (b, the
    problem's second input, is left out of the count: a alone, or a and silu(a))."""
    a, b = torch.randn(8, 16, 64), torch.randn(8, 16, 64)
    size = a.numel() * 4
    for name in ("function", "cpu"):
        assert _saved(_impl("glu", name), a, b)[0] == size, name
    assert _saved(get_impl("glu", "eager").fn, a, b)[0] == 2 * size


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_cpu_op_passes_opcheck(dtype):
    _impl("rms_norm", "cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 24, generator=g).to(dtype).requires_grad_()
    w = torch.randn(24, generator=g).to(dtype).requires_grad_()
    torch.library.opcheck(torch.ops.fusebench.rms_norm_cpu_forward, (x, w, 1e-6))
    _, rstd = torch.ops.fusebench.rms_norm_cpu_forward(x.detach(), w.detach(), 1e-6)
    dy = torch.randn(x.shape, generator=g).to(dtype)
    torch.library.opcheck(torch.ops.fusebench.rms_norm_cpu_backward,
                          (dy, x.detach(), rstd, w.detach()))


@pytest.mark.parametrize("family,name,dtype", [("rms_norm", "cpu", torch.float16),
                                               ("rms_norm", "triton", torch.float64),
                                               ("glu", "cpu", torch.float16),
                                               ("glu", "triton", torch.float64)])
def test_unsupported_dtype_is_a_clear_error(family, name, dtype):
    fn = _impl(family, name)
    x = torch.randn(2, 8).to(dtype)
    with pytest.raises(TypeError, match="unsupported dtype"):
        fn(x, torch.ones(8, dtype=dtype), 1e-6) if family == "rms_norm" else fn(x, x)


def test_shape_mismatches_are_clear_errors():
    rms = _impl("rms_norm", "cpu")
    with pytest.raises(ValueError, match="weight has 7 elements, x's last dim is 8"):
        rms(torch.randn(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(RuntimeError, match="a and b shapes differ"):
        _impl("glu", "cpu")(torch.randn(2, 8), torch.randn(2, 9))
    with pytest.raises(ValueError, match="act 'tanh' not one of"):
        _impl("glu", "function")(torch.randn(2, 8), torch.randn(2, 8), "tanh")


def test_the_pure_glu_pair_is_what_autograd_computes():
    """glu_fwd / glu_bwd against torch.autograd on the same formula, float64."""
    g = torch.Generator().manual_seed(5)
    a, b, dp = (torch.randn(3, 17, generator=g, dtype=torch.float64) for _ in range(3))
    ar, br = a.clone().requires_grad_(), b.clone().requires_grad_()
    p = torch.nn.functional.silu(ar) * br
    da, db = torch.autograd.grad(p, (ar, br), dp)
    got = glu_bwd(dp, a, b, "silu", want_p=True)
    for x, y in zip(got, (da, db, p.detach())):
        torch.testing.assert_close(x, y, atol=0, rtol=0)
    torch.testing.assert_close(glu_fwd(a, b), p.detach(), atol=0, rtol=0)


def test_rms_norm_cpu_build_is_one_extension():
    assert rms_cpu.build() == (True, "")
    assert rms_cpu.EXT_NAME == "fusebench_rms_norm_cpu"


@pytest.mark.parametrize("gate_second", [False, True])
@pytest.mark.parametrize("name", ["function", "cpu", "triton"])
def test_glu_packed_pairs_read_both_halves_in_place(name, gate_second):
    """glu_packed: gate and up as the halves of one (..., 2H) tensor; backward's d_ab packed
    the same way (what the fused MLP's one projection GEMM takes)."""
    _impl("glu", name)
    from fusebench.fuse.binding import pure_pair
    pair = pure_pair("glu_packed", name)
    g = torch.Generator().manual_seed(4)
    ab, dp = 2 * torch.randn(3, 4, 2 * 21, generator=g), torch.randn(3, 4, 21, generator=g)
    abd = ab.double().requires_grad_()
    gate, up = abd.chunk(2, -1)
    if gate_second:
        gate, up = up, gate
    pr = glu_reference(gate, up, "gelu")
    (dref,) = torch.autograd.grad(pr, abd, dp.double())
    dab, p = pair.bwd(dp, ab, "gelu", gate_second, True)
    for got, ref in ((pair.fwd(ab, "gelu", gate_second), pr), (dab, dref), (p, pr)):
        torch.testing.assert_close(got.double(), ref.detach(), atol=1e-5, rtol=1e-5)
    assert len(pair.bwd(dp, ab, "gelu", gate_second)) == 1


# --- any shape: the C++ kernels against their torch twins (hypothesis) ---------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SHAPE = st.lists(st.integers(0, 5), min_size=1, max_size=3).flatmap(
    lambda lead: st.integers(1, 70).map(lambda c: (*lead, c)))


@settings(max_examples=25, deadline=None)
@given(shape=SHAPE, seed=st.integers(0, 2**16), transposed=st.booleans())
def test_rms_norm_cpu_equals_its_torch_twin_on_any_shape(shape, seed, transposed):
    """Empty leading dims, width 1, odd widths, and a non-contiguous x (a transposed view)."""
    cpu_fn = _impl("rms_norm", "cpu")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if transposed and x.dim() >= 2:
        x = x.transpose(0, -1).contiguous().transpose(0, -1)      # same values, other strides
    w = torch.randn(shape[-1], generator=g, dtype=torch.float64)
    dy = torch.randn(shape, generator=g, dtype=torch.float64)
    out = []
    for fn in (cpu_fn, get_impl("rms_norm", "function").fn):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xi, wi, 1e-6)
        y.backward(dy)
        out.append((y, xi.grad, wi.grad))
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@settings(max_examples=25, deadline=None)
@given(shape=SHAPE, seed=st.integers(0, 2**16), gate_second=st.booleans(),
       act=st.sampled_from(["silu", "relu", "gelu", "gelu_tanh"]))
def test_glu_packed_cpu_equals_its_torch_twin_on_any_shape(shape, seed, gate_second, act):
    from fusebench.fuse.binding import pure_pair
    _impl("glu", "cpu")
    cpu, torch_pair = pure_pair("glu_packed", "cpu"), pure_pair("glu_packed", "function")
    g = torch.Generator().manual_seed(seed)
    ab = torch.randn(*shape[:-1], 2 * shape[-1], generator=g, dtype=torch.float64)
    dp = torch.randn(shape, generator=g, dtype=torch.float64)
    torch.testing.assert_close(cpu.fwd(ab, act, gate_second),
                               torch_pair.fwd(ab, act, gate_second), atol=1e-12, rtol=1e-10)
    for a, b in zip(cpu.bwd(dp, ab, act, gate_second, True),
                    torch_pair.bwd(dp, ab, act, gate_second, True)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_a_packed_gate_needs_an_even_width():
    from fusebench.fuse.binding import pure_pair
    _impl("glu", "cpu")
    with pytest.raises(RuntimeError, match="even last dim"):
        pure_pair("glu_packed", "cpu").fwd(torch.randn(2, 7), "silu", False)
