"""Compare records: modes within one run, or the same cells across runs.

A *cell* is a configuration (model, bench, batch, image size, layout, dtype, device, kernel shape,
...): CellSpec.cell_key(). A *variant* is what is being compared inside a cell: the mode (or
kernel impl): CellSpec.variant(). One file:
variants of each cell against the baseline mode. Several files: each (cell, variant) across the
runs, against the baseline file. Rendering lives in render/compare_table.py.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fusebench.results import items as _items, stats
from fusebench.results.env import env_differences
from fusebench.errors import UsageError
from fusebench.results.document import load_records
from fusebench.results.items import Item
from fusebench.spec import Record


# --- metrics registry --------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    name: str
    label: str                                  # column header
    unit: str
    higher_is_better: bool
    value: Callable[[Record], float | None]     # the number shown
    # the same from a checked record dict and its samples per step (results/items.py)
    from_dict: Callable[[dict[str, Any], int], float | None]
    # per-step *times* (ms) behind the value, for the bootstrap; None = no samples (no CI)
    samples: Callable[[Record], Sequence[float] | None] = lambda r: None
    timed: bool = False                         # samples are the step times (step_ms.samples)
    better: str = "faster"
    worse: str = "slower"
    scale: float = 1.0                          # display: value / scale
    fmt: str = "{:.2f}"

    def show(self, v: float | None) -> str:
        return "—" if v is None else self.fmt.format(v / self.scale)


def _step_samples(r: Record):
    return r.step_ms.samples if r.step_ms and r.step_ms.samples else None


def _throughput(r: Record) -> float | None:
    if r.throughput is not None:
        return r.throughput
    if r.step_ms and r.step_ms.median > 0:
        return r.spec.samples_per_step * 1000.0 / r.step_ms.median  # ms -> samples/s
    return None


def _throughput_d(d: dict[str, Any], per_step: int) -> float | None:
    if d.get("throughput") is not None:
        return d["throughput"]
    st = d.get("step_ms")
    return per_step * 1000.0 / st["median"] if st and st["median"] > 0 else None


def _field(*path: str) -> Callable[[dict[str, Any], int], Any]:
    """A record dict's field at `path` (None when a level is absent or null)."""
    def get(d: dict[str, Any], per_step: int) -> Any:
        for k in path:
            d = d.get(k) if d else None
        return d
    return get


METRICS: dict[str, Metric] = {
    # throughput = batch / step time, so its ratio and CI come from the step-time samples
    "throughput": Metric("throughput", "throughput", "samples/s", True, _throughput,
                         _throughput_d, _step_samples, timed=True, fmt="{:.1f}"),
    "step_ms": Metric("step_ms", "step (median)", "ms", False,
                      lambda r: r.step_ms.median if r.step_ms else None,
                      _field("step_ms", "median"), _step_samples, timed=True, fmt="{:.3f}"),
    "peak_mem": Metric("peak_mem", "peak memory", "MiB", False, lambda r: r.peak_mem_bytes,
                       _field("peak_mem_bytes"), better="less memory", worse="more memory",
                       scale=2 ** 20, fmt="{:.1f}"),
    "activation": Metric("activation", "activation memory", "MiB", False,
                         lambda r: r.activation_bytes, _field("activation_bytes"),
                         better="less memory", worse="more memory", scale=2 ** 20,
                         fmt="{:.1f}"),
    # NVML energy over the timed steps per sample (per step for kernel cells); GPU cells only
    "energy": Metric("energy", "energy per sample", "mJ", False,
                     lambda r: r.extra.get("energy_per_sample_j"),
                     _field("extra", "energy_per_sample_j"), better="less energy",
                     worse="more energy", scale=1e-3, fmt="{:.3f}"),
    "compile_s": Metric("compile_s", "compile + first call", "s", False, lambda r: r.compile_s,
                        _field("compile_s"), better="faster", worse="slower", fmt="{:.2f}"),
}


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        from fusebench.errors import unknown_name
        raise unknown_name("metric", [name], METRICS)
    return METRICS[name]


