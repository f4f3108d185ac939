"""Tracing beyond what torch.fx takes by itself (fuse/fx/trace.py, fx/leaves.py): iterating a
chunk into a constant count, a user's shape helper registered as a leaf, an `assert` on traced
values checked at run time. Each against eager, and each failure mode as eager's."""
from __future__ import annotations

import copy
import functools
import sys
from pathlib import Path

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse
from fusebench.fuse.fx import leaves
from tests.helpers import assert_close_to_float64

sys.path.insert(0, str(Path(__file__).parent))
from assets import shape_asserts  # noqa: E402


class Chunky(nn.Module):
    """`for t in x.chunk(3, -1)`: three parts of 2 for 6 wide, two of 2 for 4 wide."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(2, 16), nn.Linear(16, 2)

    def forward(self, x):
        return torch.cat([self.fc2(F.gelu(self.fc1(t))) for t in x.chunk(3, dim=-1)], -1)


def _fused_like_eager(make, x, sites: int, site_calls):
    """make() fused with `sites` mlp sites, one call on x equal to an unfused copy's, each site
    run once; (the fused model, the copy)."""
    model = make()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["mlp"] == sites
    torch.testing.assert_close(model(x), ref(x))
    assert site_calls["fused_mlp"] == sites
    return model, ref


def test_iterating_a_chunk_is_checked_at_run_time(site_calls):
    model, _ = _fused_like_eager(Chunky, torch.randn(2, 6), 3, site_calls)
    with pytest.raises(RuntimeError, match="traced for 3 chunks; this input gives 2"):
        model(torch.randn(2, 4))


def split_heads(t, h):
    """A user's own shape helper: Python on t.shape, which a Proxy stops."""
    b, n, width = t.shape
    if width % h:
        raise ValueError("the heads do not divide the width")
    return t.reshape(b, n, h, width // h).transpose(1, 2)


class Uses(nn.Module):
    def forward(self, x):
        return split_heads(x, 2) * 2


def test_a_registered_function_is_one_node():
    from fusebench.fuse.fx.trace import _Tracer
    with pytest.raises(Exception, match="symbolically traced variables cannot be used"):
        _Tracer(set()).trace(Uses())
    leaves.register_leaf(split_heads)
    try:
        gm = fx.GraphModule(Uses(), _Tracer(set()).trace(Uses()))
    finally:
        leaves._FUNCTIONS.remove(split_heads)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"][0] is split_heads
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(gm(x), Uses()(x))


def test_register_leaf_takes_a_function_or_a_module_class():
    from fusebench.errors import UsageError
    with pytest.raises(UsageError, match="neither a function nor an nn.Module class"):
        leaves.register_leaf(3)


def test_an_assert_on_traced_values_is_checked_in_the_graph(site_calls):
    """Swin's `assert L == H * W` stopped the trace (a Proxy has no truth value): the model
    fused nothing."""
    model = shape_asserts.Asserts().double()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert dict(res.sites) == {"mlp": 1}
    assert not [m for k, m in res.notes if k == "fx_fallback"], res.notes
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x), ref(x))
    assert site_calls == {"fused_mlp": 1}
    with pytest.raises(AssertionError, match="input feature has wrong size"):
        ref(torch.randn(2, 5, 8, dtype=torch.float64))
    with pytest.raises(AssertionError, match=r"assertion failed at shape_asserts.py:\d+"):
        model(torch.randn(2, 5, 8, dtype=torch.float64))


class Branches(nn.Module):
    def forward(self, x):
        if x.shape[-1] == 8:
            return x * 2
        return x


def test_an_if_on_a_traced_value_still_fails_the_trace():
    from fusebench.fuse.fx.trace import _Tracer
    with pytest.raises(Exception, match="symbolically traced variables cannot be used"):
        _Tracer(set()).trace(Branches())


