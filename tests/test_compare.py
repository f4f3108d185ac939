"""compare: bootstrap CIs, wording, A/A vs injected slowdown, --fail-on-regression, formats."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.factories import fake_env, kernel_record, model_record, modes_run, samples, write_results
from fusebench.results import stats
from fusebench.cli import app
from fusebench.results.compare import METRICS, compare_files, compare_modes
from fusebench.spec import CellSpec

runner = CliRunner()

SPEEDS = {"eager": 100.0, "compile": 80.0, "torchscript": 101.0}


def run_records(scale: float = 1.0, seed: int = 0):
    """Two models x three modes; scale > 1 makes every step slower by that factor."""
    return (modes_run("convnext_tiny", {m: ms * scale for m, ms in SPEEDS.items()}, seed=seed)
            + modes_run("effnet_b0", {m: ms * scale / 2 for m, ms in SPEEDS.items()},
                        seed=seed + 50))


@pytest.fixture
def aa_files(tmp_path):
    """A/A: the same configuration run twice (independent noise)."""
    a = write_results(tmp_path / "a.json", run_records(seed=0))
    b = write_results(tmp_path / "b.json", run_records(seed=1000))
    return a, b


@pytest.fixture
def slow_file(tmp_path):
    return write_results(tmp_path / "slow.json", run_records(scale=1.2, seed=2000))


# --- stats --------------------------------------------------------------------------------------
def test_speedup_ci_brackets_true_ratio_and_is_reproducible():
    base, cand = samples(100.0, seed=1), samples(80.0, seed=2)
    r = stats.speedup_ci(base, cand)
    assert r.low < r.gain < r.high
    assert 1.2 < r.low and r.high < 1.3          # true speedup 1.25
    assert stats.speedup_ci(base, cand) == r     # fixed seed: same interval every time
    assert r.significant


def test_describe_wording():
    assert stats.describe(stats.Ratio(1.31, 1.27, 1.35)) == "1.31x faster (1.27–1.35)"
    assert stats.describe(stats.Ratio(1 / 1.12, 1 / 1.19, 1 / 1.05)) == \
        "1.12x slower (1.05–1.19)"
    assert stats.describe(stats.Ratio(1.02, 0.98, 1.06)) == "not significant"
    assert stats.describe(stats.Ratio(2.0), "less memory", "more memory") == \
        "2.00x less memory (no CI)"


def test_degenerate_and_tiny_samples():
    r = stats.speedup_ci([5.0] * 10, [5.0] * 10)
    assert r.gain == 1.0 and not r.significant
    assert stats.speedup_ci([5.0], [4.0]).has_ci is False


def test_geomean_ratio():
    assert stats.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    rs = [stats.speedup_ci(samples(100, seed=i), samples(50, seed=i + 10)) for i in range(3)]
    g = stats.geomean_ratio(rs)
    assert g.low < 2.0 < g.high and g.gain == pytest.approx(2.0, rel=0.05)


# --- compare logic ------------------------------------------------------------------------------
def test_single_file_modes_vs_eager(aa_files):
    cmp = compare_files([aa_files[0]])
    assert cmp.axis == "modes" and cmp.baseline == "eager"
    verdicts = {(r.model, r.variant): r.verdict for r in cmp.rows}
    assert verdicts[("convnext_tiny", "eager")] == "baseline"
    assert verdicts[("convnext_tiny", "compile")].startswith("1.2")
    assert "faster" in verdicts[("convnext_tiny", "compile")]
    geo = {g.label: g for g in cmp.geomean}
    assert geo["compile"].cells == 2 and geo["compile"].ratio.gain == pytest.approx(1.25, 0.05)


def test_aa_is_not_significant(aa_files):
    cmp = compare_files(list(aa_files), metric="step_ms", fail_pct=10)
    others = [r for r in cmp.rows if not r.baseline]
    assert len(others) == 6
    assert all(r.verdict == "not significant" for r in others), [r.verdict for r in others]
    assert not cmp.regressions()
    assert all(g.verdict == "not significant" for g in cmp.geomean)
    assert not cmp.warnings


def test_injected_slowdown_is_flagged(aa_files, slow_file):
    cmp = compare_files([aa_files[0], slow_file], fail_pct=10)
    others = [r for r in cmp.rows if not r.baseline]
    assert all("slower" in r.verdict for r in others)
    assert all(r.regression for r in others)
    assert all(1.15 < 1 / r.ratio.gain < 1.25 for r in others)
    # the same slowdown does not trip a 25% threshold
    assert not compare_files([aa_files[0], slow_file], fail_pct=25).regressions()


def test_failed_cell_across_runs_is_a_regression(tmp_path):
    a = write_results(tmp_path / "a.json", [model_record(mode="eager", seed=1)])
    b = write_results(tmp_path / "b.json", [model_record(mode="eager", status="crashed")])
    cmp = compare_files([a, b], fail_pct=10)
    assert [r.verdict for r in cmp.rows] == ["baseline", "crashed"]
    assert cmp.regressions()


def test_unmatched_cells_and_env_difference_warn(tmp_path):
    a = write_results(tmp_path / "a.json", modes_run(seed=1))
    b = write_results(tmp_path / "b.json",
                      modes_run(seed=2) + [model_record("other", seed=9)],
                      env=fake_env(**{"torch.version": "2.12.0", "cpu.model": "AMD EPYC"}))
    cmp = compare_files([a, b])
    text = " ".join(cmp.warnings)
    assert "torch version: 2.13.0+cpu vs 2.12.0" in text and "CPU model" in text
    assert "only in b.json: other" in text


def test_baseline_file_and_memory_metric(aa_files, slow_file):
    cmp = compare_files([aa_files[0], slow_file], baseline=str(slow_file))
    assert cmp.baseline == "slow.json"
    assert all("faster" in r.verdict for r in cmp.rows if not r.baseline)
    mem = compare_files([aa_files[0]], metric="peak_mem")
    assert all(r.verdict == "same" for r in mem.rows if not r.baseline)


def test_kernel_records_compare_by_impl(tmp_path):
    recs = [kernel_record("permute", base_ms=2.0, seed=1),
            kernel_record("fused", base_ms=1.0, seed=2)]
    p = write_results(tmp_path / "k.json", recs)
    cmp = compare_files([p], baseline="permute", metric="step_ms")
    fused = next(r for r in cmp.rows if r.variant == "fused")
    assert "faster" in fused.verdict and fused.ratio.gain == pytest.approx(2.0, rel=0.03)


def test_kernel_records_group_by_spec(tmp_path):
    """Each (shape, direction, mode) is its own cell; impls are the variants inside it; a
    model record never joins a kernel cell even when its numbers look alike."""
    small, big = (8, 64, 56, 56), (8, 128, 56, 56)
    recs = [kernel_record("permute", base_ms=2.0, seed=1, shape=small),
            kernel_record("fused", base_ms=1.0, seed=2, shape=small),
            kernel_record("permute", base_ms=4.0, seed=3, shape=big),
            kernel_record("fused", base_ms=1.0, seed=4, shape=big),
            kernel_record("permute", base_ms=2.0, seed=5, shape=small, direction="bwd"),
            kernel_record("fused", base_ms=2.0, seed=6, shape=small, mode="compile"),
            model_record("ln2d", "eager", bench="fwd", batch_size=8, img_size=56)]
    cmp = compare_modes(recs, METRICS["step_ms"], baseline="permute")
    groups: dict[int, list[str]] = {}
    for r in cmp.rows:
        groups.setdefault(r.group, []).append(f"{r.config}:{r.variant}")
    assert sorted(groups.values()) == sorted([
        ["fwd 8x64x56x56 fp32 cpu:permute", "fwd 8x64x56x56 fp32 cpu:fused"],
        ["fwd 8x128x56x56 fp32 cpu:permute", "fwd 8x128x56x56 fp32 cpu:fused"],
        ["bwd 8x64x56x56 fp32 cpu:permute"],
        ["fwd 8x64x56x56 compile fp32 cpu:fused"],
        ["fwd b8 56 fp32 cpu:eager"]])
    gains = {r.config: r.ratio.gain for r in cmp.rows if r.ratio is not None}
    assert gains["fwd 8x64x56x56 fp32 cpu"] == pytest.approx(2.0, rel=0.03)
    assert gains["fwd 8x128x56x56 fp32 cpu"] == pytest.approx(4.0, rel=0.03)
    # across runs the spec is the match key too
    a = write_results(tmp_path / "a.json", recs[:4])
    b = write_results(tmp_path / "b.json", recs[2:4])
    runs = compare_files([a, b], metric="step_ms")
    assert any("only in a.json: ln2d fwd 8x64x56x56" in w for w in runs.warnings)
    assert {r.config for r in runs.rows} == {"fwd 8x128x56x56 fp32 cpu"}


def test_run_table_speedup_is_compares(tmp_path):
    """The run table's 'vs eager' column and compare's step-time gain are one computation."""
    from fusebench.results.compare import speedups
    recs = modes_run(speed={"eager": 100.0, "compile": 80.0, "aot": 50.0})
    sp = speedups(recs, "eager")
    cmp = compare_modes(recs, METRICS["step_ms"])
    assert sp[0] == 1.0
    for i, row in zip((1, 2), cmp.rows[1:]):
        assert sp[i] == pytest.approx(row.ratio.gain, rel=1e-12)


# --- CLI ----------------------------------------------------------------------------------------
def test_cli_aa_exit0_and_slowdown_exit1(aa_files, slow_file):
    ok = runner.invoke(app, ["compare", str(aa_files[0]), str(aa_files[1]),
                             "--fail-on-regression", "10"])
    assert ok.exit_code == 0, ok.output
    assert "not significant" in ok.stdout
    bad = runner.invoke(app, ["compare", str(aa_files[0]), str(slow_file),
                              "--fail-on-regression", "10", "--format", "markdown"])
    assert bad.exit_code == 1, bad.output
    assert "REGRESSION" in bad.stdout and "regression in slow.json" in bad.stderr


def test_cli_single_file_table(aa_files):
    res = runner.invoke(app, ["compare", str(aa_files[0])], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "faster" in res.stdout and "geometric mean" in res.stdout


def test_cli_formats(aa_files):
    js = runner.invoke(app, ["compare", *map(str, aa_files), "--format", "json",
                             "--metric", "step_ms"])
    assert js.exit_code == 0, js.output
    doc = json.loads(js.stdout)
    assert doc["metric"] == "step_ms" and doc["regressions"] == 0
    assert {r["verdict"] for r in doc["rows"] if not r["baseline"]} == {"not significant"}
    cs = runner.invoke(app, ["compare", str(aa_files[0]), "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(cs.stdout)))
    assert {"model", "variant", "gain", "ci_low", "ci_high", "verdict"} <= set(rows[0])
    assert any(r["model"] == "geometric mean" for r in rows)
    md = runner.invoke(app, ["compare", str(aa_files[0]), "--format", "markdown"])
    assert md.stdout.startswith("| model | config | mode |")


@pytest.mark.parametrize("args", [
    ["--metric", "latency"], ["--format", "html"], ["--baseline", "nosuchmode"],
    ["--fail-on-regression", "-5"],
])
def test_cli_bad_options_exit2(aa_files, args):
    res = runner.invoke(app, ["compare", str(aa_files[0]), *args])
    assert res.exit_code == 2, res.output


def test_cli_bad_files_exit2_one_line(tmp_path):
    bad = {
        "missing.json": None,
        "notjson.json": "hello",
        "other.json": json.dumps({"benchmarks": []}),
        "newer.json": json.dumps({"schema": "fusebench/99", "records": []}),
    }
    good = write_results(tmp_path / "good.json", modes_run())
    bad["truncated.json"] = good.read_text()[:200]
    for name, text in bad.items():
        p = tmp_path / name
        if text is not None:
            p.write_text(text)
        res = runner.invoke(app, ["compare", str(p)])
        assert res.exit_code == 2, (name, res.output)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("fusebench: error:"), (name, lines)
        assert "Traceback" not in res.output


def test_ratio_matches_direct_median_ratio(aa_files):
    cmp = compare_files([aa_files[0]], metric="step_ms")
    rows = {r.variant: r for r in cmp.rows if r.model == "convnext_tiny"}
    assert rows["compile"].ratio.gain == pytest.approx(
        rows["eager"].value / rows["compile"].value)
    assert np.isfinite([rows["compile"].ratio.low, rows["compile"].ratio.high]).all()


# ----- several worker processes per cell (hierarchical bootstrap) -----------------------------
def _processes(rng, n_proc, n_steps, scale=1.0, drift=0.15):
    """Each process has its own level (machine drift between runs), steps vary little."""
    import numpy as np
    levels = 100.0 * scale * np.exp(rng.normal(0.0, drift, n_proc))
    return [list(lv * (1 + rng.normal(0.0, 0.01, n_steps))) for lv in levels]


def test_process_bootstrap_aa_not_significant_and_slowdown_flagged():
    """Drift between processes (15%) that steps within one process never show: pooling steps
    calls A/A differences significant; resampling processes does not, and a 50% slowdown
    still is."""
    import numpy as np
    rng = np.random.default_rng(7)
    aa_pooled = aa_proc = slow_proc = 0
    for _ in range(10):
        a, b = _processes(rng, 5, 10), _processes(rng, 5, 10)
        slow = _processes(rng, 5, 10, scale=1.5)
        aa_pooled += stats.speedup_ci(sum(a, []), sum(b, [])).significant
        aa_proc += stats.speedup_ci_processes(a, b).significant
        slow_proc += stats.speedup_ci_processes(a, slow).significant
    assert aa_pooled >= 3          # the steps-only CI: noise called a change
    assert aa_proc <= 1 < aa_pooled
    assert slow_proc >= 9


def test_process_spread_sets_the_minimum_effect():
    r = stats.speedup_ci_processes([[100.0, 101.0], [120.0, 121.0]], [[100.0], [99.0]])
    s_base = stats.process_spread([[100.0, 101.0], [120.0, 121.0]])
    s_cand = stats.process_spread([[100.0], [99.0]])
    # two standard errors of the difference of two means of two process medians each
    assert r.min_effect == pytest.approx(2 * (s_base ** 2 / 2 + s_cand ** 2 / 2) ** 0.5)
    assert r.min_effect > 0.1
    one = stats.speedup_ci_processes([[100.0, 101.0, 99.0]], [[90.0, 91.0, 89.0]])
    assert one.min_effect == stats.MIN_EFFECT and one.significant


def test_compare_nothing_matched_one_line_exit1(tmp_path):
    a = write_results(tmp_path / "a.json", modes_run("convnext_tiny", seed=1))
    b = write_results(tmp_path / "b.json", modes_run("effnet_b0", seed=2, batch_size=32))
    res = runner.invoke(app, ["compare", str(a), str(b)], env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "nothing to compare" in lines[0] and "a.json has convnext_tiny train b8" in lines[0]
    assert "b.json has effnet_b0 train b32" in lines[0] and "only in" not in res.output
    assert res.stdout == ""


def _with(mode="eager", heap=None, threads=None, seed=0):
    spec = CellSpec.for_model("convnext_tiny", mode, batch_size=8, img_size=224,
                              threads=threads)
    return model_record(spec=spec, seed=seed, extra={"heap": heap} if heap else None)


def _settings_lines(cmp):
    return [w for w in cmp.warnings if "different settings" in w]


@pytest.mark.parametrize("a, b, expect", [
    (dict(heap="trim"), dict(heap="keep"), "heap keep vs trim (1 cell)"),
    (dict(heap="keep", threads=1), dict(heap="keep", threads=2), "threads 1 vs 2 (1 cell)"),
    (dict(), dict(heap="keep"), "heap keep vs unrecorded (glibc trimming)"),
])
def test_runs_under_different_settings_warn(tmp_path, a, b, expect):
    fa = write_results(tmp_path / "a.json", [_with(seed=1, **a)])
    fb = write_results(tmp_path / "b.json", [_with(seed=2, **b)])
    lines = _settings_lines(compare_files([fa, fb]))
    assert len(lines) == 1 and expect in lines[0], lines


def test_modes_of_one_file_under_different_heaps_warn(tmp_path):
    f = write_results(tmp_path / "r.json", [_with("eager", heap="trim", seed=1),
                                            _with("compile", heap="keep", seed=2)])
    lines = _settings_lines(compare_files([f]))
    assert len(lines) == 1 and "heap keep vs trim" in lines[0], lines


def test_same_settings_say_nothing(aa_files, tmp_path):
    assert not _settings_lines(compare_files(list(aa_files)))
    fa = write_results(tmp_path / "a.json", [_with(heap="keep", threads=2, seed=1)])
    fb = write_results(tmp_path / "b.json", [_with(heap="keep", threads=2, seed=2)])
    assert not _settings_lines(compare_files([fa, fb]))


@pytest.mark.parametrize("heap, threads", [("keep", 2), (None, None)])
def test_settings_read_the_same_from_a_record_and_its_dict(heap, threads):
    from fusebench.results import items
    from fusebench.results.compare import get_metric
    r, m = _with(heap=heap, threads=threads), get_metric("throughput")
    d = json.loads(json.dumps(r.to_dict()))
    assert items.from_record(r, m).settings == items.from_dict(d, m).settings
    assert dict(items.from_record(r, m).settings)["threads"] == threads