# --- cells, variants, speedup ------------------------------------------------------------------
# A record's cell and variant come from its spec: CellSpec.cell_key(), .variant(), .config_label().
def group_cells(records: Sequence[Record]) -> dict[tuple, list[Record]]:
    """Records by cell (spec.cell_key()), in first-seen order."""
    groups: dict[tuple, list[Record]] = {}
    for r in records:
        groups.setdefault(r.spec.cell_key(), []).append(r)
    return groups


def speedup(base: Record, cand: Record) -> float | None:
    """Median step time of base / of cand (stats.speedup); None unless both have times."""
    ok = base.status == "ok" and base.step_ms and cand.step_ms and cand.step_ms.median > 0
    return stats.speedup(base.step_ms.median, cand.step_ms.median) if ok else None


def _vs_baseline(records: Sequence[Record], baseline: str):
    """(index, baseline record, record) for every record whose cell has the baseline variant
    and whose speedup over it exists."""
    index = {id(r): i for i, r in enumerate(records)}
    for recs in group_cells(records).values():
        ref = next((r for r in recs if r.spec.variant() == baseline), None)
        for r in recs if ref is not None else ():
            s = speedup(ref, r)
            if s is not None:
                yield index[id(r)], ref, r, s


def speedups(records: Sequence[Record], baseline: str = "eager") -> dict[int, float]:
    """Index of each record -> its speedup over the `baseline` variant of its cell."""
    return {i: s for i, _, _, s in _vs_baseline(records, baseline)}


# --- noise: a ratio is only as good as its noisier side -----------------------------------------
def _events(r: Record):
    return ((e.category, e.message) for e in r.events)


def noise_of(r: Record) -> str | None:
    """Why this record's timing cannot be trusted, or None: a wide IQR or a busy machine
    (record.extra["contention"] judged by measure.contention, or a 'contention' event)."""
    return _items.noise(r.step_ms, r.extra.get("contention"), _events(r))


def busy_of(r: Record) -> str | None:
    """Why this record was timed on a busy machine (its contention fields or event), or None."""
    return _items.busy(r.extra.get("contention"), _events(r))


def ratio_noise(base: Record, cand: Record,
                memo: dict[int, str | None] | None = None) -> str | None:
    """'eager IQR/median 23%' for each noisy side of base vs cand, or None. memo: id(record)
    -> its noise_of, for a caller that asks about one baseline for many candidates."""
    def why(r: Record) -> str | None:
        if memo is None:
            return noise_of(r)
        if id(r) not in memo:
            memo[id(r)] = noise_of(r)
        return memo[id(r)]
    # by identity: hashing a Record hashes its whole spec, and the sides are distinct objects
    sides = (base,) if base is cand else (base, cand)
    parts = [f"{r.spec.variant()} {w}" for r in sides if (w := why(r))]
    return "; ".join(parts) or None


def noisy_speedups(records: Sequence[Record], baseline: str = "eager") -> dict[int, str]:
    """Index of each record whose speedup (see speedups) rests on a noisy side -> why."""
    out = {i: ratio_noise(ref, r) for i, ref, r, _ in _vs_baseline(records, baseline)}
    return {i: why for i, why in out.items() if why}


# --- rows --------------------------------------------------------------------------------------
@dataclass
class Row:
    model: str
    config: str
    variant: str
    run: str                      # file label (several files) or "" (one file)
    status: str
    value: float | None
    iqr: float | None = None      # in the metric's unit, for time metrics
    baseline: bool = False        # this row is the reference of its group
    ratio: stats.Ratio | None = None
    verdict: str = ""             # the sentence, or why there is none
    regression: bool = False
    noise: str | None = None      # why the ratio cannot be trusted (a noisy side), if so
    group: int = 0                # rows with the same group are compared with each other

    def to_dict(self, metric: Metric) -> dict[str, Any]:
        d = {"model": self.model, "config": self.config, "variant": self.variant,
             "run": self.run, "status": self.status, "metric": metric.name, "unit": metric.unit,
             "value": None if self.value is None else self.value / metric.scale,
             "baseline": self.baseline, "verdict": self.verdict,
             "regression": self.regression, "noise": self.noise}
        d.update(self.ratio.to_dict() if self.ratio else
                 {"gain": None, "ci_low": None, "ci_high": None, "significant": None})
        return d


