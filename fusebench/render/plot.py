"""Figures from results files: one function per figure, kept in PLOTS. Headless (Agg).

Every figure has a title, axis labels with units and the environment in a footnote; it is written
to a temp file in the target folder and renamed, so a failed plot never leaves half a file.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on benchmark machines; set before pyplot import
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fusebench.results import compare as C  # noqa: E402
from fusebench.results.env import env_differences, env_summary  # noqa: E402
from fusebench.errors import UsageError  # noqa: E402
from fusebench.render.escape import PLOT_TEXT_RC, printable  # noqa: E402
from fusebench.render.names import display_name  # noqa: E402
from fusebench.spec import Record  # noqa: E402

FORMATS = (".png", ".svg", ".pdf")
DPI = 150  # crisp enough for slides, small enough to paste in an issue


# --- shared pieces ------------------------------------------------------------------------------
def _ok(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if r.status == "ok"]


def _cell_name(r: Record, many_configs: bool) -> str:
    name = display_name(r.spec.subject)
    return f"{name}\n{r.spec.config_label()}" if many_configs else name


def _many_configs(recs: Sequence[Record]) -> bool:
    """More than one configuration (apart from the model): then labels name the config."""
    return len({r.spec.config_label() for r in recs}) > 1


def _footnote(fig, runs: Sequence[C.Run]) -> None:
    text = env_summary(runs[0].env)
    if len(runs) > 1 and any(env_differences(runs[0].env, r.env) for r in runs[1:]):
        text += "  (runs differ in environment: see fusebench compare)"
    fig.text(0.01, 0.01, printable(text), fontsize=7, color="0.35", ha="left", va="bottom",
             wrap=True)


def _grouped_bars(ax, groups: list[str], series: dict[str, dict[str, float]],
                  err: dict[str, dict[str, tuple[float, float]]] | None = None,
                  styles: "SeriesStyles | None" = None) -> None:
    """Bars: one group per x label, one bar per series; err gives (low, high) whisker ends.
    styles: a colour per mode and a hatch per file, with a legend of those (no empty slots)."""
    names = list(series)
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(groups))
    for i, name in enumerate(names):
        ys = np.array([series[name].get(g, np.nan) for g in groups], dtype=float)
        pos = x - 0.4 + width * (i + 0.5)
        yerr = None
        if err is not None:
            lo = np.array([err[name].get(g, (np.nan, np.nan))[0] for g in groups], dtype=float)
            hi = np.array([err[name].get(g, (np.nan, np.nan))[1] for g in groups], dtype=float)
            yerr = np.vstack([np.clip(ys - lo, 0, None), np.clip(hi - ys, 0, None)])
            yerr = np.nan_to_num(yerr)
        kw = styles.bar(name) if styles else {"label": printable(name)}
        have = np.isfinite(ys)     # a mode missing from a cell: no bar, no whisker at 0
        ax.bar(pos[have], ys[have], width, yerr=None if yerr is None else yerr[:, have],
               capsize=3 if yerr is not None else 0, error_kw={"elinewidth": 1}, **kw)
    ax.set_xticks(x, [printable(g) for g in groups], fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    if styles:
        ax.legend(handles=styles.handles(), fontsize=8)
    elif len(names) > 1:
        ax.legend(fontsize=8)


HATCHES = ("", "//", "..", "xx", "\\\\", "oo")   # one per file, after the first (plain)


class SeriesStyles:
    """Series named 'mode · file': one colour per mode in every file, one hatch per file."""

    def __init__(self, keys: dict[str, tuple[str, str]]):
        self.keys = keys                                    # series name -> (mode, file)
        modes = list(dict.fromkeys(m for m, _ in keys.values()))
        files = list(dict.fromkeys(f for _, f in keys.values()))
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        self.colour = {m: colours[i % len(colours)] for i, m in enumerate(modes)}
        self.hatch = {f: HATCHES[i % len(HATCHES)] for i, f in enumerate(files)}

    def bar(self, name: str) -> dict:
        mode, file = self.keys[name]
        return {"color": self.colour[mode], "hatch": self.hatch[file], "edgecolor": "0.2",
                "linewidth": 0.5}

    def handles(self) -> list:
        from matplotlib.patches import Patch
        out = [Patch(facecolor=c, edgecolor="0.2", label=printable(m)) for m, c in self.colour.items()]
        if len(self.hatch) > 1:
            out += [Patch(facecolor="white", edgecolor="0.2", hatch=h, label=printable(f))
                    for f, h in self.hatch.items()]
        return out


def _label(run: C.Run, many_runs: bool, name: str) -> str:
    return f"{name} · {run.label}" if many_runs else name


# --- figures ------------------------------------------------------------------------------------
def plot_speedup(ax, runs: Sequence[C.Run]) -> str:
    """Per-model grouped bars of each mode's speedup over eager, 95% CI whiskers, line at 1."""
    series: dict[str, dict[str, float]] = {}
    err: dict[str, dict[str, tuple[float, float]]] = {}
    groups: list[str] = []
    baseline = None
    keys: dict[str, tuple[str, str]] = {}
    for run in runs:
        recs = run.records
        many_cfg = _many_configs(recs)
        cmp = C.compare_modes(recs, C.METRICS["throughput"])
        baseline = cmp.baseline
        for row in cmp.rows:
            if row.baseline or row.ratio is None:
                continue
            g = f"{display_name(row.model)}\n{row.config}" if many_cfg else display_name(row.model)
            if g not in groups:
                groups.append(g)
            name = _label(run, len(runs) > 1, row.variant)
            keys[name] = (row.variant, run.label)
            series.setdefault(name, {})[g] = row.ratio.gain
            lo = row.ratio.low if row.ratio.has_ci else row.ratio.gain
            hi = row.ratio.high if row.ratio.has_ci else row.ratio.gain
            err.setdefault(name, {})[g] = (lo, hi)
    if not groups:
        raise UsageError("nothing to plot: no mode with a successful baseline to compare to")
    styles = SeriesStyles(keys)
    _grouped_bars(ax, groups, series, err, styles)
    line = ax.axhline(1.0, color="black", lw=1, ls="--", label=f"{baseline} (1.0)")
    ax.legend(handles=[*styles.handles(), line], fontsize=8)
    ax.set_ylabel(f"speedup over {baseline} (x, higher is better)")
    ax.set_xlabel("model")
    return f"Speedup over {baseline} (bars: median ratio, whiskers: 95% bootstrap CI)"


