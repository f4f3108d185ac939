"""Ratios that cannot be trusted look untrustworthy (issue 11.4)."""
from __future__ import annotations

from rich.console import Console

from factories import kernel_record, model_record, write_results
from fusebench.measure.events import EventLog
from fusebench.measure.noise import NOISY, noise_event, noisy_fraction
from fusebench.render.compare_table import render_table
from fusebench.render.run_table import run_table
from fusebench.results.compare import compare_files, noise_of, noisy_speedups
from fusebench.spec import CellSpec, StepStats

BUSY = {"window_s": 2.0, "worker_cores": 2, "cpu_count": 2, "others_cpu_s": 1.6,
        "others_frac": 0.4, "steal_frac": 0.0, "load1": 3.1}


def text_of(renderable, width: int = 160) -> str:
    c = Console(width=width, record=True, color_system=None)
    c.print(renderable)
    return c.export_text()


def test_noise_helpers():
    assert noisy_fraction(StepStats.from_samples([10.0] * 20)) is None
    wide = StepStats.from_samples([5.0, 10.0, 15.0, 20.0] * 5)
    assert noisy_fraction(wide) > NOISY
    log = EventLog()
    noise_event(wide, log)
    assert log.count("noise") == 1 and "IQR/median" in log.events()[0].message


def test_noise_of_iqr_contention_and_event():
    assert noise_of(model_record(sigma=0.01)) is None
    assert "IQR/median" in noise_of(model_record(sigma=0.4))
    assert "machine busy" in noise_of(model_record(sigma=0.01, extra={"contention": BUSY}))
    idle = {**BUSY, "others_frac": 0.01}
    assert noise_of(model_record(sigma=0.01, extra={"contention": idle})) is None
    # fields from another version do not crash the table
    assert noise_of(model_record(sigma=0.01, extra={"contention": {"x": 1}})) is None


def test_run_table_marks_ratio_on_noisy_side():
    recs = [model_record(mode="eager", base_ms=3000.0, sigma=0.5, seed=1),
            model_record(mode="torchscript", base_ms=40.0, sigma=0.01, seed=2),
            model_record(mode="compile", base_ms=3000.0, sigma=0.01, seed=3,
                         extra={"contention": BUSY})]
    noisy = noisy_speedups(recs)
    assert set(noisy) == {0, 1, 2}
    text = text_of(run_table(recs))
    assert "x?" in text                              # the ratio cell is marked
    assert "? torchscript vs eager: eager IQR/median" in text   # the footer says why
    assert "machine busy" in text


def test_run_table_quiet_ratios_unmarked():
    recs = [model_record(mode="eager", sigma=0.01, seed=1),
            model_record(mode="compile", base_ms=80.0, sigma=0.01, seed=2)]
    text = text_of(run_table(recs))
    assert "x?" not in text and "noisy" not in text


def test_compare_marks_noisy_ratio_and_footer(tmp_path):
    recs = [model_record(mode="eager", sigma=0.5, seed=1),
            model_record(mode="compile", base_ms=80.0, sigma=0.01, seed=2)]
    cmp = compare_files([write_results(tmp_path / "a.json", recs)])
    row = next(r for r in cmp.rows if r.variant == "compile")
    assert row.noise and "eager IQR/median" in row.noise
    c = Console(width=160, record=True, color_system=None)
    render_table(cmp, c)
    text = c.export_text()
    assert ")?" in text or "significant?" in text
    assert "? compile: eager IQR/median" in text


def test_single_file_not_significant_shows_ratio_and_ci(tmp_path):
    recs = [model_record(mode="eager", seed=1), model_record(mode="compile", seed=2)]
    cmp = compare_files([write_results(tmp_path / "a.json", recs)])
    verdict = next(r.verdict for r in cmp.rows if r.variant == "compile")
    assert verdict.endswith("not significant") and "x (" in verdict and "–" in verdict


def test_kernel_progress_label_names_the_impl():
    spec = CellSpec.for_kernel("ln2d", "permute", (8, 96, 56, 56), "eager", direction="fwdbwd")
    assert spec.label() == "ln2d/permute/fwdbwd"
    spec = CellSpec.for_kernel("ln2d", "permute", (8, 96, 56, 56), "compile",
                               direction="fwd")
    assert spec.label() == "ln2d/permute[compile]/fwd"
    assert kernel_record().spec.label().startswith("ln2d/permute/")
    assert model_record().spec.label() == "convnext_tiny/eager/train"



def test_kernel_cell_noisy_timing_gets_the_noise_event(monkeypatch):
    """Kernel cells carry the same noise event as model cells (issue 11.4)."""
    from fusebench.cell import kernel_cell

    def noisy(step, setup, x, n, device):
        step()
        copy = {"copy_gbps": 10.0, "copy_plain_gbps": 10.0, "copy_huge_gbps": None,
                "copy_prealloc_gbps": 10.0}
        return [1.0, 2.0, 3.0, 4.0, 5.0] * 4, copy
    monkeypatch.setattr(kernel_cell, "time_with_copies", noisy)
    spec = CellSpec.for_kernel("ln2d", "permute", (2, 8, 4, 4), "eager", direction="fwd")
    rec = kernel_cell.run_cell(spec, lambda phase: None)
    assert rec.status == "ok", rec.error
    assert [e for e in rec.events if e.category == "noise"], rec.events