@dataclass
class GeoRow:
    label: str                    # the variant (one file) or the run (several files)
    cells: int
    ratio: stats.Ratio
    verdict: str


@dataclass
class Comparison:
    metric: Metric
    axis: str                                     # what is compared: "modes" | "runs"
    baseline: str                                 # mode name or file label
    rows: list[Row] = field(default_factory=list)
    geomean: list[GeoRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)    # advice about the data, not a problem
    env_summary: str = ""
    nothing_matched: str | None = None            # several files, no cell in two: why

    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regression]


def _ratios(metric: Metric, pairs: list[tuple[Item, Item]]) -> list[stats.Ratio | None]:
    """The ratio of each (base, cand); the bootstrap CIs of a whole table in one batch."""
    out: list[stats.Ratio | None] = [None] * len(pairs)
    boot = []
    for i, (base, cand) in enumerate(pairs):
        bs, cs = base.samples, cand.samples
        if bs and cs and max(len(base.groups), len(cand.groups)) > 1:
            # --repeat: resample processes, then steps; the floor is their own spread
            out[i] = stats.speedup_ci_processes(base.groups, cand.groups)
            continue
        if bs and cs:   # samples are times: the gain is a speedup whichever way the metric reads
            boot.append((i, bs, cs))
            continue
        bv, cv = base.value, cand.value
        if bv is not None and cv is not None and bv > 0 and cv > 0:
            out[i] = stats.gain_from_values(bv, cv, metric.higher_is_better)
    for (i, _, _), r in zip(boot, stats.speedup_cis([(b, c) for _, b, c in boot])):
        out[i] = r
    return out


def _single_process_warning(pending) -> str | None:
    """Across runs, a CI from one process per side sees only within-process noise, and whole
    processes drift 20-75% on a shared machine (issue 13.4): say so once."""
    single = sum(1 for _, b, c in pending if c.samples
                 and max(len(b.groups), len(c.groups)) < 2)
    if not single:
        return None
    return (f"{single} comparison(s) rest on one worker process per side: their intervals "
            f"cannot see run-to-run drift; rerun with --repeat 3 or more")


def _apart_note(pending) -> str | None:
    """Two runs whose processes did not overlap in time: the machine's drift between them is
    in neither side's spread, so the interval is too narrow by that much (issue 13.4:
    the same cell moved 4-15% between runs a minute apart on a quiet VM, while each run's
    processes agreed). Cells of one run interleave their processes (run/schedule.py)."""
    apart = sum(1 for _, b, c in pending if b.span and c.span
                and (b.span[1] < c.span[0] or c.span[1] < b.span[0]))
    if not apart:
        return None
    return (f"{apart} comparison(s) are of runs taken at different times: a drift of the "
            f"machine between them is not in their intervals; where both sides can run in one "
            f"`fusebench run`, its cells' processes are interleaved and share the drift")


RESOLVE_GOAL = 0.10     # a change a user tuning a model wants to see


def _resolution_note(pending) -> str | None:
    """'Not significant' is only as strong as the processes' spread: when the smallest change
    these comparisons could resolve is above RESOLVE_GOAL, say by how much and how many worker
    processes would resolve it (issue 13.4: on a shared VM whole processes run 30% apart)."""
    weak = [(row, b, c) for row, b, c in pending if row.ratio is not None
            and row.ratio.has_ci and not row.ratio.significant
            and row.ratio.min_effect > RESOLVE_GOAL and len(b.groups) > 1]
    if not weak:
        return None
    row, b, c = max(weak, key=lambda t: t[0].ratio.min_effect)
    need = stats.processes_to_resolve(b.groups, c.groups, RESOLVE_GOAL)
    return (f"{len(weak)} 'not significant' comparison(s) could only resolve changes of "
            f"{row.ratio.min_effect:.0%} or more (worst: {row.model} {row.variant}; the "
            f"spread between its worker processes); about --repeat {need} per side would "
            f"resolve {RESOLVE_GOAL:.0%}")