def plot_throughput(ax, runs: Sequence[C.Run]) -> str:
    """Bars per cell: throughput of each mode, whiskers p10–p90 of per-step throughput."""
    series: dict[str, dict[str, float]] = {}
    err: dict[str, dict[str, tuple[float, float]]] = {}
    groups: list[str] = []
    keys: dict[str, tuple[str, str]] = {}
    for run in runs:
        recs = _ok(run.records)
        many_cfg = _many_configs(recs)
        for r in recs:
            tp = C.METRICS["throughput"].value(r)
            if tp is None:
                continue
            g = _cell_name(r, many_cfg)
            if g not in groups:
                groups.append(g)
            name = _label(run, len(runs) > 1, r.spec.variant())
            keys[name] = (r.spec.variant(), run.label)
            series.setdefault(name, {})[g] = tp
            if r.step_ms:  # slow steps (p90) give low throughput
                n = r.spec.samples_per_step
                err.setdefault(name, {})[g] = (n * 1000.0 / r.step_ms.p90,
                                               n * 1000.0 / r.step_ms.p10)
    if not groups:
        raise UsageError("nothing to plot: no successful record with a throughput")
    for name in series:
        err.setdefault(name, {})
    _grouped_bars(ax, groups, series, err, SeriesStyles(keys))
    ax.set_ylabel("throughput (samples/s, higher is better)")
    ax.set_xlabel("cell")
    return "Throughput per cell (whiskers: p10–p90 of steps)"


def plot_memory(ax, runs: Sequence[C.Run]) -> str:
    """Bars per cell and mode: peak memory and activation memory side by side (MiB)."""
    groups: list[str] = []
    series: dict[str, dict[str, float]] = {"peak memory": {}, "activation memory": {}}
    for run in runs:
        recs = _ok(run.records)
        many_cfg = _many_configs(recs)
        one_cell = not many_cfg and len({r.spec.subject for r in recs}) == 1
        for r in recs:
            if r.peak_mem_bytes is None and r.activation_bytes is None:
                continue
            # one model and config: it is in the title, the bar says only the mode
            cell = _cell_name(r, many_cfg)
            what = r.spec.variant() if one_cell else f"{cell}\n{r.spec.variant()}"
            g = _label(run, len(runs) > 1, what)
            groups.append(g)
            if r.peak_mem_bytes is not None:
                series["peak memory"][g] = r.peak_mem_bytes / 2 ** 20
            if r.activation_bytes is not None:
                series["activation memory"][g] = r.activation_bytes / 2 ** 20
    if not groups:
        raise UsageError("nothing to plot: no successful record with memory measurements")
    _grouped_bars(ax, groups, series)
    ax.legend(fontsize=8)
    ax.set_ylabel("memory (MiB, lower is better)")
    ax.set_xlabel("cell / mode")
    return "Peak and activation memory"


def _image_size(r: Record) -> int | None:
    return r.spec.model.img_size if r.spec.model is not None else r.spec.kernel.shape[2]


def _channels(r: Record) -> int | None:
    return r.spec.kernel.shape[1] if r.spec.kernel is not None else None


@dataclass(frozen=True)
class SweepAxis:
    name: str
    label: str
    value: Callable[[Record], float | None]


@dataclass(frozen=True)
class SweepPoint:
    x: float
    y: float
    lo: float           # p10-p90 band of the metric
    hi: float


# Sweep axes, in the order they are tried (a kernel's N is its batch, H its image size).
_SWEEP_AXES = (SweepAxis("batch", "batch size", lambda r: r.spec.samples_per_step),
               SweepAxis("img", "image size (px)", _image_size),
               SweepAxis("channels", "channels", _channels))


