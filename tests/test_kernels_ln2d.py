"""Every registered LN2d impl against the float64 reference, on the inputs that break them."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import pytest
import torch

from fusebench.kernels import get_impl, list_impls
from fusebench.kernels.ln2d import auto, cpu, function
from fusebench.kernels.ln2d.reference import ln2d_reference

IMPLS = list_impls("ln2d")
STABLE = [n for n in IMPLS if n != "sqm"]          # sqm's E[x^2]-E[x]^2 is the known-bad one
TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float64: 1e-10}


def _impl(name):
    k = get_impl("ln2d", name)
    ok, reason = k.available("cpu")
    if not ok:
        pytest.skip(f"{name}: {reason}")
    if name in ("cpu", "auto"):
        ok, reason = cpu.build()
        if not ok:
            pytest.skip(reason)
    return k.fn


def _rel(a, b):
    a, b = a.double(), b.double()
    # floor 1: outputs and gradients are O(1) here, and a gradient that is 0 in exact
    # arithmetic (dx when C == 1) must not divide rounding noise by rounding noise
    return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()


def run_and_compare(fn, x, eps=1e-6, dtype=torch.float32, w_scale=0.5):
    """fwd + bwd of fn vs the float64 reference; returns (err_y, err_dx, err_dw, err_db)."""
    g = torch.Generator().manual_seed(1)
    C = x.shape[1]
    w = (1 + w_scale * torch.randn(C, generator=g)).to(dtype).requires_grad_()
    b = (w_scale * torch.randn(C, generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(x.shape, generator=g).to(dtype)
    xg = x.detach().requires_grad_()
    y = fn(xg, w, b, eps)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.backward(dy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = ln2d_reference(xr, wr, br, eps)
    yr.backward(dy.double())
    return (_rel(y, yr), _rel(xg.grad, xr.grad), _rel(w.grad, wr.grad), _rel(b.grad, br.grad))


def assert_close(errs, tol):
    names = ("y", "dx", "dweight", "dbias")
    bad = {n: e for n, e in zip(names, errs) if not e <= tol}
    assert not bad, f"errors over {tol}: {bad}"


# the last two span several of the cpu kernel's position blocks with a ragged tail (C=40 fp32:
# 512 positions per block, H*W=667; C=600: 80 per block, H*W=117)
SHAPES = [(1, 1, 5, 3), (2, 3, 7, 5), (1, 7, 13, 11), (2, 129, 3, 5), (1, 96, 9, 9),
          (2, 40, 23, 29), (1, 600, 9, 13)]


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
def test_matches_reference(name, shape, layout):
    fn = _impl(name)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided":                   # neither NCHW- nor channels-last-contiguous
        x = torch.randn(shape[0], shape[1], shape[2], 2 * shape[3])[..., ::2]
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    # C == 1: x - mean == 0, rstd = eps^-1/2 amplifies float32 rounding in the baselines' dx
    eps = 1e-3 if shape[1] == 1 else 1e-6
    assert_close(run_and_compare(fn, x, eps=eps), 1e-4)


@pytest.mark.parametrize("shape", [(2, 7, 5, 3), (2, 40, 23, 29), (1, 600, 9, 13)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dy_layout", ["channels_last", "nchw"])
def test_cpu_channels_last_out(shape, dy_layout):
    """The fuser's call: NCHW x -> channels-last y; backward takes either dy layout."""
    _impl("cpu")
    seen = {}

    def fn(x, w, b, eps):
        y = cpu.ln2d_cpu(x, w, b, eps, channels_last_out=True)
        seen["y_cl"] = y.is_contiguous(memory_format=torch.channels_last)
        y.register_hook(lambda g: g.contiguous(memory_format=torch.channels_last)
                        if dy_layout == "channels_last" else g.contiguous())
        return y

    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare(fn, x), 1e-4)
    assert seen["y_cl"] or shape[1] == 1