class Starred(nn.Module):
    """`*shape` four ways: in a tuple (HF's hidden_shape), in a list, into a Tensor method's
    sizes (`reshape(*lead, -1)`) and into a method given nothing else (`x.new_zeros(*x.shape)`)."""

    def __init__(self, heads=2):
        super().__init__()
        self.heads = heads
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        lead = x.shape[:-1]
        split = x.view((*lead, self.heads, -1))          # a tuple display
        listed = split.reshape([*lead, -1])               # a list display
        y = self.fc2(F.gelu(self.fc1(listed.reshape(*lead, -1))))
        return y + x.new_zeros(*x.shape)


def test_a_star_unpacked_shape_is_spliced_at_run_time(site_calls):
    model = Starred()
    ref = copy.deepcopy(model)
    assert fuse(model, "train").sites["mlp"] == 1
    for shape in ((3, 8), (2, 5, 8), (2, 2, 3, 8)):      # leading dims the trace never saw
        x = torch.randn(*shape)
        torch.testing.assert_close(model(x), ref(x))
    assert site_calls["fused_mlp"] == 3


class LoopsOverShape(nn.Module):
    def forward(self, x):
        n = 1
        for d in x.shape[1:]:                            # a loop, not an unpacking
            n = n * d
        return x.reshape(x.shape[0], n)


def test_a_loop_over_a_traced_value_still_fails_the_trace():
    from fusebench.fuse.fx.trace import _Tracer
    with pytest.raises(fx.proxy.TraceError, match="cannot be iterated"):
        _Tracer(set()).trace(LoopsOverShape())


class PassesKwargs(nn.Module):
    """HF's forwards: **kwargs passed on to a helper that may read them."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, **kwargs):
        return _scaled(self.fc2(F.gelu(self.fc1(x))), **kwargs)


def _scaled(y, scale=1.0):
    return y * scale


def test_kwargs_passed_on_trace_empty_and_a_call_with_some_runs_the_own_forward(site_calls):
    x = torch.randn(3, 8)
    model, ref = _fused_like_eager(PassesKwargs, x, 1, site_calls)
    torch.testing.assert_close(model(x, scale=3.0), ref(x, scale=3.0))   # not dropped
    assert site_calls["fused_mlp"] == 1                                  # its own forward ran


class StarIntoOtherCall(nn.Module):
    def forward(self, x):
        return x.sum(*x.shape[2:])                       # sizes as dims: no sequence form


def test_a_star_into_a_call_without_a_sequence_form_fails_the_trace_with_a_reason():
    from fusebench.fuse.fx.trace import _Tracer
    with pytest.raises(fx.proxy.TraceError, match="unpacked into the arguments of sum"):
        _Tracer(set()).trace(StarIntoOtherCall())


class MakesTensorsOfItsSize(nn.Module):
    """`torch.ones(T, T)` / `torch.zeros(B, T, C, device=...)` with traced sizes: torch's
    argument parser refused the Proxies before fx saw the call."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        b, t, c = x.shape
        weights = torch.ones(t, t, dtype=x.dtype).tril() / torch.arange(1, t + 1)[:, None]
        bias = torch.zeros(b, t, c, dtype=x.dtype, device=x.device) + 0.5
        return self.fc2(F.gelu(self.fc1(weights @ x))) + bias


def test_sizes_given_one_by_one_to_a_factory_trace(site_calls):
    model = MakesTensorsOfItsSize()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert result.sites["mlp"] == 1
    assert not [t for k, t in result.notes if k == "fx_fallback"], result.notes
    for t in (3, 5):
        x = torch.randn(2, t, 8)
        torch.testing.assert_close(model(x), ref(x))
    assert site_calls["fused_mlp"] == 2
    assert torch.ones(2, 3).shape == (2, 3)          # torch's own factories are back


