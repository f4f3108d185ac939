"""Tables read at 80, 100 and 120 columns: numbers are never cut (issues 11.3, 13.6)."""
from __future__ import annotations

import re

import pytest
from rich.console import Console

from factories import kernel_record, model_record, modes_run, write_results
from fusebench.render.compare_table import render_table, short_labels
from fusebench.render.kernel_table import kernel_table
from fusebench.render.names import display_name
from fusebench.render.run_table import run_table
from fusebench.results.compare import compare_files

WIDTHS = (80, 100, 120)
SPEEDS = {"eager": 3359.42, "torchscript": 2911.3, "compile": 1234.5}
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?")


def render(renderable, width: int, **kw) -> str:
    c = Console(width=width, record=True, color_system=None, force_terminal=False)
    c.print(renderable, **kw) if not callable(renderable) else renderable(c)
    return c.export_text()


def assert_whole(text: str, expected: list[str], width: int) -> None:
    assert "…" not in text, text                   # nothing cut with an ellipsis
    assert all(len(line) <= width for line in text.splitlines())
    numbers = set(NUMBER.findall(text))
    missing = [e for e in expected if e not in numbers]
    assert not missing, (missing, text)


def _run_records():
    recs = [model_record("path/to/models.py:make", m, base_ms=ms, seed=i)
            for i, (m, ms) in enumerate(SPEEDS.items())]
    return recs


@pytest.mark.parametrize("width", WIDTHS)
def test_run_table_numbers_whole(width):
    recs = _run_records()
    text = render(run_table(recs), width)
    expected = [f"{r.step_ms.median:.2f}" for r in recs] + ["2.70x"]
    assert_whole(text, [e.rstrip("x") for e in expected], width)
    # shared model/bench/batch/size go in the title; the user model by its factory name
    assert "fusebench run · make · train · b8 · 224px" in text
    assert "models.py" not in text


def test_run_table_wide_and_narrow_columns():
    recs = _run_records()
    narrow = render(run_table(recs), 80)
    assert "not shown at this width" in narrow and "--wide" in narrow
    wide = run_table(recs, wide=True)
    text = render(wide, wide.width_needed(Console(width=80)))
    assert "act mem" in text and "events" in text and "not shown" not in text
    assert "compile s" in render(run_table(recs), 200)


@pytest.mark.parametrize("width", WIDTHS)
def test_kernel_table_numbers_whole(width):
    recs = [kernel_record(i, base_ms=ms, seed=j, shape=(32, 768, 56, 56), direction="fwdbwd")
            for j, (i, ms) in enumerate([("permute", 31.234), ("fused", 12.456),
                                          ("channels_first", 45.678)])]
    text = render(kernel_table(recs), width)
    expected = [f"{r.step_ms.median:.3f}" for r in recs] + [f"{r.extra['gbps']:.2f}"
                                                            for r in recs]
    assert_whole(text, expected, width)
    assert "32x768x56x56" in text.splitlines()[0] + text    # in the title when shared


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_tables_numbers_whole(tmp_path, width):
    def recs(seed, k):
        return (modes_run("convnext_tiny", {m: v * k for m, v in SPEEDS.items()}, seed=seed)
                + modes_run("efficientnet_b3", {m: v / 2 for m, v in SPEEDS.items()},
                            seed=seed + 50, batch_size=32))
    a = write_results(tmp_path / "convnext_tiny-20261130-aaaa.json", recs(0, 1))
    b = write_results(tmp_path / "convnext_tiny-20261130-bbbb.json", recs(9, 1.2))
    for files in ([a], [a, b]):
        cmp = compare_files(files)
        text = render(lambda c: render_table(cmp, c), width)
        values = [cmp.metric.show(r.value) for r in cmp.rows if r.value is not None]
        ratios = [v for r in cmp.rows if r.ratio for v in NUMBER.findall(r.verdict)]
        assert_whole(text, values + ratios, width)
    # issue 13.6: the run column keeps what tells the runs apart
    assert "aaaa" in text and "bbbb" in text


def test_short_labels():
    assert short_labels(["conv_a.json", "conv_b.json"]) == {"conv_a.json": "a",
                                                           "conv_b.json": "b"}
    assert short_labels(["x.json", "y.json"]) == {"x.json": "x", "y.json": "y"}
    same = short_labels(["d1/r.json", "d2/r.json"])
    assert same == {"d1/r.json": "d1", "d2/r.json": "d2"}
    assert short_labels(["a.json"]) == {"a.json": "a.json"}