def _row(metric: Metric, r: Item, run: str, group: int) -> Row:
    ok = r.status == "ok"
    iqr = r.iqr if ok and metric.name == "step_ms" else None
    return Row(r.subject, r.config, r.variant, run, r.status, r.value if ok else None, iqr,
               group=group)


def _judge(row: Row, base: Item, cand: Item, fail_pct: float | None,
           failure_regresses: bool = False) -> bool:
    """Fill row.verdict/regression for a failed side; True: both ran, the ratio is pending
    (_judge_ratios fills it, for the whole table at once)."""
    if base.status != "ok":
        row.verdict = f"baseline {base.status}"
        return False
    if cand.status != "ok":
        row.verdict = cand.status
        # across runs, a cell that worked in the baseline and fails now is the worst
        # regression of all ("unavailable" is the machine, not the code)
        row.regression = (fail_pct is not None and failure_regresses
                          and cand.status != "unavailable")
        return False
    return True


def _item_noise(base: Item, cand: Item) -> str | None:
    """ratio_noise of two Items: 'eager IQR/median 23%' for each noisy side, or None."""
    sides = (base,) if base is cand else (base, cand)
    return "; ".join(f"{r.variant} {r.noise}" for r in sides if r.noise) or None


def _judge_ratios(metric: Metric, pending: list[tuple[Row, Item, Item]],
                  fail_pct: float | None) -> None:
    """Fill row.ratio/verdict/regression for every (row, base, cand) whose sides both ran."""
    for (row, base, cand), ratio in zip(pending,
                                        _ratios(metric, [(b, c) for _, b, c in pending])):
        row.ratio = ratio
        if ratio is None:
            row.verdict = f"no {metric.label}"
            continue
        row.verdict = stats.describe(ratio, metric.better, metric.worse)
        if cand.samples:
            row.noise = _item_noise(base, cand)
        if fail_pct is not None:
            worse = ratio.gain < 1.0 and ratio.significant
            row.regression = worse and stats.loss_pct(ratio) > fail_pct


def _with_ci(row: Row) -> None:
    """'not significant' -> '1.02x (0.97–1.08) not significant': the ratio and its CI too."""
    r = row.ratio
    if r is not None and r.has_ci and row.verdict == "not significant":
        row.verdict = f"{r.gain:.2f}x ({r.low:.2f}–{r.high:.2f}) not significant"


def _geomeans(metric: Metric, rows: list[Row], label_of: Callable[[Row], str]) -> list[GeoRow]:
    by: dict[str, list[stats.Ratio]] = {}
    for r in rows:
        if r.ratio is not None and not r.baseline:
            by.setdefault(label_of(r), []).append(r.ratio)
    out = []
    for label, ratios in by.items():
        g = stats.geomean_ratio(ratios)
        out.append(GeoRow(label, len(ratios), g, stats.describe(g, metric.better, metric.worse)))
    return out


def compare_modes(records: list[Record], metric: Metric, baseline: str | None = None,
                  fail_pct: float | None = None) -> Comparison:
    """One run: every variant of each cell vs the baseline variant (default: eager)."""
    return compare_items(_items_of(records, metric), metric, baseline, fail_pct)


def _items_of(records: Sequence[Record], metric: Metric) -> list[Item]:
    return [_items.from_record(r, metric) for r in records]


