"""plot: every kind writes a real, non-blank PNG and SVG; bad input exits 2 and writes nothing."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import matplotlib.image as mpimg
import pytest
from typer.testing import CliRunner

from tests.factories import model_record, modes_run, write_results
from fusebench.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plot")
    run = (modes_run("convnext_tiny", {"eager": 100.0, "compile": 80.0, "aot": 95.0}, seed=1)
           + modes_run("effnet_b0", {"eager": 50.0, "compile": 45.0, "aot": 52.0}, seed=9))
    sweep = [model_record("convnext_tiny", mode, base_ms=ms * b ** 0.8, batch_size=b,
                          seed=10 * b + i)
             for b in (1, 2, 4, 8, 16)
             for i, (mode, ms) in enumerate({"eager": 10.0, "compile": 8.0}.items())]
    return {"run": write_results(d / "run.json", run),
            "sweep": write_results(d / "sweep.json", sweep)}


def _check_png(path):
    assert path.stat().st_size > 10_000
    img = mpimg.imread(path)                      # (H, W, 4) floats in [0, 1]
    assert img.shape[0] > 300 and img.shape[1] > 500
    rgb = img[..., :3]
    assert rgb.std() > 0.05                       # not blank
    # some clearly coloured pixels (bars / lines), not just black text on white
    sat = rgb.max(axis=-1) - rgb.min(axis=-1)
    assert (sat > 0.3).mean() > 0.005


def _check_svg(path, title_word):
    text = path.read_text()
    assert path.stat().st_size > 10_000
    root = ET.fromstring(text)
    assert root.tag.endswith("svg")
    assert text.count("<path") > 10
    assert title_word in text                     # svg.fonttype=path still keeps <!-- title -->


KINDS = {"speedup": ("run", "Speedup"), "throughput": ("run", "Throughput"),
         "memory": ("run", "memory"), "sweep": ("sweep", "Sweep")}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_png_and_svg(files, tmp_path, kind):
    src, word = KINDS[kind]
    png, svg = tmp_path / f"{kind}.png", tmp_path / f"{kind}.svg"
    for out in (png, svg):
        res = runner.invoke(app, ["plot", str(files[src]), "--figure", kind, "-o", str(out)])
        assert res.exit_code == 0, res.output
    _check_png(png)
    _check_svg(svg, word)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([png.name, svg.name])


def test_two_runs_speedup(files, tmp_path):
    out = tmp_path / "two.png"
    res = runner.invoke(app, ["plot", str(files["run"]), str(files["sweep"]), "--figure",
                              "throughput", "-o", str(out)])
    assert res.exit_code == 0, res.output
    _check_png(out)


@pytest.mark.parametrize("args", [
    ["--figure", "violin"],                 # unknown kind
    ["-o", "{d}/out.jpg"],                # unsupported extension
    ["-o", "{d}/out"],                    # no extension
    ["--figure", "sweep"],                  # nothing swept in this file
])
def test_bad_input_exit2_and_no_file(files, tmp_path, args):
    args = [a.format(d=tmp_path) for a in args]
    if "-o" not in args:
        args += ["-o", str(tmp_path / "x.png")]
    res = runner.invoke(app, ["plot", str(files["run"]), *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []         # no output, no temp file left behind


def test_bad_results_file_exit2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "fusebench/1", "records": [')
    res = runner.invoke(app, ["plot", str(bad), "-o", str(tmp_path / "x.png")])
    assert res.exit_code == 2
    assert res.stderr.strip().startswith("fusebench: error:")
    assert not (tmp_path / "x.png").exists()


def test_failed_save_leaves_nothing(files, tmp_path, monkeypatch):
    import matplotlib.figure

    def boom(self, *a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", boom)
    from fusebench.render.plot import plot_files
    with pytest.raises(OSError):
        plot_files([files["run"]], "speedup", tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_all_records_failed_is_usage_error(tmp_path):
    p = write_results(tmp_path / "f.json", [model_record(mode="eager", status="error"),
                                            model_record(mode="compile", status="error")])
    for kind in ("speedup", "throughput", "memory", "sweep"):
        res = runner.invoke(app, ["plot", str(p), "--figure", kind, "-o", str(tmp_path / "o.png")])
        assert res.exit_code == 2, (kind, res.output)
    assert not (tmp_path / "o.png").exists()


def test_uses_agg_backend():
    import matplotlib

    import fusebench.render.plot  # noqa: F401
    assert matplotlib.get_backend().lower() == "agg"


def _two_runs(tmp_path):
    from fusebench.results.compare import load_run
    a = write_results(tmp_path / "a.json", modes_run(
        "convnext_tiny", {"eager": 100.0, "compile": 80.0, "aot": 95.0}, seed=1))
    b = write_results(tmp_path / "b.json", modes_run(
        "convnext_tiny", {"eager": 100.0, "compile": 70.0}, seed=2))
    return [load_run(a, "a.json"), load_run(b, "b.json")]


@pytest.mark.parametrize("kind", ["throughput", "speedup"])
def test_two_files_one_colour_per_mode_hatch_per_file(tmp_path, kind):
    """Issue 11.6: a colour per mode across files, the file as the hatch, no empty legend
    slots; the config shared by every record is in the title."""
    import matplotlib.pyplot as plt
    from fusebench.render.plot import make_figure
    fig = make_figure(_two_runs(tmp_path), kind)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        modes = ["compile", "aot"] if kind == "speedup" else ["eager", "compile", "aot"]
        assert labels[:len(modes)] == modes
        assert labels[len(modes):len(modes) + 2] == ["a.json", "b.json"]
        assert len(labels) == len(set(labels))
        colour = {}
        for bar in ax.patches:
            colour.setdefault(bar.get_hatch() or "", set()).add(bar.get_facecolor())
        assert set(colour) == {"", "//"}                       # one hatch per file
        assert colour["//"] <= colour[""]                      # same colours in both files
        assert "convnext_tiny · train b8 224" in ax.get_title()
    finally:
        plt.close(fig)


def test_memory_one_model_bars_name_the_mode(files):
    import matplotlib.pyplot as plt
    from fusebench.render.plot import make_figure
    from fusebench.results.compare import load_run
    recs = modes_run("convnext_tiny", {"eager": 100.0, "compile": 80.0}, seed=1)
    path = write_results(files["run"].parent / "one.json", recs)
    fig = make_figure([load_run(path)], "memory")
    try:
        ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
        assert ticks == ["eager", "compile"]
        assert "convnext_tiny" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_kind_is_still_accepted_for_figure(files, tmp_path):
    """--kind was the option's earlier name: scripts that use it keep working."""
    out = tmp_path / "old.png"
    res = runner.invoke(app, ["plot", str(files["run"]), "--kind", "speedup", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.stat().st_size > 0