# channels-last x: the per-row path (bwd_rows) at ConvNeXt's widths, and the tiled backward
# below its cut (C <= 4); through the custom op and the Function the fuser binds
@pytest.mark.parametrize("shape", [(2, 4, 5, 7), (2, 8, 5, 7), (2, 80, 5, 7), (1, 160, 3, 5),
                                   (3, 320, 2, 3)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("entry", ["op", "function"])
def test_cpu_channels_last_rows(shape, entry):
    _impl("cpu")
    fn = cpu.ln2d_cpu if entry == "op" else cpu.ln2d_cpu_function
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = x.contiguous(memory_format=torch.channels_last)
    assert_close(run_and_compare(fn, x), 1e-4)
    assert_close(run_and_compare(fn, 1e4 + x), 1e-3)          # the shift keeps a large mean


def test_cpu_huge_page_hint_changes_no_result():
    """The huge-page hint only changes how output memory is faulted in, never a value."""
    _impl("cpu")
    x = torch.randn(8, 96, 110, 110, generator=torch.Generator().manual_seed(0))  # 37 MB: hinted
    w, b = torch.randn(96), torch.randn(96)
    ext = cpu.extension()
    try:
        ext.set_huge_pages(False)
        plain = ext.forward(x, w, b, 1e-6)[0]
        ext.set_huge_pages(True)
        hinted = ext.forward(x, w, b, 1e-6)[0]
    finally:
        ext.set_huge_pages(True)
    assert torch.equal(plain, hinted)


@pytest.mark.parametrize("name", STABLE)
def test_large_mean(name):
    """x = 1e4 + noise: E[x^2] is 1e8, where float32 has no bits left for a variance of 1."""
    fn = _impl(name)
    x = 1e4 + torch.randn(2, 32, 5, 7, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare(fn, x), 1e-3)


def test_twopass_is_convnext_official_layernorm():
    """twopass is ConvNeXt's channels_first LayerNorm (u = mean, s = mean((x - u)^2)), so it
    keeps its precision where sqm's one-pass variance does not."""
    x = 1e4 + torch.randn(2, 16, 5, 5)
    w, b = torch.ones(16), torch.zeros(16)
    err = _rel(get_impl("ln2d", "twopass").fn(x, w, b, 1e-6), ln2d_reference(x, w, b, 1e-6))
    assert err < 1e-2, err


def test_sqm_loses_precision_at_large_mean():
    x = 1e4 + torch.randn(2, 32, 5, 7, generator=torch.Generator().manual_seed(0))
    err_y = run_and_compare(get_impl("ln2d", "sqm").fn, x)[0]
    assert not err_y <= 1e-2          # large, or NaN from a negative "variance"


@pytest.mark.parametrize("name", STABLE)
def test_zero_variance_positions(name):
    fn = _impl(name)
    x = torch.randn(2, 8, 6, 5, generator=torch.Generator().manual_seed(0))
    x[:, :, 1:3, :] = 0.25                        # constant over C: x - mean == 0 exactly
    errs = run_and_compare(fn, x)
    assert_close(errs, 1e-4)


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_eps(name, eps):
    fn = _impl(name)
    x = 0.05 * torch.randn(2, 16, 5, 5, generator=torch.Generator().manual_seed(0))
    assert_close(run_and_compare(fn, x, eps=eps), 1e-4)   # var ~ 2.5e-3: eps 1e-2 dominates


@pytest.mark.parametrize("name", IMPLS)
@pytest.mark.parametrize("channels_last", [False, True])
def test_bfloat16(name, channels_last):
    fn = _impl(name)
    x = torch.randn(2, 24, 7, 5, generator=torch.Generator().manual_seed(0)).bfloat16()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    assert_close(run_and_compare(fn, x, dtype=torch.bfloat16), 3e-2)


@pytest.mark.parametrize("name,dtype", [("cpu", torch.float16), ("triton", torch.float64)])
def test_unsupported_dtype_is_a_clear_error(name, dtype):
    fn = _impl(name)
    x = torch.randn(1, 4, 3, 3).to(dtype)
    w, b = torch.ones(4, dtype=dtype), torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match="unsupported dtype"):
        fn(x, w, b, 1e-6)


@pytest.mark.parametrize("name", ["function", "cpu"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradcheck_float64(name, channels_last):
    fn = _impl(name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(5, generator=g, dtype=torch.float64)
    b = torch.randn(5, generator=g, dtype=torch.float64)
    inputs = tuple(t.requires_grad_() for t in (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: fn(x, w, b, 1e-5), inputs)


def test_function_saves_only_x_mean_rstd():
    x = torch.randn(2, 16, 8, 8, requires_grad=True)
    w, b = torch.ones(16, requires_grad=True), torch.zeros(16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        function.ln2d_function(x, w, b, 1e-6)
    shapes = sorted(tuple(t.shape) for t in saved)
    assert shapes == [(2, 1, 8, 8), (2, 1, 8, 8), (2, 16, 8, 8), (16,)]   # mean, rstd, x, weight


def test_auto_runs_the_device_kernel():
    _impl("auto")
    assert auto.resolve("cpu") == ("cpu", "")
    assert auto.candidate("cuda") == "triton"


def test_auto_fallback_warns_and_runs_function(monkeypatch):
    monkeypatch.setattr(auto, "resolve", lambda device, build=True: (None, "cpu: no compiler"))
    x = torch.randn(1, 4, 3, 3)
    w, b = torch.ones(4), torch.zeros(4)
    with pytest.warns(auto.FallbackWarning, match="ran 'function'"):
        y = auto.ln2d_auto(x, w, b, 1e-6)
    torch.testing.assert_close(y, function.ln2d_function(x, w, b, 1e-6))


def test_cpu_unavailable_on_cuda_device():
    ok, reason = get_impl("ln2d", "cpu").available("cuda")
    assert not ok and "CPU" in reason


def test_cpp_kernel_loads_once_per_process(monkeypatch):
    """Every forward/backward asks for the module; only the first ask goes to the loader."""
    from fusebench.kernels import build
    calls = []
    kernel = build.CppKernel("fusebench_ln2d_cpu", cpu.SOURCE, "the ln2d cpu kernel runs")
    real = build.load_extension
    monkeypatch.setattr(build, "load_extension",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    first = kernel.extension()
    assert kernel.extension() is first and kernel.extension() is first
    assert len(calls) == 1
    x = torch.randn(2, 8, 5, 5)
    y, mean, rstd = first.forward(x, torch.ones(8), torch.zeros(8), 1e-6, False)
    torch.testing.assert_close(y, function.ln2d_function(x, torch.ones(8), torch.zeros(8), 1e-6))


# --- the cpu kernel as torch custom ops: traceable by aot/compile, callable from TorchScript ---

def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("layout, clo", [("nchw", False), ("nchw", True), ("channels_last", False),
                                         ("strided", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_cpu_custom_ops_pass_opcheck(layout, clo, dtype):
    """torch.library.opcheck: schema, fake (meta) outputs' shapes/strides/dtypes vs the real
    kernel's, autograd registration, and aot_autograd tracing, for forward and backward."""
    _impl("cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 5, 7, generator=g).to(dtype)
    x = {"nchw": x, "channels_last": _cl(x), "strided": x[:, ::2]}[layout]
    C = x.shape[1]
    w = torch.randn(C, generator=g).to(dtype).requires_grad_()
    b = torch.randn(C, generator=g).to(dtype).requires_grad_()
    xg = x.detach().requires_grad_()
    torch.library.opcheck(torch.ops.fusebench.ln2d_cpu_forward, (xg, w, b, 1e-6, clo))
    y, mean, rstd = torch.ops.fusebench.ln2d_cpu_forward(x, w.detach(), b.detach(), 1e-6, clo)
    dy = torch.randn(y.shape, generator=g).to(dtype)
    torch.library.opcheck(torch.ops.fusebench.ln2d_cpu_backward, (dy, x, mean, rstd, w.detach()))


def test_cpu_kernel_inside_compiled_graph_without_breaks():
    """fullgraph=True fails on any graph break: the op must be traced, and must be in the graph."""
    fn = _impl("cpu")
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(lambda x, w, b: fn(x, w, b, 1e-6), backend=backend, fullgraph=True)
    x = torch.randn(2, 8, 5, 7)
    assert_close(run_and_compare(lambda x, w, b, eps: compiled(x, w, b), x), TOL[torch.float32])
    assert any("fusebench.ln2d_cpu_forward" in g for g in seen), seen


def test_cpu_kernel_runs_inside_torchscript():
    fn = _impl("cpu")

    class M(torch.nn.Module):
        def forward(self, x, w, b):
            return fn(x, w, b, 1e-6)

    scripted = torch.jit.script(M())
    assert "fusebench::ln2d_cpu_forward" in str(scripted.inlined_graph)
    x = torch.randn(2, 8, 5, 7)
    assert_close(run_and_compare(lambda x, w, b, eps: scripted(x, w, b), x), TOL[torch.float32])


@pytest.mark.parametrize("layout, clo", [("nchw", False), ("nchw", True), ("channels_last", False)])
def test_cpu_function_matches_reference(layout, clo):
    """The autograd.Function the fuser binds (no custom-op dispatch): same kernel, same maths."""
    _impl("cpu")
    x = torch.randn(2, 96, 7, 9, generator=torch.Generator().manual_seed(3))
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    fn = lambda x, w, b, eps: cpu.ln2d_cpu_function(x, w, b, eps, clo)  # noqa: E731
    assert_close(run_and_compare(fn, x), 1e-4)
    w = torch.ones(96, dtype=torch.float64)
    y = cpu.ln2d_cpu_function(x.double().requires_grad_(), w, torch.zeros_like(w), 1e-6, clo)
    assert y.grad_fn.name() == "LN2dCpuFunctionBackward"
    assert y.is_contiguous(memory_format=torch.channels_last) == (clo or layout == "channels_last")