def compare_items(items: list[Item], metric: Metric, baseline: str | None = None,
                  fail_pct: float | None = None) -> Comparison:
    """compare_modes of records read as Items (results/items.py)."""
    groups: dict[tuple, list[Item]] = {}
    for r in items:
        groups.setdefault(r.key, []).append(r)
    names = {r.variant for r in items}
    base = baseline or ("eager" if "eager" in names else _first_variant(items))
    if baseline and baseline not in names:
        from fusebench.errors import unknown_name
        raise unknown_name("baseline mode", [baseline], names)
    cmp = Comparison(metric, "modes", base)
    pending = []
    for gi, recs in enumerate(groups.values()):
        ref = next((r for r in recs if r.variant == base), None)
        # baseline first, then the others in file order
        for r in ([ref] + [x for x in recs if x is not ref]) if ref is not None else recs:
            row = _row(metric, r, "", gi)
            if r is ref:
                row.baseline, row.verdict = True, "baseline"
            elif ref is None:
                row.verdict = f"no {base} in this cell"
            elif _judge(row, ref, r, fail_pct):
                pending.append((row, ref, r))
            cmp.rows.append(row)
    _judge_ratios(metric, pending, fail_pct)
    for row in cmp.rows:
        _with_ci(row)   # one file: the reader asked for the ratios themselves
    settings = _settings_warning(groups.values())
    if settings:
        cmp.warnings.append(settings)
    cmp.geomean = _geomeans(metric, cmp.rows, lambda r: r.variant)
    return cmp


def _first_variant(items: list[Item]) -> str:
    if not items:
        raise UsageError("no records to compare")
    return items[0].variant


@dataclass
class Run:
    label: str
    env: dict[str, Any]
    records: list[Record]


def _name(r: Item) -> str:
    return f"{r.subject} {r.config} {r.variant}"


def load_run(path: str | Path, label: str | None = None) -> Run:
    doc, records = load_records(path)   # type-checked, every record parsed once
    return Run(label or Path(path).name, doc.get("env") or {}, records)


def load_items(path: str | Path, metric: Metric) -> tuple[dict[str, Any], list[Item]]:
    """The document's metadata (everything but its records) and its records as Items. A
    current-layout file is read straight from its checked dicts (results/items.py), dropped
    as they are read; any other goes through its Records."""
    from fusebench.results.document import load_exact
    doc = load_exact(path)
    if doc is None:
        doc, records = load_records(path)
        return doc, _items_of(records, metric)
    dicts = doc.pop("records")
    return doc, _items.from_dicts(dicts, metric)


def labels_for(paths: Sequence[str | Path]) -> list[str]:
    """File names, or parent/name when two files share a name."""
    names = [Path(p).name for p in paths]
    if len(set(names)) == len(names):
        return names
    return [str(Path(p)) for p in paths]


def compare_runs(runs: list[Run], metric: Metric, fail_pct: float | None = None) -> Comparison:
    """Several runs: each (cell, variant) matched across runs, vs runs[0]."""
    base = runs[0]
    cmp = Comparison(metric, "runs", base.label)
    for other in runs[1:]:
        diffs = env_differences(base.env, other.env)
        if diffs:
            cmp.warnings.append(f"environments differ ({base.label} vs {other.label}): "
                                + "; ".join(diffs))
    index: list[dict[tuple, Item]] = []
    for run in runs:
        idx: dict[tuple, Item] = {}
        for r in _items_of(run.records, metric):
            k = (r.key, r.variant)
            if k in idx:
                cmp.warnings.append(f"{run.label}: duplicate cell {_name(r)}; using the last one")
            idx[k] = r
        index.append(idx)
    keys = list(dict.fromkeys(k for idx in index for k in idx))  # first-seen order
    if keys and not any(sum(k in idx for idx in index) > 1 for k in keys):
        cmp.nothing_matched = _no_match(runs, index)   # one line, not a warning per cell
        return cmp
    gi = 0
    pending = []
    for k in keys:
        present = [(run, idx[k]) for run, idx in zip(runs, index) if k in idx]
        if len(present) < 2:
            run, r = present[0]
            cmp.warnings.append(f"only in {run.label}: {_name(r)}")
            continue
        ref = index[0].get(k)
        for run, r in present:
            row = _row(metric, r, run.label, gi)
            if run is base:
                row.baseline, row.verdict = True, "baseline"
            elif ref is None:
                row.verdict = f"not in {base.label}"
            elif _judge(row, ref, r, fail_pct, failure_regresses=True):
                pending.append((row, ref, r))
            cmp.rows.append(row)
        gi += 1
    _judge_ratios(metric, pending, fail_pct)
    for why in (_single_process_warning(pending), _resolution_note(pending),
                _apart_note(pending)):
        if why:
            cmp.notes.append(why)
    settings = _settings_warning([idx[k] for idx in index if k in idx] for k in keys)
    if settings:
        cmp.warnings.append(settings)
    cmp.geomean = _geomeans(metric, cmp.rows, lambda r: r.run)
    return cmp