def _sweep_metric(recs: list[Record]):
    """(label, value, (low, high)) for the y axis: GB/s for kernels, throughput for models."""
    if all(r.spec.kernel is not None and "gbps" in r.extra for r in recs):
        def val(r):
            g = float(r.extra["gbps"])
            s = r.step_ms  # bandwidth ~ 1/time: scale the band by the time quantiles
            return g, ((g * s.median / s.p90, g * s.median / s.p10) if s else (g, g))
        return "bandwidth (GB/s, higher is better)", val

    def val(r):
        tp = C.METRICS["throughput"].value(r)
        s = r.step_ms
        n = r.spec.samples_per_step
        band = (n * 1000.0 / s.p90, n * 1000.0 / s.p10) if s else (tp, tp)
        return tp, band
    return "throughput (samples/s, higher is better)", val


def plot_sweep(ax, runs: Sequence[C.Run]) -> str:
    """A metric vs the swept axis, one line per mode/impl, p10–p90 band."""
    recs_all = [(run, r) for run in runs for r in _ok(run.records)]
    if not recs_all:
        raise UsageError("nothing to plot: no successful records")
    axis = next((a for a in _SWEEP_AXES
                 if len({a.value(r) for _, r in recs_all} - {None}) > 1), None)
    if axis is None:
        raise UsageError("nothing to sweep: batch size, image size and channels are the same "
                         "in every record")
    xlabel, get = axis.label, axis.value
    ylabel, val = _sweep_metric([r for _, r in recs_all])
    lines: dict[str, list[SweepPoint]] = {}
    many_models = len({r.spec.subject for _, r in recs_all}) > 1
    for run, r in recs_all:
        x = get(r)
        y, (lo, hi) = val(r)
        if x is None or y is None:
            continue
        name = r.spec.variant()
        name = f"{display_name(r.spec.subject)}/{name}" if many_models else name
        lines.setdefault(_label(run, len(runs) > 1, name), []).append(
            SweepPoint(x, y, lo, hi))
    for name, pts in lines.items():
        pts.sort(key=lambda p: p.x)
        xs, ys, lo, hi = (np.array([getattr(p, f) for p in pts], dtype=float)
                          for f in ("x", "y", "lo", "hi"))
        (line,) = ax.plot(xs, ys, marker="o", ms=4, label=printable(name))
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, lw=0)
    if max(len({p.x for p in pts}) for pts in lines.values()) > 2:
        xs_all = sorted({p.x for pts in lines.values() for p in pts})
        if xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 8:
            ax.set_xscale("log", base=2)  # batch/size sweeps are usually powers of two
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return f"Sweep over {xlabel} (band: p10–p90 of steps)"


PLOTS: dict[str, Callable] = {
    "speedup": plot_speedup,
    "throughput": plot_throughput,
    "memory": plot_memory,
    "sweep": plot_sweep,
}


# --- entry point --------------------------------------------------------------------------------
def _shared_config(runs: Sequence[C.Run]) -> str:
    """What every record shares, for the title: 'convnext_tiny · train b8 224 fp32 cpu'."""
    recs = [r for run in runs for r in run.records]
    models = {display_name(r.spec.subject) for r in recs}
    configs = {r.spec.config_label() for r in recs}
    parts = [models.pop()] if len(models) == 1 else []
    return " · ".join(parts + ([configs.pop()] if len(configs) == 1 else []))


def check_output(out: str | Path) -> Path:
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"plot output '{out}': unsupported extension "
                         f"'{out.suffix or '(none)'}'; use one of {', '.join(FORMATS)}")
    return out


def make_figure(runs: Sequence[C.Run], figure: str):
    if figure not in PLOTS:
        from fusebench.errors import unknown_name
        raise unknown_name("figure", [figure], PLOTS)
    fig, ax = plt.subplots(figsize=(9, 5.2))
    try:
        title = PLOTS[figure](ax, runs)
        shared = _shared_config(runs)
        ax.set_title(printable(f"{title}\n{shared}" if shared else title), fontsize=11)
        n_groups = len(ax.get_xticks())
        if figure != "sweep" and n_groups > 4:
            plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
        fig.tight_layout(rect=(0, 0.05, 1, 1))  # leave room for the footnote
        _footnote(fig, runs)
    except BaseException:
        plt.close(fig)
        raise
    return fig


def save_figure(fig, out: Path) -> Path:
    """Temp file in the same folder, then rename: never a half-written plot."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=DPI, format=out.suffix.lstrip(".").lower())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a plot is meant to be shared
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def plot_files(paths: Sequence[str | Path], figure: str, out: str | Path) -> Path:
    out = check_output(out)   # before loading anything: bad input fails fast
    paths = list(paths)
    runs = [C.load_run(p, lab) for p, lab in zip(paths, C.labels_for(paths))]
    with matplotlib.rc_context(PLOT_TEXT_RC):   # record text is never mathtext
        fig = make_figure(runs, figure)
    return save_figure(fig, out)
