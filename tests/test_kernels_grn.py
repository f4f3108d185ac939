"""The grn family (GRN after bias + act, ConvNeXt V2's MLP middle): every registered impl
against the float64 reference in float32 and bfloat16, every act, the native pure pairs equal
to their torch twin on any shape (hypothesis), a zero-norm channel, results that do not depend
on the thread count, what each impl saves, and one clear error for what it does not take."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fusebench.fuse.binding import pure_pair
from fusebench.kernels import get_impl, list_impls
from fusebench.kernels.grn.function import ACTS, grn_reference
from tests.test_kernels_act import _impl, _saved, assert_close, run_and_compare

IMPLS = list_impls("grn")
NATIVE = [n for n in IMPLS if n in ("cpu", "triton")]
# (N, H, W, C): fewer rows per image than the C++ kernel's 16 parts, odd widths (a vector
# loop's tail), one image, and ConvNeXt V2's first stage in small
SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (1, 4, 3, 129), (3, 8, 8, 40)]


def _ids(v):
    return "-".join(map(str, v)) if isinstance(v, tuple) else str(v)


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_matches_float64_reference(name, shape):
    fn = _impl("grn", name)
    h = 2 * torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare("grn", fn, h), 2e-5)


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("act", ACTS)
def test_every_act_with_and_without_a_bias(name, act):
    fn = _impl("grn", name)
    g = torch.Generator().manual_seed(3)
    h = (2 * torch.randn(2, 5, 4, 24, generator=g)).requires_grad_()
    gamma, beta = (torch.randn(24, generator=g).requires_grad_() for _ in range(2))
    for b in (torch.randn(24, generator=g).requires_grad_(), None):
        ins = [t for t in (h, b, gamma, beta) if t is not None]
        y = fn(h, b, gamma, beta, 1e-6, act)
        dy = torch.randn(y.shape, generator=g)
        got = torch.autograd.grad(y, ins, dy)
        ref_ins = [t.detach().double().requires_grad_() for t in ins]
        rh, *rest = ref_ins
        rb = rest.pop(0) if b is not None else None
        yr = grn_reference(rh, rb, *rest, 1e-6, act)
        refs = torch.autograd.grad(yr, ref_ins, dy.double())
        for a, r in zip((y, *got), (yr, *refs)):
            torch.testing.assert_close(a.double(), r, atol=3e-5, rtol=1e-4)


@pytest.mark.parametrize("name", [n for n in IMPLS if n != "triton"])
def test_bfloat16(name):
    fn = _impl("grn", name)
    h = torch.randn(2, 6, 3, 40, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare("grn", fn, h, dtype=torch.bfloat16), 3e-2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 3), hh=st.integers(1, 9), ww=st.integers(1, 9), c=st.integers(1, 70),
       act=st.sampled_from(ACTS), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_native_pairs_equal_their_torch_twin_on_any_shape(n, hh, ww, c, act, bias, seed):
    """The pairs the grn_mlp site binds: forward (u, G, m) and backward (dh, db, dgamma,
    dbeta, u) as the torch pair gives them, float64, any shape."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hh, ww, c, generator=g, dtype=torch.float64)
    b = torch.randn(c, generator=g, dtype=torch.float64) if bias else None
    gamma, beta = (torch.randn(c, generator=g, dtype=torch.float64) for _ in range(2))
    du = torch.randn(h.shape, generator=g, dtype=torch.float64)
    twin = pure_pair("grn", "function")
    want = twin.fwd(h, b, gamma, beta, 1e-6, act)
    want_b = twin.bwd(du, h, b, gamma, beta, *want[1:], act, True)
    # each native pair that runs here (Triton: an interpreter that computes these kernels
    # right), so that one that cannot does not skip the other's check
    here = [n for n in NATIVE if get_impl("grn", n).available("cpu")[0]]
    if not here:
        pytest.skip("no native grn impl runs here")
    for name in here:
        _impl("grn", name)
        pair = pure_pair("grn", name)
        tol = {"atol": 1e-5, "rtol": 1e-4} if name == "triton" else {"atol": 1e-12, "rtol": 1e-10}
        got = pair.fwd(h, b, gamma, beta, 1e-6, act)
        got_b = pair.bwd(du, h, b, gamma, beta, *want[1:], act, True)
        for a, r in zip((*got, *got_b), (*want, *want_b)):
            if r is None:
                assert a is None
            else:
                torch.testing.assert_close(a.double(), r, **tol)
        assert len(pair.bwd(du, h, b, gamma, beta, *want[1:], act)) == 4   # no u unless asked


