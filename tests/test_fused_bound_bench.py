"""benchmarks/fused_bound.py: a timed kernel call counts each storage it reads or writes once,
and the bounds follow from the step times, the kernels' time and their copy-speed time."""
import json

import pytest
import torch

from fusebench.kernels.bn_act import cpu as bn_act_cpu
from tests.helpers import load_benchmark


def _bench():
    return load_benchmark("fused_bound")


def test_a_timed_call_counts_each_storage_once():
    ok, reason = bn_act_cpu.build()
    if not ok:
        pytest.skip(reason)
    bench = _bench()
    log = bench.CallLog(on=True)
    ext = bench._Timed("bn_act", bn_act_cpu.extension(), log)
    x = torch.randn(2, 4, 5, 5)
    w, b = torch.rand(4) + 0.5, torch.randn(4)
    y, mean, invstd = ext.forward(x, w, b, None, None, 0.1, 1e-5, 0)
    # read x, w, b; wrote y, mean, invstd: floats of 2*4*5*5 + 2*4*5*5 + 4 * 4
    assert log.nbytes["bn_act.forward"] == 4 * (2 * 200 + 4 * 4)
    assert log.by_size[("bn_act.forward", 4 * 200)] == log.nbytes["bn_act.forward"]
    assert log.seconds["bn_act.forward"] > 0
    ext.apply(x, w, b, mean, invstd, 0)
    ext.apply(x, w, b, mean, invstd, 0)
    assert log.nbytes["bn_act.apply"] == 2 * 4 * (2 * 200 + 4 * 4)
    log.on = False                                   # the eager steps: nothing is counted
    ext.apply(x, w, b, mean, invstd, 0)
    assert log.nbytes["bn_act.apply"] == 2 * 4 * (2 * 200 + 4 * 4)


def test_bounds_follow_from_the_times(monkeypatch):
    bench = _bench()
    monkeypatch.setattr(bench, "copy_seconds_per_byte", lambda size: 1e-10)   # 10 GB/s
    monkeypatch.setattr(bench, "memory_copy_seconds_per_byte", lambda size: 1.5e-10)
    log = bench.CallLog()
    log.seconds["k.f"], log.by_size[("k.f", 10**8)] = 0.4, 2 * 10**9
    r = bench.summarise(log, {"eager": [1.0, 1.0], "fused": [0.8, 0.8]}, share=0.5, steps=2)
    assert r["bound"]["measured"] == pytest.approx(1.25)
    # per step: kernels 0.2 s -> 0.1 s at copy speed; fused 0.8 -> 0.7
    assert r["bound"]["roofline"] == pytest.approx(1.0 / 0.7)
    # at memory speed the kernels' 2e9 bytes take 0.3 s: 0.15 s per step, fused 0.75
    assert r["bound"]["memory_roofline"] == pytest.approx(1.0 / 0.75)
    assert r["kernels"]["k.f"]["pct_of_memory_copy"] == pytest.approx(75.0)
    assert r["bound"]["aten_only"] == pytest.approx(1.0 / 0.4)
    assert r["kernels"]["k.f"]["pct_of_copy"] == pytest.approx(50.0)
    assert r["kernels"]["k.f"]["gbps"] == pytest.approx(5.0)


@pytest.mark.parametrize("op, heavy", [
    ("mkldnn::_linear_pointwise", True),      # the sites' GEMMs since fuse/gemm.py
    ("aten::mm", True), ("aten::bmm", True), ("aten::baddbmm", True),
    ("aten::convolution_backward", True), ("aten::mkldnn_convolution", True),
    ("bn_act.backward", False), ("aten::add_", False), ("MultiOpFunctionBackward", False)])
def test_the_library_share_counts_every_gemm_route(op, heavy):
    """The aten-only bound's share: a GEMM on oneDNN's matmul is library work like mm's."""
    assert _bench().is_heavy(op) is heavy


def test_the_memory_copy_is_timed_from_memory_and_slower_than_the_cached_one():
    """The memory roofline's copy: operands evicted first, so per byte it takes at least as
    long as the cached copy at a size that fits the cache (1 MiB), and a real figure."""
    bench = _bench()
    cached, memory = (bench.copy_seconds_per_byte(1 << 20),
                      bench.memory_copy_seconds_per_byte(1 << 20))
    assert 0 < cached and 0 < memory < 1e-6           # under a microsecond per byte
    assert memory >= 0.8 * cached                     # slack for the VM's drift between them


class _CountingExt:
    """A stand-in C++ extension: `forward(x)` returns (x + 1 channels-last, x's sum), counted."""

    def __init__(self):
        self.calls = 0

    def forward(self, x, eps=1e-5):
        self.calls += 1
        return (x + 1).contiguous(memory_format=torch.channels_last), x.sum()


def test_a_free_family_replays_the_shapes_of_its_real_calls_without_running():
    bench = _bench()
    ext, replay = _CountingExt(), bench.Replay(frozenset({"act"}))
    free = bench._Free("act", ext, replay)
    x = torch.randn(2, 3, 4, 5)
    y, s = free.forward(x)                         # off: runs, records its outputs' shapes
    assert ext.calls == 1
    replay.on = True
    y2, s2 = free.forward(torch.randn(2, 3, 4, 5))
    assert ext.calls == 1 and replay.missed == 0   # replayed: no work
    assert (y2.shape, y2.stride(), y2.dtype) == (y.shape, y.stride(), y.dtype)
    assert s2.shape == s.shape and s2.dtype == s.dtype
    free.forward(torch.randn(2, 3, 4, 6))          # a shape with no record: runs, counted
    assert ext.calls == 2 and replay.missed == 1
    free.forward(x, eps=1e-3)                      # another keyword value: another call
    assert ext.calls == 3 and replay.missed == 2
    bench._Free("ln2d", ext, replay).forward(x)    # a family not named: runs, even while on
    assert ext.calls == 4 and replay.missed == 2


def test_an_unknown_free_family_is_one_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        _bench().main(["--free", "act,nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--free: unknown kernel family nope" in err and "Traceback" not in err


def test_the_free_step_runs_with_no_unrecorded_call(tmp_path, monkeypatch):
    """A whole (tiny) run with --free: the free side replays every call of the families named
    (none ran for lack of a record) and its bound is a real figure."""
    bench = _bench()
    ok, reason = bench.importlib.import_module("fusebench.kernels.ln2d.cpu").build()
    if not ok:
        pytest.skip(reason)
    for family in bench.KERNEL_MODULES:      # main wraps them for its process: undone after
        mod = bench.importlib.import_module(f"fusebench.kernels.{family}.cpu")
        monkeypatch.setattr(mod, "extension", mod.extension)
    threads = torch.get_num_threads()
    out = tmp_path / "bound.json"
    try:
        rc = bench.main(["--model", "convnext_atto", "--batch", "1", "--img", "32", "--steps",
                         "2", "--warmup", "1", "--threads", "1", "--free", "act,ln2d",
                         "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["free"] == ["act", "ln2d"] and r["free_missed"] == 0
    assert 0 < r["free_ms"] and r["bound"]["free"] == pytest.approx(r["eager_ms"] / r["free_ms"])
