"""Statistics for compare: bootstrap CI of a ratio of medians, the sentence it reads as, and the
geometric mean over cells.

Convention: a *gain* is "how many times better the candidate is than the baseline"; > 1 is
better. For times, gain = median(baseline) / median(candidate), i.e. the speedup.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

SEED = 20240611          # fixed: the same files always give the same intervals
N_RESAMPLES = 2000       # percentile error of a 95% interval ~0.5% of its width at 2000
CONFIDENCE = 0.95
# Smallest change we call significant even when the CI excludes 1: the bootstrap only sees noise
# *within* a run, while separate runs (and the cells of one table, tested many at once) drift
# (docs/figures.md). Below this an A/A comparison would "find" differences.
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Ratio:
    """A gain with its confidence interval. low/high are None when there were no samples."""
    gain: float
    low: float | None = None
    high: float | None = None
    # bootstrap distribution of the gain (kept for the geometric-mean interval); not serialised
    dist: tuple[float, ...] | None = None
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


def speedup_ci(baseline: Sequence[float], candidate: Sequence[float], *,
               n_resamples: int = N_RESAMPLES, seed: int = SEED,
               method: str = "BCa") -> Ratio:
    """Ratio median(baseline)/median(candidate) with a 95% bootstrap CI (independent samples).

    BCa corrects the skew a ratio of medians has; if it cannot (degenerate data, too few
    samples) the percentile interval is used instead."""
    x = np.asarray(baseline, dtype=float)
    y = np.asarray(candidate, dtype=float)
    if x.size == 0 or y.size == 0:
        raise ValueError("speedup_ci needs samples on both sides")
    gain = float(_ratio_of_medians(x, y))
    if x.size < 2 or y.size < 2:
        return Ratio(gain)
    if np.ptp(x) == 0 and np.ptp(y) == 0:
        # identical samples on each side: no spread to resample, the interval is the point
        return Ratio(gain, gain, gain, (gain,) * n_resamples)
    for m in dict.fromkeys((method, "percentile")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning -> we fall back ourselves
            res = _st.bootstrap((x, y), _ratio_of_medians, paired=False, vectorized=True,
                                n_resamples=n_resamples, confidence_level=CONFIDENCE,
                                method=m, rng=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return Ratio(gain, lo, hi, tuple(float(v) for v in res.bootstrap_distribution))
    return Ratio(gain)


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
    return Ratio(gain, float(lo), float(hi), tuple(dist.tolist()), floor)


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
    logs = np.log(np.asarray(dists, dtype=float))           # (cells, resamples)
    g = np.exp(logs.mean(axis=0))                             # (resamples,)
    alpha = (1 - CONFIDENCE) / 2
    lo, hi = np.quantile(g, [alpha, 1 - alpha])
    return Ratio(gain, float(lo), float(hi), tuple(g.tolist()))


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
