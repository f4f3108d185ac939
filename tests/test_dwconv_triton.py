"""The Triton depthwise conv backward (kernels/dwconv/triton.py: dx kernel + per-program weight
partials) against float64 aten, under TRITON_INTERPRET=1 on CPU tensors, at tiny shapes:
K 3/5/7 x stride 1/2 x NCHW / channels-last, channel and position blocks with ragged tails."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch
import torch.nn.functional as F

from fusebench.kernels.dwconv import triton as dw_triton

pytestmark = pytest.mark.skipif(not dw_triton.available("cpu")[0],
                                reason=dw_triton.available("cpu")[1] or "triton unavailable")


def _grads(fn, x, w, b, stride, dy):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    fn(x, w, b, stride).backward(dy)
    return x.grad, w.grad, b.grad


# the interpreter is slow: two cases in the quick run, the rest of K x stride x layout slow
QUICK = {(3, 2, "channels_last"), (5, 1, "nchw")}
CASES = [pytest.param(k, s, lay, marks=() if (k, s, lay) in QUICK else pytest.mark.slow)
         for k in (3, 5, 7) for s in (1, 2) for lay in ("nchw", "channels_last")]


# C=37: two 32-channel blocks, the second ragged; 9x11: 99 positions = a ragged second block
@pytest.mark.parametrize("k, stride, layout", CASES)
def test_backward_matches_float64_reference(k, stride, layout):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 37, 9, 11, generator=g)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = 0.2 * torch.randn(37, 1, k, k, generator=g), torch.randn(37, generator=g)
    ref = lambda x, w, b, s: F.conv2d(x, w, b, s, k // 2, 1, 37)    # noqa: E731
    dy = torch.randn(ref(x, w, b, stride).shape, generator=g)
    got = _grads(dw_triton.dwconv_triton, x, w, b, stride, dy)
    exp = _grads(ref, x.double(), w.double(), b.double(), stride, dy.double())
    for a, r in zip(got, exp):
        assert a.dtype == torch.float32 and a.shape == r.shape
        err = ((a.double() - r).abs().max() / r.abs().max()).item()
        assert err < 1e-5, err
    assert got[0].is_contiguous(memory_format=torch.channels_last if layout == "channels_last"
                                else torch.contiguous_format)


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="dwconv triton"):
        dw_triton.dwconv_triton(torch.randn(1, 2, 4, 4), torch.randn(2, 1, 4, 4), None)
    with pytest.raises(ValueError, match="stride"):
        dw_triton.dwconv_triton(torch.randn(1, 2, 4, 4), torch.randn(2, 1, 3, 3), None, 3)
