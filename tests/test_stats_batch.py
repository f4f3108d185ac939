"""The batched bootstrap compare uses for whole tables gives speedup_ci's intervals."""
from __future__ import annotations

import numpy as np
import pytest

from fusebench.results import stats
from tests.factories import samples


def test_batch_matches_one_at_a_time():
    pairs = [(samples(100, seed=i, n=40 if i % 3 else 15), samples(80, seed=i + 99,
                                                                   n=40 if i % 2 else 25))
             for i in range(40)] + [([5.0] * 10, [5.0] * 10), ([5.0], [4.0])]
    for one, many in zip([stats.speedup_ci(x, y) for x, y in pairs], stats.speedup_cis(pairs)):
        assert one.gain == pytest.approx(many.gain)
        assert one.has_ci == many.has_ci
        if one.has_ci:
            assert (one.low, one.high) == pytest.approx((many.low, many.high), rel=1e-9)
            assert type(many.low) is float and type(many.significant) is bool


def test_big_tables_use_fewer_resamples_and_stay_calibrated():
    n = stats.BIG_TABLE + 1
    pairs = [(samples(100, seed=i), samples(100, seed=i + 10**6)) for i in range(n)]
    rs = stats.speedup_cis(pairs)
    assert len(rs[0].dist) == stats.N_RESAMPLES_BIG
    covered = np.mean([r.low <= 1.0 <= r.high for r in rs])   # A/A: true gain 1
    assert covered > 0.9, covered
    g = stats.geomean_ratio(rs)
    assert g.low <= 1.0 <= g.high


def test_geomean_of_many_cells_equals_the_cell_by_cell_sum():
    """The geometric mean regenerates cells' distributions in chunks (stats._sum_of_logs):
    the same interval as adding each cell's rotated distribution one at a time."""
    pairs = [(samples(100, seed=i, n=40 if i % 3 else 15), samples(90, seed=i + 7))
             for i in range(30)]
    rs = stats.speedup_cis(pairs)
    logs = np.zeros(len(rs[0].dist))
    for r in rs:
        logs += np.log(np.asarray(r.dist, dtype=float))
    assert stats._sum_of_logs([r.dist for r in rs], chunk=4) == pytest.approx(logs, rel=1e-12)
    mixed = [r.dist for r in rs[:5]] + [np.full(len(rs[0].dist), 1.5)]
    expect = sum(np.log(np.asarray(d, dtype=float)) for d in mixed)
    assert stats._sum_of_logs(mixed) == pytest.approx(expect, rel=1e-12)


def test_normal_cdf_and_inverse_match_scipy():
    """stats' ndtr/ndtri (math + statistics, no scipy import for `compare`) are scipy's, edge
    values included: the BCa intervals do not move."""
    special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.linspace(-8, 8, 2001), [np.inf, -np.inf, np.nan]])
    np.testing.assert_allclose(stats.ndtr(x), special.ndtr(x), rtol=1e-13, atol=0)
    p = np.concatenate([np.linspace(0, 1, 2001), [-0.1, 1.1, np.nan, 1e-300]])
    np.testing.assert_allclose(stats.ndtri(p), special.ndtri(p), rtol=1e-13, atol=1e-14)
