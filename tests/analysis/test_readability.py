"""Decoder-aligned readability ratios, the probe and dense max-pass length against answers known in advance."""

from __future__ import annotations

import numpy as np
import pytest

from dynlab.analysis.geometry import geometry_over_time
from dynlab.analysis.readability import decoder_ratio, fit_probe, pairwise_ratio, probe_accuracy
from dynlab.tracking.evaluate import max_pass_length_dense, pooled_accuracy


def _two_gaussians(n: int, d: float, sd: tuple[float, float, float], seed: int, t: int = 1):
    """Classes 0/1 with centroids (∓d/2, 0, 0) and independent noise of std ``sd`` per axis."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=(n, t))
    cent = np.array([[-d / 2, 0.0, 0.0], [d / 2, 0.0, 0.0]])
    h = cent[y] + rng.standard_normal((n, t, 3)) * np.asarray(sd)
    return h, y


def test_pairwise_ratio_equals_projected_spread_over_distance():
    # spread 0.3 along the pair direction, 2.0 and 1.0 across it: q = R/M > 1, the pair is readable
    # (the estimated pair direction tilts by about sd_across / sqrt(N) and picks up that much
    # of the across spread; at N = 100 000 that is below 0.1 % of the answer)
    h, y = _two_gaussians(100_000, 2.0, (0.3, 2.0, 1.0), seed=0)
    out = pairwise_ratio(h, y, 2)
    assert out["q_pair"][0] == pytest.approx(0.3 / 2.0, rel=0.02, abs=1e-12)
    geo = geometry_over_time(h, y, n_classes=2)
    assert float(geo.q[0]) > 1.0  # the literal ratio calls it unreadable


def test_pairwise_ratio_worst_pair_with_hand_set_spreads():
    # three classes on a line at 0, 1, 4; class spreads along the line 0.1, 0.2, 0.05
    rng = np.random.default_rng(1)
    n = 60_000
    y = rng.integers(0, 3, size=(n, 1))
    pos = np.array([0.0, 1.0, 4.0])
    sd = np.array([0.1, 0.2, 0.05])
    h = np.zeros((n, 1, 2))
    h[..., 0] = pos[y] + sd[y] * rng.standard_normal((n, 1))
    h[..., 1] = 0.5 * rng.standard_normal((n, 1))  # orthogonal to every pair direction
    # pair (0,1): pooled sd sqrt((.01+.04)/2) over distance 1; the other pairs are far smaller
    expect = np.sqrt((0.1**2 + 0.2**2) / 2) / 1.0
    assert pairwise_ratio(h, y, 3)["q_pair"][0] == pytest.approx(expect, rel=0.02, abs=1e-12)


def test_elongated_clusters_never_cross_but_q_does():
    """Spread 3× the separation, all of it orthogonal to U: fully decodable.

    (The estimated pair directions tilt into U⊥ by about sd·sqrt(2·5/n_class)/d, which adds
    that fraction of the orthogonal spread: about 0.05 here, far below τ = 0.5.)
    """
    rng = np.random.default_rng(2)
    n, t, g, s = 20_000, 4, 3, 8
    y = rng.integers(0, g, size=(n, t))
    cent = np.zeros((g, s))
    cent[:, :g] = np.eye(g)  # U = span of the first three axes' differences
    noise = np.zeros((n, t, s))
    noise[..., g:] = 2.0 * rng.standard_normal((n, t, s - g))
    noise[..., :g] = 0.02 * rng.standard_normal((n, t, g))
    h = cent[y] + noise
    ratios = np.concatenate([pairwise_ratio(h[:, i : i + 2], y[:, i : i + 2], g)["q_pair"] for i in range(0, t, 2)])
    assert (ratios < 0.15).all()
    geo = geometry_over_time(h, y, n_classes=g)
    assert str(geo.failure_mode.values) == "saturation"  # the literal q mislabels it


def test_decoder_ratio_of_nearest_centroid_readout_equals_pairwise_ratio():
    # mirror-symmetric classes (class 1 = -class 0): equal spreads, so pooled == per class
    rng = np.random.default_rng(3)
    base = rng.standard_normal((500, 1, 3)) * np.array([0.4, 1.0, 3.0]) + np.array([-1.0, 0.0, 0.0])
    h = np.concatenate([base, -base])  # [1000, 1, 3]
    y = np.concatenate([np.zeros((500, 1), int), np.ones((500, 1), int)])
    cent = np.array([h[:500, 0].mean(0), h[500:, 0].mean(0)])
    w = cent  # nearest-centroid readout: z_a = c_a·h - |c_a|²/2
    b = -0.5 * (cent**2).sum(1)
    q_dec = decoder_ratio(h, y, w, b)["q_dec"][0]
    q_pair = pairwise_ratio(h, y, 2)["q_pair"][0]
    assert q_dec == pytest.approx(q_pair, rel=1e-10, abs=1e-12)
    # and both equal the sample sd along the centroid direction over the distance
    d = np.linalg.norm(cent[0] - cent[1])
    u = (cent[0] - cent[1]) / d
    assert q_pair == pytest.approx(((h[:500, 0] - cent[0]) @ u).std(ddof=1) / d, rel=1e-10, abs=1e-12)


def test_decoder_ratio_reads_the_boundary_not_the_centroids():
    """A readout whose boundary sits at 1/4 of the way from class 0: class 0's margin is d/4."""
    h, y = _two_gaussians(40_000, 2.0, (0.2, 1.0, 1.0), seed=4)
    w = np.array([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    b = np.array([0.0, 1.0])  # boundary where -x = x + 1, i.e. x = -1/2
    out = decoder_ratio(h, y, w, b)
    # class 0 (at x = -1) is 0.5 from the boundary; class 1 (at x = 1) is 1.5: worst = 0.2 / (2·0.5)
    assert out["q_dec"][0] == pytest.approx(0.2 / (2 * 0.5), rel=0.02, abs=1e-12)
    assert out["dec_margin"][0] == pytest.approx(0.5, rel=0.02, abs=1e-12)
    # a boundary beyond a centroid: that class's centroid is misread, ratio +inf
    assert np.isinf(decoder_ratio(h, y, w, np.array([0.0, 3.0]))["q_dec"][0])


def test_reference_separation_holds_the_denominator():
    h, y = _two_gaussians(20_000, 2.0, (0.3, 0.0, 0.0), seed=5)
    ref = np.array([[np.nan, 4.0], [4.0, np.nan]])
    out = pairwise_ratio(h, y, 2, ref_dist=ref)
    assert out["q_pair_ref"][0] == pytest.approx(0.3 / 4.0, rel=0.03, abs=1e-12)


def test_collapsed_tracker_fails_under_every_ratio():
    n, t, s = 200, 12, 4
    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, size=(n, t))
    h = np.ones((n, t, s))  # every state the same: all classes merged
    geo = geometry_over_time(h, y, n_classes=3)
    assert np.isinf(geo.q.values).all() and bool(geo.crossed)
    assert str(geo.failure_mode.values) != "robust"
    assert np.isinf(pairwise_ratio(h, y, 3)["q_pair"]).all()
    w = rng.standard_normal((3, s))
    assert np.isinf(decoder_ratio(h, y, w, np.zeros(3))["q_dec"]).all()  # some centroid is misread


def test_scatter_is_unbiased_with_thin_classes():
    """120 classes, 3 samples each, unit noise in 10 dims: the true R is sqrt(10)."""
    rng = np.random.default_rng(7)
    g, per, s = 120, 3, 10
    y = np.repeat(np.arange(g), per)[:, None].repeat(20, axis=1)  # [360, 20]
    cent = 50.0 * rng.standard_normal((g, s))
    h = cent[y] + rng.standard_normal((g * per, 20, s))
    geo = geometry_over_time(h, y, n_classes=g)
    assert float(geo.R.mean()) == pytest.approx(np.sqrt(s), rel=0.03, abs=1e-12)
    # the plain mean over samples would be sqrt(s·(1 - 1/3)) = 0.82 of it
    resid = h - h.reshape(g, per, 20, s).mean(1).repeat(per, axis=0)
    assert np.sqrt((resid**2).sum(-1).mean(0)).mean() < 0.85 * np.sqrt(s)


def test_probe_reads_linearly_separable_states_perfectly():
    rng = np.random.default_rng(8)
    g, s = 6, 12
    cent = 4.0 * np.eye(g, s)
    y_fit = rng.integers(0, g, 600)
    probe = fit_probe(cent[y_fit] + 0.3 * rng.standard_normal((600, s)), y_fit)
    y = rng.integers(0, g, (400, 5))
    h = cent[y] + 0.3 * rng.standard_normal((400, 5, s))
    np.testing.assert_array_equal(probe_accuracy(probe, h, y), 1.0)
    # a probe reads states whose classes were relabelled as chance
    assert probe_accuracy(probe, h, (y + 1) % g).max() == 0.0
    h[:, 2] = np.inf  # an overflowed step counts as misread
    assert probe_accuracy(probe, h, y)[2] == 0.0


def test_dense_max_pass_length_on_a_hand_made_curve():
    acc = np.ones(1000)
    acc[437:] = 0.5  # fails from length 438 on
    # raw rule: the last passing length is 437
    assert max_pass_length_dense(acc, 0.9, window=0.0) == (437, False)
    # pooled over ±5 % of L: the window at L reaches min(L + w, T); at L = 428, w = 21
    # pools lengths 407..449, 12 of 43 at 0.5 -> 0.86 < 0.9
    pooled = pooled_accuracy(acc, 0.05)
    expect = next(L for L in range(1, 1001) if pooled[L - 1] < 0.9) - 1
    mp, cens = max_pass_length_dense(acc, 0.9)
    assert (mp, cens) == (expect, False) and 420 < mp < 437
    # a single noisy dip below threshold does not end mp when pooled, but does raw
    noisy = np.ones(1000)
    noisy[99] = 0.85
    assert max_pass_length_dense(noisy, 0.9) == (1000, True)
    assert max_pass_length_dense(noisy, 0.9, window=0.0) == (99, False)
    # pooled accuracy equals a brute-force window mean
    L = 200
    w = int(round(0.05 * L))
    assert pooled[L - 1] == pytest.approx(acc[L - 1 - w : L + w].mean())