class LimitOfATracedDtype(nn.Module):
    """`torch.finfo(z.dtype).min` of a traced z (BERT-style extended masks written with the
    hidden states' dtype): a traced dtype was no dtype, and the trace failed."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, z):
        return self.fc2(F.gelu(self.fc1(x))), z.masked_fill(z > 0, torch.finfo(z.dtype).min)


def test_a_traced_dtypes_limit_is_read_at_run_time(site_calls):
    model = LimitOfATracedDtype()
    ref = copy.deepcopy(model)
    result = fuse(model, "train")
    assert result.sites["mlp"] == 1
    assert not [t for k, t in result.notes if k == "fx_fallback"], result.notes
    x = torch.randn(2, 8)
    for dtype in (torch.float16, torch.float64):     # the graph reads z's dtype at each call
        z = torch.randn(2, 8).to(dtype)
        (y, m), (ry, rm) = model(x, z), ref(x, z)
        torch.testing.assert_close(y, ry)
        torch.testing.assert_close(m, rm, atol=0, rtol=0)
        assert m.min() == torch.finfo(dtype).min
    assert site_calls["fused_mlp"] == 2
    assert torch.finfo is type(torch.finfo(torch.float32))    # torch's own is back


class T5Norm(nn.Module):
    """T5's LayerNorm, in our words: an RMSNorm that casts to its weight's dtype when that is
    a half type, decided by an `if` on the Parameter's dtype (HF's T5, LongT5, Pix2Struct)."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))

    def forward(self, h):
        var = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + 1e-6)
        if self.weight.dtype in [torch.float16, torch.bfloat16]:
            h = h.to(self.weight.dtype)
        return self.weight * h


class T5Block(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.norm = T5Norm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def test_an_if_on_a_parameters_dtype_is_decided_at_trace_and_guarded(site_calls):
    model = T5Block()
    ref = copy.deepcopy(model).double()
    result = fuse(model, "train")
    assert result.sites["rms_norm"] == 1 and result.sites["mlp"] == 1
    assert not [t for k, t in result.notes if k == "fx_fallback"], result.notes
    x = torch.randn(2, 5, 16)
    assert_close_to_float64(model, ref, (x,), 1e-5, 1e-5, 1e-5, (x.double(),))
    assert site_calls["fused_rms_norm"] == 1
    model.double()                  # the dtype the branch was decided on has changed
    with pytest.warns(UserWarning, match=r"norm\.weight is torch.float64 .*own forward"):
        torch.testing.assert_close(model(x.double()), ref(x.double()))
    assert site_calls["fused_rms_norm"] == 1           # not run: the module's own forward was


class BranchesOnWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x):
        if self.weight.sum() > 0:       # the weights' values: data, not decided at trace
            return x * self.weight
        return x


def test_an_if_on_a_parameters_values_or_an_inputs_dtype_still_fails_the_trace():
    from fusebench.fuse.fx.trace import _Tracer

    class BranchesOnInputDtype(nn.Module):
        def forward(self, x):
            return x.half() if x.dtype == torch.float32 else x
    for m in (BranchesOnWeights(), BranchesOnInputDtype()):
        with pytest.raises(Exception, match="symbolically traced variables cannot be used"):
            _Tracer(set()).trace(m)


# ----- decorated forwards, HF-style hub kernels, isinstance on traced values -----------------

def keyword_defaults(**defaults):
    """A decorator in the shape of HF's (`can_return_tuple`, `deprecate_kwarg`): it takes
    `(self, *args, **kwargs)`, fills keyword defaults from its own table and passes them on."""
    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            for k, v in defaults.items():
                kwargs.setdefault(k, v)
            return fn(self, *args, **kwargs)
        return wrapper
    return wrap


class _Rotate(nn.Module):
    """A per-model kernel object kept in a dict, not a submodule (HF's hub-kernel layers)."""

    def forward(self, x):
        a, b = x.chunk(2, -1)
        return torch.cat((-b, a), -1)


_ROTATE = {}


def rotate(x):
    return _ROTATE.setdefault("rotate", _Rotate())(x)


class DecoratedBlock(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(d))
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    @keyword_defaults(scale=1.0)
    def forward(self, x, mask=None, scale=2.0, **kwargs):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        out = x + scale * self.fc2(F.gelu(self.fc1(rotate(h))))
        return out if mask is None else out * mask