def test_display_name():
    assert display_name("some/dir/file.py:make") == "make"
    assert display_name("convnext_tiny") == "convnext_tiny"


def test_compare_cli_wide_keeps_every_column(tmp_path):
    from typer.testing import CliRunner
    from fusebench.cli import app
    recs = (modes_run("convnext_tiny", SPEEDS, seed=1)
            + modes_run("a_long_model_name_for_width", SPEEDS, seed=5, batch_size=64))
    path = write_results(tmp_path / "a.json", recs)
    args = ["compare", str(path), "--metric", "step_ms"]
    narrow = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert "not shown at this width: IQR (ms)" in narrow.stdout
    cmp = compare_files([path], metric="step_ms")
    values = [cmp.metric.show(r.value) for r in cmp.rows]
    ratios = [v for r in cmp.rows if r.ratio for v in NUMBER.findall(r.verdict)]
    assert_whole(narrow.stdout, values + ratios, 80)    # the long name folds, nothing is cut
    wide = CliRunner().invoke(app, [*args, "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    assert "IQR" in wide.stdout and "not shown" not in wide.stdout and "…" not in wide.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_columns_that_tell_rows_apart_stay(width):
    """Batch and model differ between rows: they stay, lower-priority columns go first."""
    recs = [model_record("efficientnet_b3", m, base_ms=ms, seed=i, batch_size=bs)
            for i, (m, ms, bs) in enumerate([("eager", 3359.42, 32), ("compile", 1234.5, 32),
                                              ("eager", 843.21, 8)])]
    recs.append(model_record("convnext_tiny", "eager", base_ms=999.99, seed=7))
    text = render(run_table(recs), width)
    header = next(line for line in text.splitlines() if "mode" in line)
    assert " b " in header and "model" in header
    assert_whole(text, [f"{r.step_ms.median:.2f}" for r in recs] + ["32", "8"], width)
    krecs = [kernel_record("permute", base_ms=1.5, shape=(8, 96, 56, 56), seed=1),
             kernel_record("permute", base_ms=12.25, shape=(64, 768, 14, 14), seed=2)]
    ktext = render(kernel_table(krecs), width)
    assert "8x96x56x56" in ktext and "64x768x14x14" in ktext
    assert_whole(ktext, [f"{r.step_ms.median:.3f}" for r in krecs], width)


def test_wide_run_and_kernel_tables_pass_the_edge():
    """--wide: every column, the table as wide as it needs (printed with crop=False)."""
    recs = _run_records()
    c = Console(width=80, record=True, color_system=None)
    c.print(run_table(recs, wide=True), crop=False)
    text = c.export_text(styles=False)
    assert "act mem" in text and "events" in text and "not shown" not in text
    assert max(len(line) for line in text.splitlines()) > 80
    krecs = [kernel_record("permute", base_ms=1.5, shape=(8, 96, 56, 56), seed=1)]
    c.print(kernel_table(krecs, wide=True), crop=False)
    assert "% of copy" in c.export_text()


def test_run_table_says_threads_and_heap():
    """The run-only settings that change a step's time: in the title when the rows share
    them, a column each where they differ (compare warns about such mixes too)."""
    same = [model_record("efficientnet_b3", m, base_ms=ms, seed=i,
                         extra={"threads": {"intra_op": 2}, "heap": "keep"})
            for i, (m, ms) in enumerate([("eager", 400.0), ("fused", 300.0)])]
    text = render(run_table(same), 120)
    assert "fusebench run · efficientnet_b3 · train · b8 · 224px · T2 · heap keep" in text
    mixed = [model_record("efficientnet_b3", "eager", base_ms=400.0,
                          extra={"threads": {"intra_op": 1}, "heap": "trim"}),
             model_record("efficientnet_b3", "fused", base_ms=300.0, seed=1,
                          extra={"threads": {"intra_op": 2}, "heap": "keep"})]
    t = run_table(mixed, wide=True)
    text = render(t, t.width_needed(Console(width=80)))
    header = next(line for line in text.splitlines() if "mode" in line)
    assert "threads" in header and "heap" in header
    rows = [line for line in text.splitlines() if line.startswith(("│ eager", "│ fused"))]
    assert "T1" in rows[0] and "trim" in rows[0] and "T2" in rows[1] and "keep" in rows[1]
