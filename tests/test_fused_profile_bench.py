"""benchmarks/fused_profile.py --by-kernel: each call into a bundled C++ extension shows up in the
profile under its own name, and the labelled extension computes what the plain one does."""
import importlib

import pytest
import torch

from fusebench.kernels.bn_act import cpu as bn_act_cpu
from tests.helpers import load_benchmark


def _bench():
    return load_benchmark("fused_profile")


@pytest.fixture
def labelled():
    """label_kernels() for the test's duration; each family's own `extension` put back after."""
    ok, reason = bn_act_cpu.build()
    if not ok:
        pytest.skip(reason)
    fams = [importlib.import_module(f"fusebench.kernels.{f}.cpu") for f in
            _bench().KERNEL_MODULES]
    before = [m.extension for m in fams]
    _bench().label_kernels()
    yield
    for m, ext in zip(fams, before):
        m.extension = ext


def _names(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


def test_fused_step_is_split_by_kernel(labelled):
    bench = _bench()
    torch.manual_seed(0)
    model = bench.build("efficientnet_b0", channels_last=True, fused=True)
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    target = torch.tensor([1, 2])
    names = _names(lambda: bench.step(model, x, target))
    assert {"bn_act.forward", "bn_act.backward"} <= names, sorted(names)


def test_labelled_extension_computes_the_same(labelled):
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    w, b = torch.rand(4, dtype=torch.float64) + 0.5, torch.randn(4, dtype=torch.float64)
    y, mean, invstd = bn_act_cpu.forward(x, w, b, None, None, 0.1, 1e-5, "silu")
    assert type(bn_act_cpu.extension()).__name__ == "_Labelled"    # the call went through it
    ref = torch.nn.functional.silu(torch.nn.functional.batch_norm(
        x, None, None, w, b, training=True, eps=1e-5))
    torch.testing.assert_close(y, ref)
    assert "bn_act.apply" in _names(lambda: bn_act_cpu.apply(x, w, b, mean, invstd, "silu"))


@pytest.mark.parametrize("rebuild", [False, True])
def test_fused_side_runs_as_the_mode_does_unless_asked_to_rebuild(labelled, rebuild):
    """The mode saves BN+act outputs by default (recompute.Saving): the benchmarks' fused model
    must too, or they profile the --fused-recompute path (bn_act.apply, the rebuilds)."""
    bench = _bench()
    torch.manual_seed(0)
    model = bench.build("efficientnet_b0", channels_last=True, fused=True, rebuild=rebuild)
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    names = _names(lambda: bench.step(model, x, torch.tensor([1, 2])))
    assert "bn_act.backward" in names
    assert ("bn_act.apply" in names) == rebuild, sorted(n for n in names if "bn_act" in n)