@pytest.mark.parametrize("root", [True, False], ids=["the_root", "a_child"])
def test_a_decorated_forward_and_a_kernel_object_outside_the_module_trace(site_calls, root):
    # fx runs a child's decorator as called; the root's forward it enters by its signature
    model = DecoratedBlock() if root else nn.Sequential(DecoratedBlock(), DecoratedBlock())
    n = 1 if root else 2
    ref = copy.deepcopy(model).double()
    result = fuse(model, "train")
    assert result.sites["rms_norm"] == n and result.sites["mlp"] == n
    assert not [t for k, t in result.notes if k == "fx_fallback"], result.notes
    x = torch.randn(2, 5, 16)
    assert_close_to_float64(model, ref, (x,), 1e-5, 1e-5, 1e-5, (x.double(),))
    assert site_calls["fused_rms_norm"] == n
    block, block64 = (model, ref) if root else (model[0], ref[0])
    m = torch.rand(2, 5, 16)        # the graph traced for a mask given
    torch.testing.assert_close(block(x, m), block64(x.double(), m.double()).float())
    # the decorator's default of scale (1.0, not the signature's 2.0), as in eager
    torch.testing.assert_close(block(x), block64(x.double()).float())
    torch.testing.assert_close(block(x, scale=3.0), block64(x.double(), scale=3.0).float())
    # the root's calls ran its graph under the decorator; a child's own calls (not through
    # its parent's graph) run its class's forward
    assert site_calls["fused_rms_norm"] == (n + 3 if root else n)


class Cache:
    """A library's object passed along the tensors (HF's Cache classes)."""

    def __init__(self):
        self.seen = []

    def update(self, t):
        self.seen.append(t)
        return t


class AsksTheType(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cache=None):
        if isinstance(cache, Cache):     # fx would answer False for any traced cache
            x = cache.update(x * 2)
        return self.fc2(F.gelu(self.fc1(x)))


def test_isinstance_of_a_traced_value_against_a_class_stops_the_trace_with_a_reason():
    from fusebench.fuse.fx.trace import _Tracer
    with pytest.raises(Exception, match=r"isinstance of a traced value \(cache\) against Cache"):
        _Tracer(set()).trace(AsksTheType())
    model = AsksTheType()
    ref = copy.deepcopy(model)
    fuse(model, "train")
    x, cache = torch.randn(2, 16), Cache()
    with pytest.warns(UserWarning, match="called with other"):
        torch.testing.assert_close(model(x, cache), ref(x, Cache()))
    assert len(cache.seen) == 1                      # the call ran the branch eager runs
    torch.testing.assert_close(model(x), ref(x))


class ParameterType(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        if isinstance(self.fc2.weight, torch.Tensor):   # T5's check: its class is no data
            x = x * 2
        if isinstance(x, (list, tuple)) or isinstance(x, dict | None):   # builtin classes:
            x = torch.cat(x, -1)                                          # fx's False stands
        return self.fc2(F.gelu(self.fc1(x)))


def test_isinstance_of_a_parameter_is_answered_and_builtin_classes_keep_fxs_answer(site_calls):
    _fused_like_eager(ParameterType, torch.randn(2, 8), 1, site_calls)
    import builtins
    assert builtins.isinstance.__module__ == "builtins"    # Python's own is back


class FixedHeight(nn.Module):
    """timm's patch-embedding check: a message formatted from traced values."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = x.shape[1]
        torch._assert(h == 4, f"Input height ({h}) doesn't match model (4).")
        return self.fc2(F.gelu(self.fc1(x)))


def test_an_assert_message_formatted_from_traced_values_is_formatted_at_run_time(site_calls):
    model = FixedHeight()
    assert fuse(model, "train").sites["mlp"] == 1
    model(torch.randn(2, 4, 8))
    assert site_calls["fused_mlp"] == 1
    with pytest.raises(AssertionError, match=r"^Input height \(6\) doesn't match model \(4\)\.$"):
        model(torch.randn(2, 6, 8))
