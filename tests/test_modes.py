"""Every registered mode on a tiny conv model: same outputs and parameter gradients as eager,
honest availability, and the events each mode promises (fusion groups, graph breaks, ...)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from fusebench.errors import UsageError
from fusebench.measure.events import EventLog
from fusebench.modes import get_mode, list_modes
from fusebench.modes.options import check_option_values
from fusebench.modes.torchscript import executor_fusion_groups, llvm_enabled
from tests.helpers import TINY

# fast choices for the registry-wide test: aot_eager traces like inductor but compiles no C++
FAST = {"compile_backend": "aot_eager", "bench": "train"}
ATOL, RTOL = 1e-5, 1e-4


def tiny() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.GELU(),
                         nn.Conv2d(4, 4, 3, padding=1))


def x_in(n: int = 2, hw: int = 8) -> torch.Tensor:
    return torch.randn(n, 3, hw, hw, generator=torch.Generator().manual_seed(1))


def kinds(events: EventLog) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events.events():
        out.setdefault(e.category, []).append(e.message)
    return out


def prepared(name: str, opts: dict, model: nn.Module, x: torch.Tensor):
    mode = get_mode(name)
    ok, reason = mode.available(opts, "cpu")
    assert isinstance(ok, bool) and isinstance(reason, str)
    if not ok:
        assert reason, f"{name} unavailable without a reason"
        pytest.skip(f"{name}: {reason}")
    events = EventLog()
    fn = mode.prepare(model, (x,), opts, events)
    return mode, fn, events


@pytest.mark.parametrize("name", list_modes())
def test_train_steps_match_eager(name):
    model, x = tiny(), x_in()
    ref = copy.deepcopy(model)
    mode, fn, events = prepared(name, FAST, model, x)
    # three steps: JIT fusers specialise after profiling runs, wrong grads showed up only later
    for step in range(3):
        model.zero_grad()
        ref.zero_grad()
        out, expected = fn(x), ref(x)
        torch.testing.assert_close(out, expected, atol=ATOL, rtol=RTOL, msg=f"{name} step {step}")
        out.square().mean().backward()
        expected.square().mean().backward()
        for (pname, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad is not None, f"{name}: no gradient reached {pname}"
            torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=RTOL,
                                       msg=f"{name} grad {pname} step {step}")
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)
    mode.finish(events)


@pytest.mark.parametrize("name", list_modes())
def test_inference_matches_eager(name):
    model, x = tiny().eval(), x_in()
    ref = copy.deepcopy(model)
    mode, fn, events = prepared(name, {**FAST, "bench": "infer"}, model, x)
    with torch.inference_mode():
        for _ in range(3):
            torch.testing.assert_close(fn(x), ref(x), atol=ATOL, rtol=RTOL)
    mode.finish(events)


def test_ops_torch_refreshes_or_drops_stay_alive_for_torchscript():
    """torch.jit maps objects to builtin ops by id(): an op freed by a packet refresh or a
    Library teardown leaves a dangling id that a new object can take (jit_ids)."""
    import gc

    from fusebench.modes import jit_ids
    assert jit_ids.install()
    ns = "fusebench_jit_ids_test"
    lib = torch.library.Library(ns, "DEF")
    try:
        lib.define("foo(Tensor x) -> Tensor")
        first = id(getattr(torch.ops, ns).foo._op)      # registered with torch.jit by id
        lib.define("foo.two(Tensor x, int n) -> Tensor")   # refresh: a new op object
        second = id(getattr(torch.ops, ns).foo._op)
        assert first != second
    finally:
        lib._destroy()                                      # drops the packet and its op
    table = torch.jit._builtins._get_builtin_table()
    live = {id(o): o for o in gc.get_objects()}
    for i in (first, second):
        assert table.get(i) == f"{ns}::foo"
        assert i in live and getattr(live[i], "__module__", "") == f"torch._ops.{ns}", \
            "the op torch.jit still maps by id was freed"


@pytest.mark.parametrize("name", list_modes())
def test_available_returns_bool_and_reason(name):
    ok, reason = get_mode(name).available({}, "cpu")
    assert isinstance(ok, bool) and isinstance(reason, str)
    assert ok or reason


# --- option values -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode_name, opts, needle", [
    ("torchscript", {"ts_fuser": "foo"}, "nnc"),
    ("torchscript", {"ts_method": "scrip"}, "did you mean script"),
    ("aot", {"aot_compiler": "inductor"}, "nop"),
    ("aot", {"aot_partitioner": "mincut"}, "min_cut"),
    ("compile", {"compile_backend": "indcutor"}, "did you mean inductor"),
    ("compile", {"compile_mode": "fast"}, "max-autotune"),
    ("compile", {"compile_fullgraph": "yes"}, "True"),
])
def test_bad_option_values_rejected(mode_name, opts, needle):
    with pytest.raises(UsageError, match="valid") as err:
        check_option_values(get_mode(mode_name), opts)
    assert needle in str(err.value)


def test_good_option_values_pass():
    opts = {"ts_method": "trace", "ts_fuser": "none", "aot_compiler": "ts",
            "aot_partitioner": "min_cut", "compile_backend": "aot_eager", "compile_mode": None,
            "compile_fullgraph": True, "compile_dynamic": None, "bench": "infer"}
    for name in ("torchscript", "aot", "compile"):
        check_option_values(get_mode(name), opts)  # other modes' options are ignored


# --- torchscript ---------------------------------------------------------------------------------

def test_nvfuser_unavailable_with_reason():
    ok, reason = get_mode("torchscript").available({"ts_fuser": "nvfuser"}, "cpu")
    assert not ok and "nvfuser" in reason


@pytest.mark.skipif(llvm_enabled(), reason="this torch build has LLVM")
def test_nnc_on_cpu_without_llvm_unavailable():
    ok, reason = get_mode("torchscript").available({"ts_fuser": "nnc"}, "cpu")
    assert not ok and "LLVM" in reason


def _flags():
    return (torch._C._jit_can_fuse_on_cpu(), torch._C._jit_can_fuse_on_gpu(),
            torch._C._jit_texpr_fuser_enabled())


def _script_warns() -> bool:
    """Whether this torch warns when torch.jit.script is called (a fresh function: the
    warnings registry would hide a repeat)."""
    import warnings

    def probe(x):
        return x + 1
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.jit.script(probe)
    return any("torch.jit.script" in str(w.message) for w in seen)


def test_torchscript_no_fusion_event_and_deprecation_warning_recorded():
    model, x = tiny(), x_in()
    mode, events = get_mode("torchscript"), EventLog()
    before = _flags()
    with events.capture_warnings():
        fn = mode.prepare(model, (x,), {"ts_fuser": "none"}, events)
    for _ in range(3):
        fn(x).sum().backward()
    mode.finish(events)
    k = kinds(events)
    assert "fusion" not in k
    assert k["no_fusion"] == ["0 fusion groups: fusers disabled (ts_fuser=none)"]
    if _script_warns():                 # a DeprecationWarning since torch 2.5-ish, none in 2.4
        assert any("torch.jit.script" in m for m in k["warning"]), k  # not suppressed
    else:
        assert not any("torch.jit.script" in m for m in k.get("warning", [])), k
    assert _flags() == before  # fuser flags put back


def test_torchscript_trace_matches_eager_and_reports_default_fuser():
    model, x = tiny(), x_in()
    ref = copy.deepcopy(model)
    mode, events = get_mode("torchscript"), EventLog()
    fn = mode.prepare(model, (x,), {"ts_method": "trace"}, events)
    for _ in range(3):
        torch.testing.assert_close(fn(x), ref(x), atol=ATOL, rtol=RTOL)
    mode.finish(events)
    k = kinds(events)
    assert ("fusion" in k) != ("no_fusion" in k)
    if "no_fusion" in k and not llvm_enabled():
        assert "without LLVM" in k["no_fusion"][0]


def test_torchscript_counts_real_fusion_groups():
    """NNC's IR interpreter (no LLVM needed, too slow to benchmark) forms real TensorExprGroups:
    proves the counter finds them in forward and backward plans."""
    class Pointwise(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            y = self.conv(x)
            return torch.sigmoid(y) * y + 1.0

    mode, events = get_mode("torchscript"), EventLog()
    before, llvm_only = _flags(), torch._C._jit_get_te_must_use_llvm_cpu()
    torch._C._jit_set_te_must_use_llvm_cpu(False)
    try:
        model, x = Pointwise(), x_in()
        fn = mode.prepare(model, (x,), {"ts_fuser": "nnc"}, events)  # bypasses available()
        for _ in range(3):
            fn(x).sum().backward()
        fw, bw = executor_fusion_groups(fn)
        mode.finish(events)
    finally:
        torch._C._jit_set_te_must_use_llvm_cpu(llvm_only)
    assert fw["prim::TensorExprGroup"] >= 1 and bw["prim::TensorExprGroup"] >= 1
    k = kinds(events)
    assert k["fusion"][0].startswith(f"{sum(fw.values()) + sum(bw.values())} fusion groups formed")
    assert _flags() == before


# --- aot -----------------------------------------------------------------------------------------

def test_aot_ts_compiler_min_cut_trains_parameters_and_reports():
    model, x = tiny(), x_in()
    ref = copy.deepcopy(model)
    mode, fn, events = prepared("aot", {"aot_compiler": "ts", "aot_partitioner": "min_cut"},
                                model, x)
    fn(x).square().mean().backward()
    ref(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=ATOL, rtol=RTOL)
    with torch.inference_mode():  # a graph compiled with grad must not be reused here
        torch.testing.assert_close(fn(x), ref(x), atol=ATOL, rtol=RTOL)
    mode.finish(events)
    k = kinds(events)
    assert "compiler=ts" in k["info"][0] and "min_cut" in k["info"][0]
    assert k["graphs"] == ["2 forward, 1 backward graphs compiled"]


# --- compile -------------------------------------------------------------------------------------

class ItemBranch(nn.Module):
    """A data-dependent Python branch: dynamo must break the graph at .item()."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        if y.sum().item() > 0:
            y = y + 1
        return torch.relu(y)


