"""The CUDA-graph modes on a machine without CUDA: `cudagraphs` and compile's reduce-overhead
are `unavailable` with their reason, in the mode API and in a run's records (never run as
something else). Their GPU behaviour is exercised by scripts/gpu_check.sh."""
from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.modes import get_mode
from tests.helpers import TINY

FAST = ["-b", "2", "--steps", "2", "--warmup", "1", "--threads", "1"]
CPU_UNAVAILABLE = [
    ("cudagraphs", {}, "CUDA graphs need a CUDA device"),
    ("cudagraphs", {"cudagraphs_step": "fused"}, "CUDA graphs need a CUDA device"),
    ("compile", {"compile_mode": "reduce-overhead", "compile_backend": "aot_eager"},
     "reduce-overhead is CUDA graphs"),
]


@pytest.mark.parametrize("name, opts, needle", CPU_UNAVAILABLE)
def test_cuda_graph_modes_unavailable_on_cpu(name, opts, needle):
    ok, reason = get_mode(name).available(opts, "cpu")
    assert not ok and needle in reason


@pytest.mark.parametrize("mode_opts", [{"compile_mode": "max-autotune"}, {"compile_mode": None}])
def test_other_compile_modes_stay_available_on_cpu(mode_opts):
    ok, reason = get_mode("compile").available({**mode_opts, "compile_backend": "aot_eager"},
                                               "cpu")
    assert ok, reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only records")
@pytest.mark.parametrize("args, needle", [
    (["-m", "cudagraphs"], "CUDA graphs need a CUDA device"),
    (["-m", "compile", "--compile-mode", "reduce-overhead", "--compile-backend", "aot_eager"],
     "reduce-overhead is CUDA graphs"),
])
def test_run_records_cuda_graph_modes_as_unavailable(args, needle, tmp_path):
    res = CliRunner().invoke(app, ["run", TINY, *args, *FAST, "--json", "--no-save",
                                   "--out", str(tmp_path)])
    assert res.exit_code == 1, res.output        # a cell not ok, not a usage error or a crash
    (rec,) = json.loads(res.stdout)["records"]
    assert rec["status"] == "unavailable" and needle in rec["error"]["message"]
    assert rec["step_ms"] is None                 # nothing ran in its place


# --- cudagraphs' capture logic, with the CUDA calls replaced by eager stand-ins ----------------
def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4))


@pytest.fixture
def eager_capture(monkeypatch):
    """make_graphed_callables / capture_forward run their warm-ups eagerly (as on a GPU, they
    execute) and return the callable itself; what they were asked is logged."""
    from fusebench.modes import cudagraphs as cg
    log = []

    def graphed(module, static, num_warmup_iters):
        log.append(("autograd", torch.is_autocast_cache_enabled(), static[0].requires_grad))
        for _ in range(num_warmup_iters):
            module(*static).sum().backward()
        module.zero_grad(set_to_none=True)
        return module

    def forward(fn, args, warmup=cg.WARMUP):
        log.append(("forward", torch.is_autocast_cache_enabled(), torch.is_grad_enabled()))
        for _ in range(warmup):
            fn(*args)
        return fn
    monkeypatch.setattr(torch.cuda, "make_graphed_callables", graphed)
    monkeypatch.setattr(cg, "capture_forward", forward)
    return log


def test_cudagraphs_captures_once_per_context_and_restores_buffers(eager_capture):
    from fusebench.measure.events import EventLog
    model, ref = _tiny(), _tiny()
    x = torch.randn(2, 3, 6, 6)
    mode, events = get_mode("cudagraphs"), EventLog()
    fn = mode.prepare(model, (x,), {}, events)
    for _ in range(2):                         # two steps, one capture
        fn(x).sum().backward()
        ref(x).sum().backward()
    torch.testing.assert_close(model[1].running_mean, ref[1].running_mean)   # warm-ups undone
    with torch.no_grad():                      # a new context: a forward-only graph
        torch.testing.assert_close(fn(x), ref(x))
        fn(x)
    assert [e[0] for e in eager_capture] == ["autograd", "forward"]
    assert not any(cache for _, cache, _ in eager_capture)   # autocast cache off in capture
    mode.finish(events)
    assert any(e.message == "2 CUDA graph(s) captured" for e in events.events())


def test_all_modes_leave_out_what_cannot_run_on_the_device_and_say_so(monkeypatch):
    """`-m all` on CPU plans no cudagraphs cell (the outline names it); `-m cudagraphs` does."""
    from fusebench.commands.run import left_out
    from fusebench.run.plan import RunRequest, all_modes, plan_run
    runs, left = all_modes("cpu")
    assert "cudagraphs" in left and "cudagraphs" not in runs and "eager" in runs
    assert "cudagraphs" in all_modes("cuda:0")[0]
    req = RunRequest(models=TINY, modes="all", device="cpu", quick=True)
    specs = plan_run(req)
    assert {s.mode for s in specs} == set(runs)
    (line,) = left_out(req, specs)
    assert "cudagraphs (runs on cuda)" in line and "not in 'all' on cpu" in line
    named = plan_run(RunRequest(models=TINY, modes="eager,cudagraphs", device="cpu", quick=True))
    assert [s.mode for s in named] == ["eager", "cudagraphs"]
    assert left_out(RunRequest(models=TINY, modes="eager", device="cpu"), named) == []
