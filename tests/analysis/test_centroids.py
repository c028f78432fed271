"""dynlab.analysis.centroids against independent computations: per-class means by a loop,
distances from scipy's cdist, M as the smallest off-diagonal distance of the present classes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from dynlab.analysis.centroids import class_centroids, class_stats, pair_distances, separation


def _states(n: int = 40, tc: int = 3, f: int = 5, g: int = 4, offset: float = 0.0, seed: int = 0):
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n, tc, f)) + offset
    y = rng.integers(0, g - 1, size=(n, tc))  # class g-1 never occurs: an absent class
    return h, y, g


@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_centroids_distances_and_separation_match_a_loop_and_cdist(offset):
    h, y, g = _states(offset=offset)
    counts, cent, _ = class_stats(h, y, g)
    for t in range(h.shape[1]):
        present = [k for k in range(g) if (y[:, t] == k).any()]
        means = np.stack([h[y[:, t] == k, t].mean(0) for k in present])
        np.testing.assert_allclose(cent[t, present], means, rtol=1e-12, atol=1e-12 * (1 + offset))
        assert counts[t].tolist() == [float((y[:, t] == k).sum()) for k in range(g)]
        dist = pair_distances(cent[t], counts[t] > 0)
        want = cdist(means, means)
        # centring first keeps the Gram form accurate far from the origin
        np.testing.assert_allclose(dist[np.ix_(present, present)], want, rtol=1e-9, atol=1e-9)
        assert np.isnan(dist[g - 1]).all() and np.isnan(dist[:, g - 1]).all()
        m = separation(dist[None], (counts[t] > 0)[None])[0]
        assert m == pytest.approx(want[~np.eye(len(present), dtype=bool)].min(), rel=1e-9, abs=1e-12)


def test_separation_is_nan_with_fewer_than_two_classes_and_class_centroids_marks_absent_rows():
    h = np.ones((6, 3))
    c, counts = class_centroids(h, np.zeros(6, dtype=int), n_classes=3)
    assert counts.tolist() == [6, 0, 0] and np.isnan(c[1:]).all() and np.allclose(c[0], 1.0)
    present = counts > 0
    assert np.isnan(separation(pair_distances(c, present)[None], present[None])[0])


def test_a_non_finite_state_stays_in_its_own_class():
    h, y, g = _states(n=12, tc=1, f=2, g=3)
    h[0, 0, 0] = np.inf
    _, cent, _ = class_stats(h, y, g)
    own = y[0, 0]
    assert not np.isfinite(cent[0, own]).all()
    others = [k for k in range(g) if k != own and (y[:, 0] == k).any()]
    assert np.isfinite(cent[0, others]).all()