def test_compile_graph_break_and_recompile_events():
    mode, events = get_mode("compile"), EventLog()
    model = ItemBranch()
    fn = mode.prepare(model, (x_in(),), {"compile_backend": "eager"}, events)
    fn(x_in()).sum().backward()
    fn(x_in(n=3, hw=9)).sum().backward()  # a new shape: guards fail, dynamo recompiles
    mode.finish(events)
    k = kinds(events)
    assert any("Tensor.item" in m for m in k["graph_break"]), k     # 2.4 omits the "()"
    assert all("\n" not in m for m in k["graph_break"])
    import torch._dynamo.utils as du
    import dataclasses
    if "recompile_reason" in {f.name for f in dataclasses.fields(du.CompilationMetrics)}:
        assert any("size mismatch" in m for m in k["recompile"]), k
    else:                                  # torch 2.4: the frame and that no reason was given
        assert any("'forward' (test_modes.py:" in m and "give no reason" in m
                   for m in k["recompile"]), k
    assert int(k["graphs"][0].split()[0]) >= 2


def test_compile_error_is_error_unless_fallback_requested():
    import torch._dynamo

    class Relu(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(2, 4)
    bad = {"compile_backend": "relu_compile_error_TESTING_ONLY"}
    mode = get_mode("compile")
    fn = mode.prepare(Relu(), (x,), bad, EventLog())
    with pytest.raises(Exception, match="ReluCompileError"):
        fn(x)
    mode.finish(EventLog())

    events = EventLog()
    fn = mode.prepare(Relu(), (x,), {**bad, "compile_fallback": True}, events)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)  # ran in eager
    mode.finish(events)
    assert any("BackendCompilerFailed" in m for m in kinds(events)["compile_fallback"])
    assert torch._dynamo.config.suppress_errors is False  # restored


