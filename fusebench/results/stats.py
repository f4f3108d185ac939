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
# *within* a run, while separate runs (and the cells of one table, tested many at once) drift by
# ~1-2% on a quiet machine. Below this an A/A comparison would "find" differences.
MIN_EFFECT = 0.02


@dataclass(frozen=True)
class Ratio:
    """A gain with its confidence interval. low/high are None when there were no samples."""
    gain: float
    low: float | None = None
    high: float | None = None
    # bootstrap distribution of the gain (kept for the geometric-mean interval); not serialised
    dist: tuple[float, ...] | None = None

    @property
    def has_ci(self) -> bool:
        return self.low is not None and self.high is not None

    @property
    def significant(self) -> bool:
        """CI excludes 1.0 and the change is at least MIN_EFFECT. Without a CI (deterministic
        metrics such as memory) any difference counts."""
        if not self.has_ci:
            return self.gain != 1.0
        big_enough = abs(math.log(self.gain)) >= math.log1p(MIN_EFFECT)
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
