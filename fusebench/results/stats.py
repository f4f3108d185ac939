"""Statistics for compare: bootstrap CI of a ratio of medians, the sentence it reads as, and the
geometric mean over cells.

Convention: a *gain* is "how many times better the candidate is than the baseline"; > 1 is
better. For times, gain = median(baseline) / median(candidate), i.e. the speedup.
"""
from __future__ import annotations

import functools
import math
import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SEED = 20240611          # fixed: the same files always give the same intervals
N_RESAMPLES = 2000       # percentile error of a 95% interval ~0.5% of its width at 2000
# a table of 50,000 cells x 2000 resamples is 10^8 replicates: above BIG_TABLE cells compare
# draws 500 (~1% of the width), which keeps 100,000 records within seconds
BIG_TABLE = 2000
N_RESAMPLES_BIG = 500
CONFIDENCE = 0.95
# Smallest change we call significant even when the CI excludes 1: the bootstrap only sees noise
# *within* a run, while separate runs (and the cells of one table, tested many at once) drift
# (docs/figures.md). Below this an A/A comparison would "find" differences.
MIN_EFFECT = 0.02


# The standard normal's CDF and its inverse, elementwise, from math and statistics: BCa needs
# only these two, and importing scipy.special for them cost ~0.4 CPU-seconds and ~23 MiB of
# every `compare` (issue 14.7). Same edge values as scipy's ndtr/ndtri: ndtri(0) = -inf,
# ndtri(1) = inf, NaN (or p outside [0, 1]) gives NaN.
_ERFC = np.frompyfunc(math.erfc, 1, 1)
_INV_CDF = statistics.NormalDist().inv_cdf


def _inv_cdf(p: float) -> float:
    if 0.0 < p < 1.0:
        return _INV_CDF(p)
    return -math.inf if p == 0.0 else math.inf if p == 1.0 else math.nan


_INV = np.frompyfunc(_inv_cdf, 1, 1)


def ndtr(x) -> np.ndarray:
    """P(Z <= x), Z standard normal (erfc keeps the far left tail accurate)."""
    with np.errstate(invalid="ignore"):
        return 0.5 * np.asarray(_ERFC(np.asarray(x, dtype=float) * -math.sqrt(0.5)),
                                dtype=float)


def ndtri(p) -> np.ndarray:
    """x with ndtr(x) = p."""
    with np.errstate(invalid="ignore"):
        return np.asarray(_INV(np.asarray(p, dtype=float)), dtype=float)


_Z_TAILS = ndtri(np.array([(1 - CONFIDENCE) / 2, (1 + CONFIDENCE) / 2]))


@dataclass(frozen=True)
class Ratio:
    """A gain with its confidence interval. low/high are None when there were no samples."""
    gain: float
    low: float | None = None
    high: float | None = None
    # bootstrap distribution of the gain (an array, or a BootDist that regenerates it), kept
    # for the geometric-mean interval; not serialised, not compared
    dist: Any = field(default=None, compare=False, repr=False)
    # smallest change called significant; larger than MIN_EFFECT when separate worker processes
    # of the same cell disagreed by more than that (see speedup_ci_processes)
    min_effect: float = MIN_EFFECT

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def significant(self) -> bool:
        """CI excludes 1.0 and the change is at least MIN_EFFECT. Without a CI (deterministic
        metrics such as memory) any difference counts."""
        if not self.has_ci:
            return self.gain != 1.0
        big_enough = abs(math.log(self.gain)) >= math.log1p(self.min_effect)
        return big_enough and (self.low > 1.0 or self.high < 1.0)

    def to_dict(self) -> dict:
        return {"gain": self.gain, "ci_low": self.low, "ci_high": self.high,
                "significant": self.significant}


def speedup(baseline_ms, candidate_ms):
    """The one speedup formula: baseline time / candidate time (> 1: the candidate is faster).
    Works on floats and on numpy arrays (the bootstrap's resamples)."""
    return baseline_ms / candidate_ms


def _ratio_of_medians(x, y, axis=-1):
    # x: baseline samples, y: candidate samples (times) -> speedup of y over x
    return speedup(np.median(x, axis=axis), np.median(y, axis=axis))