def test_compile_events_are_the_plans_when_dynamos_metrics_list_is_full():
    # dynamo keeps its last 64 compilation metrics: once full, the count before prepare no
    # longer says which are new, and a compile error that fell back went unreported
    import torch._dynamo
    import torch._dynamo.utils as du
    for i in range(70):
        torch._dynamo.reset()
        torch.compile(lambda x, i=i: x * i, backend="eager")(torch.randn(2))
    assert len(du.get_compilation_metrics()) == 64
    test_compile_error_is_error_unless_fallback_requested()



@pytest.mark.parametrize("logged, event", [
    (" torch.ops.aten.convolution_backward.default", "aten.convolution_backward"),
    ("aten._adaptive_avg_pool2d_backward.default", "aten._adaptive_avg_pool2d_backward"),
    ("torch.ops.aten.max.dim", "aten.max.dim"),
    # torch 2.4 logs the hint before FallbackKernel's name is set
    ("None", "an aten op inductor did not name (torch 2.4 logs None)"),
])
def test_fallback_kernel_events_name_the_op_or_say_it_was_not_named(logged, event):
    from fusebench.modes.compile import kernel_name
    assert kernel_name(logged) == event

@pytest.mark.slow
def test_compile_inductor_train_reports_convolution_backward_fallback():
    import torch._inductor.config as ic
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    ref, x = copy.deepcopy(model), x_in()
    mode = get_mode("compile")
    ok, reason = mode.available({}, "cpu")
    if not ok:
        pytest.skip(reason)
    events = EventLog()
    with ic.patch(fx_graph_cache=False):  # the fallback hint is not logged on a cache hit
        fn = mode.prepare(model, (x,), {"bench": "train"}, events)
        out = fn(x)
        out.sum().backward()
    ref_out = ref(x)
    ref_out.sum().backward()
    torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(model[0].weight.grad, ref[0].weight.grad, atol=ATOL, rtol=RTOL)
    mode.finish(events)
    assert "aten.convolution_backward" in kinds(events).get("fallback_kernel", []), events.events()