def _settings_warning(groups: Iterable[Sequence[Item]]) -> str | None:
    """One line when items compared with each other ran under different run settings (threads,
    heap policy): their ratios then measure the setting as well as the mode or the change."""
    differ: dict[tuple[str, tuple], int] = {}
    for items in groups:
        values: dict[str, set] = {}
        for it in items:
            for name, v in it.settings:
                values.setdefault(name, set()).add("default" if v is None else str(v))
        for name, vs in values.items():
            if len(vs) > 1:
                k = (name, tuple(sorted(vs)))
                differ[k] = differ.get(k, 0) + 1
    if not differ:
        return None
    parts = [f"{name} {' vs '.join(vs)} ({n} cell{'s' if n > 1 else ''})"
             for (name, vs), n in differ.items()]
    return "compared records ran under different settings: " + "; ".join(parts)


def _no_match(runs: list[Run], index: list[dict[tuple, Item]]) -> str:
    """'no cell is in two files: a.json has convnext_tiny train b8 224 (+1 more); ...'"""
    def cells(run: Run, idx: dict[tuple, Item]) -> str:
        names = list(dict.fromkeys(f"{r.subject} {r.config}" for r in idx.values()))
        more = f" (+{len(names) - 2} more)" if len(names) > 2 else ""
        return f"{run.label} has {', '.join(names[:2]) or 'no records'}{more}"
    return ("nothing to compare: no cell (model, config, mode) is in two of the files; "
            + "; ".join(cells(run, idx) for run, idx in zip(runs, index)))


def compare_files(paths: Sequence[str | Path], metric: str = "throughput",
                  baseline: str | None = None, fail_pct: float | None = None) -> Comparison:
    """The whole compare command minus rendering. baseline: a mode (one file) or a file
    (several files; one of the given files, or an extra file to compare them against)."""
    from fusebench.results.bulk import paused_gc
    with paused_gc():
        return _compare_files(paths, metric, baseline, fail_pct)


def _compare_files(paths: Sequence[str | Path], metric: str, baseline: str | None,
                   fail_pct: float | None) -> Comparison:
    from fusebench.results.env import env_summary

    m = get_metric(metric)
    if fail_pct is not None and (math.isnan(fail_pct) or fail_pct < 0):
        raise UsageError(f"--fail-on-regression must be a percentage >= 0, got {fail_pct}")
    paths = list(paths)
    if not paths:
        raise UsageError("compare needs at least one results file")
    if len(paths) == 1:
        doc, items = load_items(paths[0], m)
        cmp = compare_items(items, m, baseline, fail_pct)
        cmp.env_summary = env_summary(doc.get("env") or {})
        return cmp
    if baseline is not None:
        resolved = [Path(p).resolve() for p in paths]
        b = Path(baseline).resolve()
        if b in resolved:
            paths.insert(0, paths.pop(resolved.index(b)))
        elif Path(baseline).is_file() or not Path(baseline).suffix == "":
            paths.insert(0, baseline)  # load() reports a missing file as one line
        else:
            raise UsageError(f"--baseline '{baseline}': with several files the baseline is a "
                             f"results file, not a mode")
    runs = [load_run(p, lab) for p, lab in zip(paths, labels_for(paths))]
    cmp = compare_runs(runs, m, fail_pct)
    cmp.env_summary = env_summary(runs[0].env)
    return cmp