@functools.lru_cache(maxsize=64)
def _median_ranks(n: int, n_resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """For n_resamples bootstrap resamples of n values: the two sorted positions whose mean is
    each resample's median. A resample of sorted data is sorted when its indices are, so one
    draw of sorted indices serves every sample of size n: a cell's bootstrap medians are then
    two gathers, not 2000 medians (100,000-record files compare in seconds)."""
    idx = np.random.default_rng((seed, n)).integers(0, n, size=(n_resamples, n))
    idx.sort(axis=1)
    return idx[:, (n - 1) // 2].copy(), idx[:, n // 2].copy()


@functools.lru_cache(maxsize=64)
def _jackknife_ranks(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The two positions (in the sorted sample) averaging to the median of the sample without
    value i, for each i: leaving one value out of sorted data keeps it sorted."""
    keep = np.broadcast_to(np.arange(n), (n, n))[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    return keep[:, (n - 2) // 2].copy(), keep[:, (n - 1) // 2].copy()


def _sorted_median(xs: np.ndarray) -> float:
    return (xs[(xs.size - 1) // 2] + xs[xs.size // 2]) * 0.5


def _boot_medians(xs: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    lo, hi = _median_ranks(xs.size, n_resamples, seed)
    return (xs[lo] + xs[hi]) * 0.5


def _jackknife_medians(xs: np.ndarray) -> np.ndarray:
    lo, hi = _jackknife_ranks(xs.size)
    return (xs[lo] + xs[hi]) * 0.5


def _quantiles(values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """np.quantile's linear method via one partition (this runs once per table row)."""
    pos = q * (values.size - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, values.size - 1)
    part = np.partition(values, np.unique(np.concatenate([lo, hi])))
    return part[lo] + (part[hi] - part[lo]) * (pos - lo)


class BootDist:
    """A cell's bootstrap distribution of the gain, regenerated on demand from the two sorted
    samples (a few hundred bytes) instead of kept as 2000 floats per table row."""
    __slots__ = ("xs", "ys", "n_resamples", "seed")

    def __init__(self, xs: np.ndarray, ys: np.ndarray, n_resamples: int, seed: int):
        self.xs, self.ys, self.n_resamples, self.seed = xs, ys, n_resamples, seed

    def __len__(self) -> int:
        return self.n_resamples

    def values(self) -> np.ndarray:
        """The replicates in rank order (what an interval needs)."""
        return speedup(_boot_medians(self.xs, self.n_resamples, self.seed),
                       _boot_medians(self.ys, self.n_resamples, self.seed + 1))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        # the same rank draws serve every cell: rotate the replicates by an offset taken from
        # the cell's data, so replicate r of two cells comes from independent draws when the
        # geometric mean combines them (the draws are iid, a rotation is as good as a shuffle)
        d = np.roll(self.values(), zlib.crc32(self.xs.tobytes() + self.ys.tobytes()))
        return d if dtype is None else d.astype(dtype)


def _bca_levels(dist: np.ndarray, gain: float, xs: np.ndarray, ys: np.ndarray):
    """BCa's adjusted percentile levels (Efron): bias from where the estimate sits in the
    bootstrap distribution, acceleration from the jackknife of each sample."""
    z0 = ndtri(((dist < gain).mean() + (dist <= gain).mean()) / 2)
    jack = [speedup(_jackknife_medians(xs), _sorted_median(ys)),
            speedup(_sorted_median(xs), _jackknife_medians(ys))]
    u = [(j.size - 1) * (j.mean() - j) for j in jack]
    num = sum((ui ** 3).sum() / ui.size ** 3 for ui in u)
    den = sum((ui ** 2).sum() / ui.size ** 2 for ui in u) ** 1.5
    a = num / den / 6 if den > 0 else 0.0
    z = _Z_TAILS
    return ndtr(z0 + (z0 + z) / (1 - a * (z0 + z)))


def speedup_ci(baseline: Sequence[float], candidate: Sequence[float], *,
               n_resamples: int = N_RESAMPLES, seed: int = SEED,
               method: str = "BCa") -> Ratio:
    """Ratio median(baseline)/median(candidate) with a 95% bootstrap CI (independent samples).

    BCa corrects the skew a ratio of medians has; if it cannot (degenerate data, too few
    samples) the percentile interval is used instead."""
    x = np.sort(np.asarray(baseline, dtype=float))
    y = np.sort(np.asarray(candidate, dtype=float))
    if x.size == 0 or y.size == 0:
        raise ValueError("speedup_ci needs samples on both sides")
    gain = float(speedup(_sorted_median(x), _sorted_median(y)))
    if x.size < 2 or y.size < 2:
        return Ratio(gain)
    if x[0] == x[-1] and y[0] == y[-1]:
        # identical samples on each side: no spread to resample, the interval is the point
        return Ratio(gain, gain, gain, np.full(n_resamples, gain))
    dist = BootDist(x, y, n_resamples, seed)
    values = dist.values()
    alpha = (1 - CONFIDENCE) / 2
    levels = {"percentile": lambda: np.array([alpha, 1 - alpha])}
    levels["BCa"] = lambda: _bca_levels(values, gain, x, y)
    for m in dict.fromkeys((method, "percentile")):
        with np.errstate(all="ignore"):
            q = levels[m]()
        if np.isfinite(q).all():
            lo, hi = _quantiles(values, q)
            if math.isfinite(lo) and math.isfinite(hi):
                return Ratio(gain, float(lo), float(hi), dist)
    return Ratio(gain)


def speedup_cis(pairs: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                n_resamples: int | None = None, seed: int = SEED,
                chunk: int = 256) -> list[Ratio]:
    """speedup_ci (BCa) of many cells at once, vectorised over the cells whose samples have
    the same sizes: the same intervals, without ~30 numpy calls per table row. Tables of more
    than BIG_TABLE cells use N_RESAMPLES_BIG resamples (default n_resamples=None)."""
    if n_resamples is None:
        n_resamples = N_RESAMPLES if len(pairs) <= BIG_TABLE else N_RESAMPLES_BIG
    out: list[Ratio | None] = [None] * len(pairs)
    for idx, X, Y in _sorted_groups(pairs):
        if X.shape[1] < 2 or Y.shape[1] < 2:
            edge = np.ones(len(idx), dtype=bool)
        else:   # identical samples on each side: speedup_ci's point interval
            edge = (X[:, 0] == X[:, -1]) & (Y[:, 0] == Y[:, -1])
        for j in np.flatnonzero(edge).tolist():        # the edge cases, one by one
            out[idx[j]] = speedup_ci(X[j], Y[j], n_resamples=n_resamples, seed=seed)
        rest = np.flatnonzero(~edge)
        for k in range(0, len(rest), chunk):
            part = rest[k:k + chunk]
            res = _bca_batch(X[part], Y[part], n_resamples, seed)
            finite = np.isfinite(res).all(axis=1).tolist()      # one call per chunk, not cell
            for j, r, ok in zip(part.tolist(), res.tolist(), finite):
                xs, ys = X[j], Y[j]
                out[idx[j]] = (Ratio(*r, BootDist(xs, ys, n_resamples, seed)) if ok
                               else speedup_ci(xs, ys, n_resamples=n_resamples, seed=seed))
    return out  # type: ignore[return-value]


def _sorted_groups(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]):
    """(indices, sorted baselines, sorted candidates) of the pairs of each pair of sample
    sizes: one (cells, n) array a side, sorted along its rows, not one numpy call per sample."""
    by_size: dict[tuple[int, int], list[int]] = {}
    for i, (x, y) in enumerate(pairs):
        by_size.setdefault((len(x), len(y)), []).append(i)
    for (nx, ny), idx in by_size.items():
        X = np.array([pairs[i][0] for i in idx], dtype=float).reshape(len(idx), nx)
        Y = np.array([pairs[i][1] for i in idx], dtype=float).reshape(len(idx), ny)
        X.sort(axis=1)
        Y.sort(axis=1)
        yield idx, X, Y


def _bca_batch(X: np.ndarray, Y: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(cells, 3): gain, BCa low, BCa high for sorted samples X (cells, nx), Y (cells, ny)."""
    med = lambda A: (A[:, (A.shape[1] - 1) // 2] + A[:, A.shape[1] // 2]) * 0.5  # noqa: E731
    mx, my = med(X), med(Y)
    gain = speedup(mx, my)
    (xl, xh), (yl, yh) = (_median_ranks(X.shape[1], n_resamples, seed),
                          _median_ranks(Y.shape[1], n_resamples, seed + 1))
    dist = speedup((X[:, xl] + X[:, xh]) * 0.5, (Y[:, yl] + Y[:, yh]) * 0.5)   # (cells, R)
    g = gain[:, None]
    with np.errstate(all="ignore"):
        z0 = ndtri(((dist < g).mean(axis=1) + (dist <= g).mean(axis=1)) / 2)[:, None]
        (jxl, jxh), (jyl, jyh) = _jackknife_ranks(X.shape[1]), _jackknife_ranks(Y.shape[1])
        jack = [speedup((X[:, jxl] + X[:, jxh]) * 0.5, my[:, None]),
                speedup(mx[:, None], (Y[:, jyl] + Y[:, jyh]) * 0.5)]
        u = [(j.shape[1] - 1) * (j.mean(axis=1, keepdims=True) - j) for j in jack]
        num = sum((ui ** 3).sum(axis=1) / ui.shape[1] ** 3 for ui in u)
        den = sum((ui ** 2).sum(axis=1) / ui.shape[1] ** 2 for ui in u) ** 1.5
        a = np.where(den > 0, num / den / 6, 0.0)[:, None]
        q = ndtr(z0 + (z0 + _Z_TAILS) / (1 - a * (z0 + _Z_TAILS)))          # (cells, 2)
    pos = np.nan_to_num(q) * (n_resamples - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n_resamples - 1)
    dist.sort(axis=1)
    take = lambda idx: np.take_along_axis(dist, idx, axis=1)  # noqa: E731
    bounds = take(lo) + (take(hi) - take(lo)) * (pos - lo)
    bounds[~np.isfinite(q)] = np.nan        # BCa failed: speedup_ci falls back per cell
    return np.column_stack([gain, bounds])


def _process_means(groups: list[np.ndarray], rng, n_resamples: int) -> np.ndarray:
    """Two-level bootstrap of the mean of per-process medians: resample processes, then steps
    within each drawn process. Returns (n_resamples,) statistics."""
    # each process's step-resampled median, for every replicate: (P, R)
    meds = np.stack([np.median(rng.choice(g, size=(n_resamples, g.size)), axis=1)
                     for g in groups])
    pick = rng.integers(0, len(groups), size=(len(groups), n_resamples))      # (P, R)
    return np.take_along_axis(meds, pick, axis=0).mean(axis=0)


def process_spread(groups: Sequence[Sequence[float]]) -> float:
    """Relative spread (sample std / mean) of the per-process medians; 0 for one process."""
    meds = np.asarray([np.median(g) for g in groups], dtype=float)
    if meds.size < 2 or meds.mean() <= 0:
        return 0.0
    return float(meds.std(ddof=1) / meds.mean())


def resolvable_effect(baseline: Sequence[Sequence[float]],
                      candidate: Sequence[Sequence[float]]) -> float:
    """Smallest relative change the processes can resolve: two standard errors of the
    difference of the two means of process medians (never below MIN_EFFECT)."""
    se2 = sum(process_spread(g) ** 2 / len(g) for g in (baseline, candidate) if len(g) > 1)
    return max(MIN_EFFECT, 2.0 * math.sqrt(se2))


def processes_to_resolve(baseline: Sequence[Sequence[float]],
                         candidate: Sequence[Sequence[float]], effect: float) -> int | None:
    """Worker processes per side that resolvable_effect would need to reach `effect`, given
    the spread these processes showed (the larger side's); None when a side has one process
    (no spread to extrapolate from)."""
    if min(len(baseline), len(candidate)) < 2:
        return None
    cv2 = max(process_spread(g) for g in (baseline, candidate)) ** 2
    # 2 * sqrt(2 * cv^2 / n) <= effect  <=>  n >= 8 cv^2 / effect^2
    return max(2, math.ceil(8.0 * cv2 / effect ** 2))


def speedup_ci_processes(baseline: Sequence[Sequence[float]],
                         candidate: Sequence[Sequence[float]], *,
                         n_resamples: int = N_RESAMPLES, seed: int = SEED) -> Ratio:
    """Speedup with a CI when each side is several independent worker processes (pyperf's
    model): on a shared machine whole processes drift (docs/figures.md) while the steps within
    one agree, so a CI from the steps alone calls noise a regression. The statistic is the mean
    of the per-process medians; processes and their steps are both resampled; and the smallest
    change called significant is what the processes' own spread can resolve."""
    bg = [np.asarray(g, dtype=float) for g in baseline if len(g)]
    cg = [np.asarray(g, dtype=float) for g in candidate if len(g)]
    if not bg or not cg:
        raise ValueError("speedup_ci_processes needs samples on both sides")
    gain = float(np.mean([np.median(g) for g in bg]) / np.mean([np.median(g) for g in cg]))
    floor = resolvable_effect(bg, cg)
    if len(bg) == 1 and len(cg) == 1:
        r = speedup_ci(bg[0], cg[0], n_resamples=n_resamples, seed=seed)
        return Ratio(r.gain, r.low, r.high, r.dist, floor)
    rng = np.random.default_rng(seed)
    logs = np.log(_process_means(bg, rng, n_resamples) / _process_means(cg, rng, n_resamples))
    # the bootstrap of n draws underestimates a variance by (n-1)/n: with 3-5 processes that
    # is 20-33%, so widen the distribution around the estimate by the larger side's factor
    n = min(len(g) for g in (bg, cg) if len(g) > 1)
    logs = math.log(gain) + (logs - math.log(gain)) * math.sqrt(n / (n - 1))
    dist = np.exp(logs)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(dist, [alpha, 1 - alpha])
    return Ratio(gain, float(lo), float(hi), dist, floor)


def gain_from_values(baseline: float, candidate: float, higher_is_better: bool) -> Ratio:
    """A gain without samples (memory, compile time): no interval."""
    if higher_is_better:
        return Ratio(candidate / baseline)
    return Ratio(baseline / candidate)


def geometric_mean(values: Sequence[float]) -> float:
    vals = [float(v) for v in values]
    if not vals or any(v <= 0 for v in vals):
        raise ValueError("geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def geomean_ratio(ratios: Sequence[Ratio]) -> Ratio:
    """Geometric mean of gains. Its CI combines the cells' bootstrap distributions resample by
    resample (cells are independent), when every cell has one."""
    gain = geometric_mean([r.gain for r in ratios])
    dists = [r.dist for r in ratios]
    if not ratios or any(d is None for d in dists) or len({len(d) for d in dists}) != 1:
        return Ratio(gain)
    logs = _sum_of_logs(dists)
    g = np.exp(logs / len(dists))                             # (resamples,)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(g, [alpha, 1 - alpha])
    return Ratio(gain, float(lo), float(hi), g)


def _sum_of_logs(dists: Sequence[Any], chunk: int = 1024) -> np.ndarray:
    """Sum over cells of log(distribution), replicate by replicate. BootDists of the same sizes
    are regenerated together, a chunk of cells at a time (a (cells, resamples) array of a whole
    table would not fit), each rotated as BootDist.__array__ rotates it; others one by one."""
    logs = np.zeros(len(dists[0]))
    groups: dict[tuple, list[BootDist]] = {}
    for d in dists:
        if isinstance(d, BootDist):
            groups.setdefault((d.xs.size, d.ys.size, d.n_resamples, d.seed), []).append(d)
        else:
            logs += np.log(np.asarray(d, dtype=float))
    for (nx, ny, n_resamples, seed), ds in groups.items():
        xl, xh = _median_ranks(nx, n_resamples, seed)
        yl, yh = _median_ranks(ny, n_resamples, seed + 1)
        # by_shift[s]: the summed logs of the cells rotated by s, before the rotation: each
        # cell's row is added as it is, and each of the n_resamples rotations is applied
        # once at the end, not once per cell (a row add per cell beats np.add.at's
        # unbuffered loop and a gather of every element)
        by_shift = np.zeros((n_resamples, n_resamples))
        for k in range(0, len(ds), chunk):
            part = ds[k:k + chunk]
            X, Y = np.stack([d.xs for d in part]), np.stack([d.ys for d in part])
            # (a + b) * 0.5 on both sides of the ratio: the halves cancel exactly
            vals = speedup(X[:, xl] + X[:, xh], Y[:, yl] + Y[:, yh])
            shift = np.array([zlib.crc32(d.ys, zlib.crc32(d.xs)) % n_resamples
                              for d in part])
            for s, row in zip(shift.tolist(), np.log(vals)):
                by_shift[s] += row
        # np.roll(v, s)[j] == v[(j - s) % n]
        rows = np.arange(n_resamples)
        idx = (rows[None, :] - rows[:, None]) % n_resamples
        logs += np.take_along_axis(by_shift, idx, axis=1).sum(axis=0)
    return logs


def _fmt(v: float) -> str:
    return f"{v:.2f}"


def describe(r: Ratio, better: str = "faster", worse: str = "slower") -> str:
    """'1.31x faster (1.27–1.35)', '1.12x slower (1.05–1.19)', 'not significant'.
    Without a CI: '1.31x smaller (no CI)'."""
    if r.has_ci and not r.significant:
        return "not significant"
    if not r.has_ci and r.gain == 1.0:
        return "same"
    if r.gain >= 1.0:
        word, f, lo, hi = better, r.gain, r.low, r.high
    else:
        # express a loss as "N x worse": invert the factor and the interval
        word, f = worse, 1.0 / r.gain
        lo = 1.0 / r.high if r.has_ci else None
        hi = 1.0 / r.low if r.has_ci else None
    ci = f"({_fmt(lo)}–{_fmt(hi)})" if lo is not None else "(no CI)"
    return f"{_fmt(f)}x {word} {ci}"


def loss_pct(r: Ratio) -> float:
    """How much worse the candidate is, in percent (0 when it is not worse)."""
    return max(0.0, (1.0 / r.gain - 1.0) * 100.0) if r.gain > 0 else math.inf