# --- declared options: reachable from the CLI and checked -------------------------------------

DECLARED = [(m, o) for m in list_modes() for o in get_mode(m).options]


def _bad_value(option):
    return "yes" if option.type is bool else "no-such-choice"


def test_every_mode_declares_options_as_frozen_records():
    from dataclasses import FrozenInstanceError
    assert {o.name for _, o in DECLARED} >= {"compile_fullgraph", "compile_dynamic", "ts_fuser"}
    with pytest.raises(FrozenInstanceError):
        DECLARED[0][1].name = "x"


@pytest.mark.parametrize("mode_name, option", DECLARED, ids=lambda x: getattr(x, "name", x))
def test_declared_option_is_on_run_help_and_checked(mode_name, option):
    from typer.testing import CliRunner

    from fusebench.cli import app
    from fusebench.run.plan import RunRequest, plan_run
    text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "250"}).output
    line = next((ln for ln in text.splitlines() if f" {option.flag} " in ln), None)
    assert line is not None, f"{option.flag} missing from run --help"
    assert option.help.split(":")[-1].strip()[:20] in line
    if isinstance(option.choices, tuple):
        assert "|".join(option.choices) in text.replace("\n", "").replace(" ", "").replace("│", "")
    with pytest.raises(UsageError, match=option.name):
        check_option_values(get_mode(mode_name), {option.name: _bad_value(option)})
    # the plan refuses it even when the mode that reads it was not picked
    with pytest.raises(UsageError, match=option.name):
        plan_run(RunRequest(models=TINY, modes="eager",
                            mode_options={option.name: _bad_value(option)}))


def test_dist_support_is_declared_by_the_modes():
    from fusebench.run.distributed import supports
    assert supports("torchscript", "ddp")[0] is False
    assert supports("aot", "ddp") == (True, "")
    assert "fsdp2" in supports("aot", "fsdp2")[1]
    assert supports("eager", "fsdp1") == (True, "")
