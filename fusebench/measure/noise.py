"""When a timing is too noisy to trust: one threshold for model and kernel cells alike."""
from __future__ import annotations

from fusebench.measure.events import EventLog
from fusebench.spec import StepStats

NOISY = 0.10   # IQR/median above this: the median (and any ratio built on it) is suspect


def noisy_fraction(stats: StepStats | None) -> float | None:
    """IQR/median when it is above NOISY, else None."""
    if stats is None or not stats.median or stats.median <= 0:
        return None
    frac = stats.iqr / stats.median
    return frac if frac > NOISY else None


def noise_event(stats: StepStats, events: EventLog) -> None:
    """Add the 'noise' event a noisy timing carries (model and kernel cells)."""
    frac = noisy_fraction(stats)
    if frac is not None:
        events.add("noise", "fusebench", f"noisy timing: IQR/median = {frac:.0%} (> {NOISY:.0%})")
