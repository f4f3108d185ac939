"""Two timings taken in alternating rounds, as the *_parts benchmarks take them: the per-round
ratios' median and its 95% bootstrap interval (scipy.stats.bootstrap). Pairing by round lets
the VM's drift, which moves both sides of a round alike, cancel out of each ratio."""
from __future__ import annotations

import statistics


def ratio_ci(num, den) -> str:
    """'median x [low, high]' of num[i] / den[i] over the rounds."""
    from scipy import stats
    ratios = [a / b for a, b in zip(num, den)]
    ci = stats.bootstrap((ratios,), statistics.median, n_resamples=2000,
                         random_state=0).confidence_interval
    return f"{statistics.median(ratios):.3f}x [{ci.low:.3f}, {ci.high:.3f}]"
