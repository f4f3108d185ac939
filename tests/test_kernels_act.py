"""Every registered silu / se_gate / bias_gelu impl against the float64 reference; what each
saves for backward; the modules the fuser swaps in; `fusebench kernel silu` end to end."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the triton kernels are first imported

import copy
import json

import pytest
import torch
import torch.nn as nn

from fusebench.kernels import PROBLEMS, get_impl, list_impls
from fusebench.kernels.act import cpu
from fusebench.kernels.bias_gelu import BiasGELU, bias_gelu
from fusebench.kernels.se_gate import SEGate, se_gate
from fusebench.kernels.silu import SiLUMemEff, silu_me
from fusebench.measure.memory import SavedTensorBytes

FAMILIES = ("silu", "se_gate", "bias_gelu")
CASES = [(f, n) for f in FAMILIES for n in list_impls(f)]
SHAPES = [(1, 1, 5, 3), (2, 3, 7, 5), (1, 7, 13, 11), (2, 129, 3, 5)]


def _ids(case):
    return "-".join(map(str, case)) if isinstance(case, tuple) else str(case)


def _impl(family, name):
    k = get_impl(family, name)
    ok, reason = k.available("cpu")
    if not ok:
        pytest.skip(f"{family} {name}: {reason}")
    if name == "cpu":
        ok, reason = cpu.build()        # one build per session (disk-cached across sessions)
        if not ok:
            pytest.skip(reason)
    return k.fn


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1.0)).item()


def _layout(x, layout):
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":                      # neither NCHW- nor channels-last-contiguous
        N, C, H, W = x.shape
        big = torch.zeros(N, C, H, 2 * W, dtype=x.dtype)
        big[..., ::2] = x
        x = big[..., ::2]
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    return x


def run_and_compare(family, fn, x, dtype=torch.float32, **kw):
    """fwd + every grad of fn vs the float64 reference: {name: rel err}."""
    problem = PROBLEMS[family]
    g = torch.Generator().manual_seed(1)
    params = {k: v.to(dtype) for k, v in (problem.make_params(list(x.shape), g)
                                          if problem.make_params else {}).items()}
    dy = torch.randn(x.shape, generator=g).to(dtype)
    xg = x.detach().to(dtype).requires_grad_()
    ps = [params[n].requires_grad_() for n in problem.params]
    y = fn(xg, *ps, **kw)
    assert y.shape == x.shape and y.dtype == dtype
    grads = torch.autograd.grad(y, [xg, *ps], dy)
    xr = x.detach().double().requires_grad_()
    pr = [p.detach().double().requires_grad_() for p in ps]
    yr = problem.reference(xr, *pr, **kw)
    refs = torch.autograd.grad(yr, [xr, *pr], dy.double())
    errs = {"y": _rel(y, yr)}
    errs.update({n: _rel(a, b) for n, a, b in zip(problem.grad_names(), grads, refs)})
    return errs


def assert_close(errs, tol):
    bad = {n: e for n, e in errs.items() if not e <= tol}
    assert not bad, f"errors over {tol}: {bad}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "strided"])
def test_matches_reference(case, shape, layout):
    fn = _impl(*case)
    x = _layout(torch.randn(shape, generator=torch.Generator().manual_seed(0)), layout)
    assert_close(run_and_compare(case[0], fn, x), 1e-5)


@pytest.mark.parametrize("name", list_impls("bias_gelu"))
def test_bias_gelu_tanh(name):
    fn = _impl("bias_gelu", name)
    x = 3 * torch.randn(2, 7, 5, 3, generator=torch.Generator().manual_seed(0))
    errs = run_and_compare("bias_gelu", fn, x, approximate="tanh")
    assert_close(errs, 1e-5)


@pytest.mark.parametrize("name", [n for n in list_impls("bias_gelu") if n in ("cpu", "triton")])
def test_bias_gelu_tanh_derivative_does_not_cancel_in_the_tails(name):
    """Our kernels' own tanh-GELU math (cpu_math.h's Act<kGeluTanh>, kernels/_triton_math.py,
    shared by bn_act, gn_act and glu): 1 + tanh(u) and 1 - tanh(u)^2 taken from tanh itself
    subtract numbers near 1 in float32 (off by 1e-6 at |x| > 3, aten's too, 2e-6 in the Triton
    kernel's old 2 sigmoid - 1 spelling); from exp(-2|u|) they do not (1.4e-7 measured)."""
    fn = _impl("bias_gelu", name)
    x = torch.cat([torch.linspace(-12, -3, 9001), torch.linspace(3, 12, 9001)])
    x = x.reshape(1, 1, 1, -1).requires_grad_()
    (dx,) = torch.autograd.grad(fn(x, torch.zeros(1), approximate="tanh").sum(), x)
    xd = x.detach().double()
    k = (2 / torch.pi) ** 0.5
    th = torch.tanh(k * (xd + 0.044715 * xd ** 3))
    ref = 0.5 * (1 + th) + 0.5 * xd * (1 - th * th) * k * (1 + 3 * 0.044715 * xd * xd)
    aten = torch.ops.aten.gelu_backward(torch.ones_like(x), x.detach(), approximate="tanh")
    ours, theirs = ((t.double() - ref).abs().max().item() for t in (dx, aten))
    assert ours <= 0.5 * theirs, (ours, theirs)


@pytest.mark.parametrize("name", [n for n in list_impls("silu") if n in ("cpu", "triton")])
def test_silu_derivative_does_not_cancel_in_the_tail(name):
    """s (1 + x (1 - s)) with 1 - s as a difference is off by 9.8e-7 from float64 at x > 3
    (aten's too); ours takes 1 - s as sigmoid(-x) from the same exp (2.0e-7 measured)."""
    fn = _impl("silu", name)
    x = torch.linspace(3, 30, 27001).reshape(1, 1, 1, -1).requires_grad_()
    (dx,) = torch.autograd.grad(fn(x).sum(), x)
    s = torch.sigmoid(x.detach().double())
    ref = s * (1 + x.detach().double() * (1 - s))
    aten = torch.ops.aten.silu_backward(torch.ones_like(x), x.detach())
    ours, theirs = ((t.double() - ref).abs().max().item() for t in (dx, aten))
    assert ours <= 0.5 * theirs, (ours, theirs)


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("channels_last", [False, True])
def test_bfloat16(case, channels_last):
    fn = _impl(*case)
    x = _layout(torch.randn(2, 24, 7, 5, generator=torch.Generator().manual_seed(0)),
                "channels_last" if channels_last else "nchw")
    assert_close(run_and_compare(case[0], fn, x, dtype=torch.bfloat16), 3e-2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name,dtype", [("cpu", torch.float16), ("triton", torch.float64)])
def test_unsupported_dtype_is_a_clear_error(family, name, dtype):
    fn = _impl(family, name)
    x = torch.randn(1, 4, 3, 3).to(dtype)
    args = {"silu": (), "se_gate": (torch.zeros(1, 4, 1, 1, dtype=dtype),),
            "bias_gelu": (torch.zeros(4, dtype=dtype),)}[family]
    with pytest.raises(TypeError, match="unsupported dtype"):
        fn(x, *args)


GRADCHECK = [(f, n) for f in FAMILIES for n in ("function", "cpu")]


@pytest.mark.parametrize("case", GRADCHECK, ids=_ids)
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradcheck_float64(case, channels_last):
    family, name = case
    fn = _impl(family, name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 3, 4, generator=g, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    params = PROBLEMS[family].make_params([2, 5, 3, 4], g) if family != "silu" else {}
    inputs = (x, *(p.double() for p in params.values()))
    inputs = tuple(t.requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(fn, inputs)
    if family == "bias_gelu":
        assert torch.autograd.gradcheck(lambda x, b: fn(x, b, approximate="tanh"), inputs)


# ------------------------------------------------------------------------- saved tensors
def _saved(fn, x, *params):
    """(bytes saved, bytes saved that are not x's own storage); params are excluded."""
    x = x.detach().requires_grad_()
    ps = [p.detach().requires_grad_() for p in params]
    out = []
    for exclude in (ps, [x, *ps]):         # saved-tensor hooks do not nest: one pass each
        counter = SavedTensorBytes(exclude=exclude)
        with counter.track():
            y = fn(x, *ps)
        del y
        out.append(counter.bytes)
    return tuple(out)


SMALL = 8 * 32 * 4             # (N, C) gate logits of the shape below, float32
SAVE_SHAPE = (8, 32, 14, 14)


@pytest.mark.parametrize("name", [n for n in list_impls("silu") if n != "naive"])
def test_silu_saves_only_the_input(name):
    fn = _impl("silu", name)
    x = torch.randn(SAVE_SHAPE)
    assert _saved(fn, x) == (x.nbytes, 0)
    naive, naive_extra = _saved(get_impl("silu", "naive").fn, x)
    assert naive == 2 * x.nbytes and naive_extra == x.nbytes      # x and sigmoid(x)


@pytest.mark.parametrize("name", list_impls("se_gate"))
def test_se_gate_saves_x_and_the_small_logits(name):
    fn = _impl("se_gate", name)
    x, g = torch.randn(SAVE_SHAPE), torch.randn(8, 32, 1, 1, requires_grad=True)
    total, extra = _saved(lambda x: fn(x, g), x)                  # g as an activation here
    assert x.nbytes <= total <= x.nbytes + SMALL and extra <= SMALL


@pytest.mark.parametrize("name", [n for n in list_impls("bias_gelu") if n != "eager"])
def test_bias_gelu_saves_only_x(name):
    fn = _impl("bias_gelu", name)
    x, b = torch.randn(SAVE_SHAPE), torch.randn(32)
    assert _saved(fn, x, b) == (x.nbytes, 0)
    eager_extra = _saved(get_impl("bias_gelu", "eager").fn, x, b)[1]
    assert eager_extra == x.nbytes                                # the x + bias temporary


# ------------------------------------------------------------------------- modules
def test_silu_module_is_a_drop_in():
    m = SiLUMemEff(inplace=True)
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(m(x), nn.SiLU()(x))
    assert torch.equal(silu_me(x), m(x)) and "impl=function" in repr(m)


def test_se_gate_module_in_squeeze_excite():
    from fusebench.models.layers import SqueezeExcite
    torch.manual_seed(0)
    se = SqueezeExcite(16, 4)
    x = torch.randn(2, 16, 5, 7, requires_grad=True)
    y_ref = se(x)
    gx_ref, *gp_ref = torch.autograd.grad(y_ref.square().sum(), [x, *se.parameters()])
    gate = SEGate()
    s = se.conv_expand(se.act(se.conv_reduce(x.mean((2, 3), keepdim=True))))
    y = gate(x, s)
    gx, *gp = torch.autograd.grad(y.square().sum(), [x, *se.parameters()])
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(gx, gx_ref)
    for a, b in zip(gp, gp_ref):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(se_gate(x, s), y)


def test_bias_gelu_module_shares_the_conv_bias():
    from fusebench.models.layers import ConvMlp
    torch.manual_seed(0)
    mlp = ConvMlp(8, 16)
    x = torch.randn(2, 8, 5, 3)
    y_ref = mlp(x)
    bias = mlp.fc1.bias
    bg = BiasGELU(mlp.fc1.bias, approximate=mlp.act.approximate)
    mlp.fc1.bias = None
    mlp.act = bg
    assert bg.bias is bias and any(p is bias for p in mlp.parameters())
    y = mlp(x)
    torch.testing.assert_close(y, y_ref)
    y.sum().backward()
    assert bias.grad is not None and bias.grad.shape == (16,)
    torch.testing.assert_close(bias_gelu(mlp.fc1(x), bias), mlp.act(mlp.fc1(x)))
    with pytest.raises(TypeError, match="nn.Parameter"):
        BiasGELU(torch.zeros(16))


# ------------------------------------------------------------------------- fusebench kernel
@pytest.mark.parametrize("family", FAMILIES)
def test_plan_default_shape(family):
    from fusebench.run.kernel_plan import KernelRequest, plan_kernel
    specs = plan_kernel(KernelRequest(family, impls="eager,function"))
    assert [s.kernel.shape for s in specs] == [(8, 96, 56, 56)] * 2


@pytest.mark.parametrize("family", ["se_gate", "bias_gelu"])
def test_run_cell_records(family):
    from fusebench.cell.kernel_cell import run_cell
    from fusebench.run.kernel_plan import KernelRequest, plan_kernel
    specs = plan_kernel(KernelRequest(family, impls="eager,function", shapes=("2,5,6,7",),
                                      warmup=1, steps=2))
    for spec in specs:
        r = run_cell(spec, lambda p: None)
        assert r.status == "ok", r.error
        assert r.correctness.max_rel_err_grad is not None and r.extra["gbps"] > 0


def test_cli_silu_all_json(capsys):
    """Real worker processes, every silu impl (triton interpreted: TRITON_INTERPRET=1)."""
    from fusebench.cli import main
    code = main(["kernel", "silu", "--impl", "all", "--shape", "2,8,5,7", "--steps", "2",
                 "--warmup", "1", "--device", "cpu", "--no-save", "--json"])
    doc = json.loads(capsys.readouterr().out)
    by_impl = {r["spec"]["kernel"]["impl"]: r for r in doc["records"]}
    assert set(by_impl) == set(list_impls("silu"))
    assert all(r["status"] in ("ok", "unavailable") for r in doc["records"]), doc["records"]
    assert by_impl["function"]["status"] == "ok" and by_impl["eager"]["status"] == "ok"
    assert by_impl["naive"]["activation_bytes"] == 2 * by_impl["function"]["activation_bytes"]
    assert code == (0 if all(r["status"] == "ok" for r in doc["records"]) else 1)


# --- the cpu kernels as torch custom ops: traceable by aot_autograd and torch.compile ---

_OPS = {"silu": ("silu_cpu_forward", "silu_cpu_backward"),
        "se_gate": ("se_gate_cpu_forward", "se_gate_cpu_backward"),
        "bias_gelu": ("bias_gelu_cpu_forward", "bias_gelu_cpu_backward")}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_custom_ops_pass_opcheck(family, layout, dtype):
    """torch.library.opcheck: schema, fake outputs (shape/strides/dtype) vs the kernel's,
    autograd registration and aot_autograd tracing, forward and backward."""
    _impl(family, "cpu")
    g = torch.Generator().manual_seed(0)
    x = _layout(torch.randn(2, 6, 5, 7, generator=g), layout).to(dtype)
    extra = {"silu": [], "se_gate": [torch.randn(2, 6, 1, 1, generator=g).to(dtype)],
             "bias_gelu": [torch.randn(6, generator=g).to(dtype), True]}[family]
    fwd, bwd = (getattr(torch.ops.fusebench, n) for n in _OPS[family])
    grad_args = [x.requires_grad_(), *[a.requires_grad_() if torch.is_tensor(a) else a
                                       for a in extra]]
    torch.library.opcheck(fwd, tuple(grad_args))
    dy = torch.randn(x.shape, generator=g).to(dtype)
    torch.library.opcheck(bwd, (dy, x.detach(), *[a.detach() if torch.is_tensor(a) else a
                                                   for a in extra]))


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernel_inside_compiled_graph_without_breaks(family):
    """fullgraph=True fails on any graph break; the op must be in the traced graph."""
    fn = _impl(family, "cpu")
    torch._dynamo.reset()
    seen = []

    def backend(gm, example_inputs):
        seen.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    errs = run_and_compare(family, compiled, torch.randn(2, 6, 5, 7))
    assert_close(errs, 1e-4)
    assert any(f"fusebench.{_OPS[family][0]}" in s for s in seen), seen


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_kernel_runs_inside_torchscript(family):
    fn = _impl(family, "cpu")
    scripted = torch.jit.script(fn)
    assert f"fusebench::{_OPS[family][0]}" in str(scripted.graph)
    assert_close(run_and_compare(family, scripted, torch.randn(2, 6, 5, 7)), 1e-4)


class _TokenMlp(nn.Module):
    """A transformer MLP over the last dim (a GPT's c_fc -> GELU -> c_proj, layer-scaled)."""

    def __init__(self, c=12):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.7))

    def forward(self, x):
        return self.gamma * self.fc2(nn.functional.gelu(self.fc1(x)))


@pytest.mark.parametrize("impl", ["cpu", "triton"])
def test_linear_mlp_bias_gelu_each_impl_matches_eager(impl):
    """The mlp pattern hands a Linear's (..., C) activation to bias_gelu as a (1, C, 1, M)
    channels-last view: both kernels read it (and write dx back through it) correctly."""
    from fusebench.fuse import fuse
    _impl("bias_gelu", impl)
    torch.manual_seed(0)
    model = _TokenMlp()
    ref = copy.deepcopy(model)
    res = fuse(model, "train", impls={"bias_gelu": impl})
    assert res.sites == {"mlp": 1} and ("info", f"bias_gelu: kernel = '{impl}'") in res.notes
    x = torch.randn(2, 5, 12)
    y, yr = model(x), ref(x)
    torch.testing.assert_close(y, yr, atol=1e-5, rtol=1e-5)
    y.square().sum().backward(), yr.square().sum().backward()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=n)


@pytest.mark.parametrize("impl", ["function", "cpu", "triton"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_bias_gelu_bwd_y_is_bwd_plus_the_forward(impl, approximate, layout):
    """bwd_y (the MLP backward's one call: dx, dbias and the recomputed y) gives what bwd and
    fwd give separately, against float64 too, on both layouts."""
    from fusebench.fuse.binding import pure_pair
    _impl("bias_gelu", impl)
    pair = pure_pair("bias_gelu", impl)
    torch.manual_seed(1)
    x = _layout(torch.randn(2, 19, 5, 7) * 3, layout)
    dy, b = torch.randn_like(x), torch.randn(19)
    dx, db, y = pair.bwd_y(dy, x, b, approximate)
    dx1, db1 = pair.bwd(dy, x, b, approximate)
    torch.testing.assert_close(y, pair.fwd(x, b, approximate), rtol=2e-7, atol=2e-7)
    torch.testing.assert_close((dx, db), (dx1, db1), rtol=0, atol=0)
    assert y.stride() == x.stride()                         # x's layout, as fwd's y
    ref = torch.nn.functional.gelu(x.double() + b.double()[:, None, None], approximate=approximate)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("impl", ["function", "cpu", "triton"])
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_se_gate_hard_gate_matches_aten(impl, layout, dtype):
    """The hardsigmoid gate (binding.hard_gate, MobileNetV3's SE) on each impl's pure pair:
    y, dx and dg against autograd of x * F.hardsigmoid(g), with logits on both clamps and
    between. float64 to 1e-12: the same numbers as aten's, whose backward multiplies by a
    float 1/6 (kernels/act/gate.py); float32 as float32 rounds. Triton: float32 only."""
    from fusebench.fuse.binding import hard_gate, pure_pair
    from fusebench.kernels.act.gate import ATEN_SIXTH
    if impl == "triton" and dtype == torch.float64:
        pytest.skip("the Triton kernels compute in float32")
    _impl("se_gate", impl)
    gate = hard_gate(pure_pair("se_gate", impl), ATEN_SIXTH)
    torch.manual_seed(2)
    x = _layout(torch.randn(2, 19, 5, 7, dtype=dtype), layout)
    g = 4 * torch.randn(2, 19, 1, 1, dtype=dtype)
    assert (g < -3).any() and (g > 3).any() and (g.abs() < 3).any()
    dy = torch.randn_like(x)
    xr, gr = x.detach().clone().requires_grad_(), g.clone().requires_grad_()
    yr = xr * nn.functional.hardsigmoid(gr)
    yr.backward(dy)
    y = gate.fwd(x, g)
    dx, dg = gate.bwd(dy, x, g)
    tol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close((y, dx, dg), (yr, xr.grad, gr.grad), rtol=tol, atol=tol)