@pytest.mark.parametrize("name", IMPLS)
def test_a_channel_whose_norm_is_zero_has_finite_gradients(name):
    """act(h + b) = 0 over a whole image's channel (ReLU of negatives): G = 0 there; the
    gradients stay finite and equal the reference's (torch.norm's backward gives 0 there)."""
    fn = _impl("grn", name)
    g = torch.Generator().manual_seed(4)
    h = torch.randn(2, 4, 4, 8, generator=g)
    h[..., :3] = -1.0 - h[..., :3].abs()
    ins = [h, *(torch.randn(8, generator=g) for _ in range(3))]
    ins = [t.requires_grad_() for t in ins]
    y = fn(*ins, 1e-6, "relu")
    dy = torch.randn(y.shape, generator=g)
    got = torch.autograd.grad(y, ins, dy)
    ref = [t.detach().double().requires_grad_() for t in ins]
    refs = torch.autograd.grad(grn_reference(*ref, 1e-6, "relu"), ref, dy.double())
    for a, r in zip(got, refs):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), r, atol=3e-5, rtol=1e-4)


def test_cpu_results_do_not_depend_on_the_thread_count():
    """The sums go through 16 fixed parts per image: bit for bit the same on 1 and 2 threads."""
    _impl("grn", "cpu")
    pair = pure_pair("grn", "cpu")
    g = torch.Generator().manual_seed(5)
    h, du = (torch.randn(3, 20, 20, 40, generator=g) for _ in range(2))
    b, gamma, beta = (torch.randn(40, generator=g) for _ in range(3))
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            u, big, m = pair.fwd(h, b, gamma, beta, 1e-6, "gelu")
            outs.append((u, big, m, *pair.bwd(du, h, b, gamma, beta, big, m, "gelu", True)))
    finally:
        torch.set_num_threads(before)
    for a, r in zip(*outs):
        assert torch.equal(a, r)


@pytest.mark.parametrize("name", [n for n in IMPLS if n != "eager"])
def test_what_each_impl_saves(name):
    """h and the (N, C) norms (and the C-sized parameters): eager keeps h + b, g, g * n and
    more, several h-sized tensors."""
    fn = _impl("grn", name)
    g = torch.Generator().manual_seed(6)
    h = torch.randn(4, 8, 8, 32, generator=g)
    params = [torch.randn(32, generator=g) for _ in range(3)]
    size = h.numel() * 4
    total, other = _saved(fn, h, *params)
    assert total == size + other and other <= 4 * 32 * 4 + 4 * 4, (total, other)
    assert _saved(get_impl("grn", "eager").fn, h, *params)[0] >= 3 * size


def test_native_backward_is_once_differentiable():
    """A double backward through native code fails rather than giving zeros."""
    fn = _impl("grn", "cpu")
    h = torch.randn(1, 2, 2, 4, requires_grad=True)
    params = [torch.randn(4, requires_grad=True) for _ in range(3)]
    (dh,) = torch.autograd.grad(fn(h, *params).square().sum(), h, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice .* @once_differentiable"):
        dh.sum().backward()


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("args, match", [
    ((torch.randn(2, 3, 4), torch.randn(4), torch.randn(4), torch.randn(4)),
     "must be \\(N, H, W, C\\)"),
    ((torch.randn(1, 2, 2, 4), torch.randn(4), torch.randn(5), torch.randn(4)), "C = 4 values"),
    ((torch.randn(1, 2, 2, 4), torch.randn(4), torch.randn(4), torch.randn(4), 1e-6, "tanh"),
     "act 'tanh' not one of"),
], ids=["3-D", "gamma", "act"])
def test_what_an_impl_does_not_take_is_one_clear_error(name, args, match):
    fn = _impl("grn", name)
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_cpu_says_which_dtypes_it_takes():
    fn = _impl("grn", "cpu")
    with pytest.raises(TypeError, match="grn cpu: unsupported dtype torch.float16"):
        fn(*(t.half() for t in (torch.randn(1, 2, 2, 4), *(torch.randn(4) for _ in range(3)))))
