"""benchmarks/fusion_ab.py: a bad fusion name is one line and exit 2; a tiny A/B prints the
three medians and the ratios, the base side built without the named fusion."""
import re

from tests.helpers import load_benchmark


def test_an_unknown_fusion_is_one_line_and_exit_2(capsys):
    assert load_benchmark("fusion_ab").main(["--without", "no_such_fusion"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no_such_fusion" not in err and "se_project" in err


def test_a_tiny_ab_runs_both_sides(capsys, monkeypatch):
    bench = load_benchmark("fusion_ab")
    built = []
    real = bench.build
    monkeypatch.setattr(bench, "build", lambda *a, **k: built.append(k.get("only")) or real(*a, **k))
    assert bench.main(["--without", "se_project", "--aten-1x1", "--img", "32", "--batch", "2",
                       "--rounds", "3", "--warmup", "0", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "base/new" in out and "without se_project, aten 1x1" in out
    # the per-round ratios with their interval: "1.012x [0.990, 1.030]"
    assert re.search(r"paired per round: base/new \d\.\d+x \[\d\.\d+, \d\.\d+\]", out), out
    assert "se_project" not in built[1] and "se_gate" in built[1] and built[0::2] == [None, None]


def test_keep_layout_ab_runs_channels_last_inside_on_the_new_side(capsys, monkeypatch):
    bench = load_benchmark("fusion_ab")
    assert bench.main(["--keep-layout"]) == 2          # NCHW only: one line, exit 2
    assert "--nchw" in capsys.readouterr().err
    calls = []
    real = bench.ChannelsLastInside
    monkeypatch.setattr(bench, "ChannelsLastInside",
                        lambda m: calls.append(m) or real(m))
    assert bench.main(["--keep-layout", "--nchw", "--img", "32", "--batch", "2", "--rounds", "1",
                       "--warmup", "0", "--threads", "1"]) == 0
    assert "NCHW kept" in capsys.readouterr().out and len(calls) == 1


def test_gemm_ab_runs_the_base_side_on_the_named_backend(capsys, monkeypatch):
    from fusebench.fuse import gemm
    bench = load_benchmark("fusion_ab")
    seen, built = [], []
    real_build = bench.build
    monkeypatch.setattr(bench, "build", lambda *a, **k: built.append(a[2]) or real_build(*a, **k))
    real = bench.step
    monkeypatch.setattr(bench, "step", lambda *a, **k: seen.append(gemm._choice.name)
                        or real(*a, **k))
    assert bench.main(["--gemm", "aten", "--img", "32", "--batch", "2", "--rounds", "1",
                       "--warmup", "0", "--threads", "1"]) == 0
    assert "(base: aten GEMMs)" in capsys.readouterr().out
    assert sorted(seen) == ["aten", "auto", "auto"] and gemm._choice.name == "auto"
    assert built == [True, False]        # one fused model for both sides (and eager)


def test_the_depthwise_and_layer_scale_abs_change_the_base_side_only(capsys, monkeypatch):
    """--dwconv-aten-fwd and --fold-layer-scale: the base side's depthwise convs take the rule
    of a build without reuse blocks and its layer scales go through the fold; the new side reads
    the build as it is and scales the rows (at 32 px every ConvNeXt-atto stage has fewer output
    values than fc2 has weights)."""
    from fusebench.fuse import layer_scale
    from fusebench.fuse.fusions import dwconv
    from fusebench.kernels.dwconv import cpu
    bench = load_benchmark("fusion_ab")
    reuse, calls = set(), {"fold": 0, "scaled": 0}
    rule = dwconv._rule
    monkeypatch.setattr(dwconv, "_rule", lambda *a: reuse.add((a[1], a[-1])) or rule(*a))
    for name in calls:
        real = getattr(layer_scale, name)
        monkeypatch.setattr(layer_scale, name, lambda *a, _n=name, _f=real, **k:
                            calls.__setitem__(_n, calls[_n] + 1) or _f(*a, **k))
    assert bench.main(["--model", "convnext_atto", "--dwconv-aten-fwd", "--fold-layer-scale",
                       "--img", "32", "--batch", "2", "--rounds", "1", "--warmup", "0",
                       "--threads", "1"]) == 0
    assert "oneDNN's depthwise fwd + dx, layer scales folded" in capsys.readouterr().out
    assert reuse == {(7, False), (7, cpu.reuse_blocks())}
    assert calls["fold"] > 0 and calls["scaled"] > 0, calls
