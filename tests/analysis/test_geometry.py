"""Geometry (q, R, M, U, T_cross) and nearest-centroid margins against closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlab.analysis.geometry import (
    class_centroids,
    crossing_time,
    geometry_over_time,
    readout_tau,
    symbolic_basis,
)
from dynlab.analysis.margin import binary_signed_error, decision_margin, margin_vs_group_order

TAU = 0.5


def _mixture(n: int, t: int, s: int, g: int, sigma0: float, kappa: float, seed: int):
    """Centroids c_g = e_g (unit vectors) and isotropic noise sigma(t) = sigma0 + kappa t."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, g, size=(n, t))  # [N, T]
    cent = np.eye(g, s)  # [G, S]
    sigma = sigma0 + kappa * np.arange(1, t + 1)  # [T]
    states = cent[labels] + sigma[None, :, None] * rng.standard_normal((n, t, s))  # [N, T, S]
    return states, labels, sigma


def test_gaussian_mixture_matches_closed_form():
    n, t, s, g = 4000, 40, 8, 4
    sigma0 = 0.05
    # crossing level: R = sigma sqrt(S) reaches tau*M = tau*sqrt(2) at sigma* = 0.25 (t* = 21.5)
    kappa = 0.2 / 21.5
    states, labels, sigma = _mixture(n, t, s, g, sigma0, kappa, seed=0)
    ds = geometry_over_time(states, labels, n_classes=g)
    r_true = sigma * np.sqrt(s * (1 - g / n))  # sample centroids remove 1/n_g of the variance
    np.testing.assert_allclose(ds["R"].values, r_true, rtol=0.02, atol=0)
    # M is a minimum of noisy centroid distances: allow 4 standard errors of a difference
    se = sigma * np.sqrt(2 * g / n)
    assert (np.abs(ds["M"].values - np.sqrt(2)) < 4 * se).all()
    early = ds["t"].values <= 25  # up to and just past the crossing, M is within 1%
    np.testing.assert_allclose(ds["q"].values[early], r_true[early] / np.sqrt(2), rtol=0.03, atol=0)
    # U = span{e_0..e_3 differences}: 3 of the 8 noise dimensions lie in U
    assert (ds["k_U"].values == g - 1).all()
    np.testing.assert_allclose(ds["R_par"].values / ds["R"].values, np.sqrt(3 / 8), rtol=0.04, atol=0)
    np.testing.assert_allclose(ds["R_par"] ** 2 + ds["R_perp"] ** 2, ds["R"] ** 2, rtol=1e-10, atol=0)
    assert bool(ds["crossed"]) and float(ds["T_cross"]) == 22.0
    assert str(ds["failure_mode"].values) == "climb"
    # Corollary 1: e_U = sqrt(3) sigma(t) is exactly linear; its crossing of tau*M solves
    # sqrt(3)(sigma0 + kappa t) = tau*sqrt(2)
    np.testing.assert_allclose(float(ds["eta"]), np.sqrt(3) * kappa, rtol=0.05, atol=0)
    t_pred = (TAU * np.sqrt(2) / np.sqrt(3) - sigma0) / kappa
    np.testing.assert_allclose(float(ds["T_cross_par_pred"]), t_pred, rtol=0.05, atol=0)
    for var in ("q", "R", "M", "R_par", "R_perp"):
        assert {"long_name", "units"} <= set(ds[var].attrs)
    assert ds.attrs["tau"] == TAU and ds.attrs["persist"] == 3


def test_streaming_chunks_equal_full_array():
    states, labels, _ = _mixture(300, 25, 6, 3, 0.1, 0.01, seed=1)
    full = geometry_over_time(states, labels, n_classes=3, elements_per_chunk=10**9)
    chunks = ((states[:, a : a + 7], labels[:, a : a + 7]) for a in range(0, 25, 7))
    streamed = geometry_over_time(chunks, n_classes=3)
    small = geometry_over_time(torch.from_numpy(states), torch.from_numpy(labels), n_classes=3, elements_per_chunk=2000)
    for ds in (streamed, small):
        for var in ("q", "R", "M", "R_par", "R_perp"):
            np.testing.assert_allclose(ds[var].values, full[var].values, rtol=1e-12, atol=0)


def test_symbolic_basis_dimension_and_span():
    rng = np.random.default_rng(2)
    for k, s in ((2, 2), (3, 5), (6, 10)):
        cent = rng.standard_normal((k, s))
        b = symbolic_basis(cent)
        assert b.shape == (s, k - 1)
        np.testing.assert_allclose(b.T @ b, np.eye(k - 1), rtol=1e-7, atol=1e-12)
        diffs = cent[1:] - cent[0]  # [k-1, S]
        np.testing.assert_allclose(diffs @ b @ b.T, diffs, rtol=1e-7, atol=1e-12)
    # coincident centroids (rank 1 configuration): only one direction
    line = np.outer(np.arange(4.0), rng.standard_normal(5))
    assert symbolic_basis(line).shape == (5, 1)
    cent_nan = np.vstack([cent[:3], np.full((1, cent.shape[1]), np.nan)])
    assert symbolic_basis(cent_nan).shape[1] == 2


def test_q_invariant_to_rotation_and_scale():
    states, labels, _ = _mixture(500, 12, 7, 5, 0.2, 0.02, seed=3)
    rng = np.random.default_rng(4)
    rot, _ = np.linalg.qr(rng.standard_normal((7, 7)))
    scale = 3.7
    a = geometry_over_time(states, labels, n_classes=5)
    b = geometry_over_time(scale * states @ rot.T, labels, n_classes=5)
    np.testing.assert_allclose(b["q"].values, a["q"].values, rtol=1e-10, atol=0)
    np.testing.assert_allclose(b["R"].values, scale * a["R"].values, rtol=1e-10, atol=0)
    np.testing.assert_allclose(b["R_par"].values, scale * a["R_par"].values, rtol=1e-10, atol=0)


def test_failure_modes_and_censoring():
    sat_states, sat_labels, _ = _mixture(400, 10, 4, 2, 1.0, 0.0, seed=5)
    sat = geometry_over_time(sat_states, sat_labels, n_classes=2)
    assert str(sat["failure_mode"].values) == "saturation" and float(sat["T_cross"]) == 1.0
    rob_states, rob_labels, _ = _mixture(400, 10, 4, 2, 0.01, 0.0, seed=6)
    rob = geometry_over_time(rob_states, rob_labels, n_classes=2)
    assert str(rob["failure_mode"].values) == "robust"
    assert np.isnan(float(rob["T_cross"])) and not bool(rob["crossed"])


def test_crossing_time_persistence_rule():
    t = np.arange(1, 9)
    q = np.array([0.6, 0.4, 0.6, 0.6, 0.6, 0.1, 0.7, 0.7])
    assert crossing_time(q, 0.5, t, persist=1) == (1.0, True)
    assert crossing_time(q, 0.5, t, persist=3) == (3.0, True)
    t_c, crossed = crossing_time(q, 0.5, t, persist=4)  # the final stretch is only 2 long
    assert np.isnan(t_c) and not crossed
    q_nan = np.array([np.nan, 0.6, 0.6])
    assert crossing_time(q_nan, 0.5, t[:3], persist=2) == (2.0, True)


def test_readout_threshold():
    cent = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0]])
    # nearest-centroid readout written as a linear map: logits = 2 c·h - |c|^2
    w, b = 2 * cent, -(cent**2).sum(1)
    assert readout_tau(cent, w, b) == pytest.approx(0.5, rel=0, abs=1e-12)
    # two classes with the boundary moved to x = 0.5: distances 0.5 and 1.5, M = 2
    w2, b2 = np.array([[-1.0, 0.0], [1.0, 0.0]]), np.array([0.0, -1.0])
    assert readout_tau(cent[:2], w2, b2) == pytest.approx(0.25, rel=0, abs=1e-12)
    states, labels, _ = _mixture(300, 6, 2, 2, 0.3, 0.0, seed=7)
    w3 = np.array([[-1.0, 1.0], [1.0, -1.0]])  # bisector of e_0, e_1, through the midpoint
    ds = geometry_over_time(states, labels, n_classes=2, threshold="readout", readout_weight=w3)
    c0 = np.stack([class_centroids(states[:, i], labels[:, i], 2)[0] for i in range(6)])
    expect = [readout_tau(c, w3) for c in c0]
    np.testing.assert_allclose(ds["tau_readout"].values, expect, rtol=1e-12, atol=0)


def test_bad_input_raises():
    states, labels, _ = _mixture(20, 3, 2, 2, 0.1, 0.0, seed=8)
    with pytest.raises(ValueError, match="labels range"):
        geometry_over_time(states, labels + 5, n_classes=2)
    with pytest.raises(ValueError, match="threshold"):
        geometry_over_time(states, labels, n_classes=2, threshold="bogus")
    with pytest.raises(ValueError, match="readout_weight"):
        geometry_over_time(states, labels, n_classes=2, threshold="readout")
    with pytest.raises(ValueError, match="persist"):
        crossing_time([0.1], 0.5, [1], persist=0)


def test_decision_margin_by_hand():
    # classes at (0,0) and (2,0); states at centroid +- offsets so centroids stay exact
    c = np.array([[0.0, 0.0], [2.0, 0.0]])
    off = np.array([[0.5, 0.0], [-0.5, 0.0], [0.0, 1.1], [0.0, -1.1]])
    h = np.concatenate([c[0] + off, c[1] + off])[:, None, :]  # [8, 1, 2]
    y = np.array([0] * 4 + [1] * 4)[:, None]
    ds = decision_margin(h, y, n_classes=2)
    # signed distance to the bisector x = 1: class 0 at x=0.5 -> 0.5; class 1 at x=1.5 -> 0.5
    assert float(ds["margin_min"][0]) == pytest.approx(0.5, rel=0, abs=1e-12)
    assert float(ds["margin_min_rel"][0]) == pytest.approx(0.5, rel=0, abs=1e-12)
    assert float(ds["frac_correct"][0]) == 1.0
    assert float(ds["frac_in_ball"][0]) == pytest.approx(4 / 8)  # |(0, 1.1)| = 1.1 >= M/2 = 1
    h_bad = h.copy()
    h_bad[0, 0] = [1.4, 0.0]
    h_bad[1, 0] = [-1.4, 0.0]  # keeps class-0 centroid at the origin
    bad = decision_margin(h_bad, y, n_classes=2)
    assert float(bad["margin_min"][0]) == pytest.approx(-0.4, rel=0, abs=1e-12)
    assert float(bad["frac_correct"][0]) == pytest.approx(7 / 8)


def test_binary_signed_error_neutral_oscillation():
    rng = np.random.default_rng(9)
    n, t = 200, 30
    tokens = rng.integers(0, 2, size=(n, t))
    labels = np.cumsum(tokens, axis=1) % 2  # parity
    sign = np.cumprod(np.where(tokens == 1, -1.0, 1.0), axis=1)  # error flips at token 1
    mag = np.concatenate([np.full(n // 2, 0.3), np.full(n // 2, -0.3)])  # symmetric pairs
    tokens[n // 2 :] = tokens[: n // 2]
    labels[n // 2 :] = labels[: n // 2]
    sign[n // 2 :] = sign[: n // 2]
    cent = np.array([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    e = mag[:, None] * sign  # [N, T] signed error along u = +x
    states = cent[labels] + e[..., None] * np.array([1.0, 0.0, 0.0])
    ds = binary_signed_error(states, labels, n_keep=4)
    np.testing.assert_allclose(ds["e_U"].values, e[:4], rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(ds["sign_flip_frac"].values[1:], (tokens[:, 1:] == 1).mean(0), rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(ds["abs_ratio_median"].values[1:], 1.0, rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(ds["e_U_absmax_rel"].values, 0.3, rtol=1e-7, atol=1e-12)
    assert bool(ds["inside_margin"])


def test_margin_vs_group_order_simplex():
    geoms = []
    for g in (6, 2, 3):
        cent = np.eye(g)  # regular simplex: (M/2)/radius = sqrt(g / (2 (g - 1)))
        labels = np.tile(np.arange(g), 10)[:, None].repeat(4, axis=1)  # [N, T]
        geoms.append(geometry_over_time(cent[labels], labels, n_classes=g))
    ds = margin_vs_group_order(geoms, ["S3", "C2", "C3"], [6, 2, 3])
    assert list(ds["group"].values) == ["C2", "C3", "S3"]
    expect = [np.sqrt(g / (2 * (g - 1))) for g in (2, 3, 6)]
    np.testing.assert_allclose(ds["half_margin_rel"].values, expect, rtol=1e-12, atol=0)


def test_overflowing_states_count_as_crossed_not_robust():
    """States that blow up past 1e150 from step 41 on: q = inf there, never 'robust'."""
    from dynlab.analysis import geometry_over_time

    rng = np.random.default_rng(0)
    n, t_len, s, g = 60, 60, 4, 3
    labels = rng.integers(0, g, size=(n, t_len))
    centroids = np.eye(g, s) * 10.0
    states = centroids[labels] + 0.1 * rng.standard_normal((n, t_len, s))
    states[:, 40:] *= 1e200
    with np.errstate(over="ignore", invalid="ignore"):
        geo = geometry_over_time(states, labels, n_classes=g)
    assert float(geo.q.sel(t=30)) < 0.5  # well separated before the blow-up
    assert np.isinf(geo.q.sel(t=slice(41, None))).all() and np.isinf(geo.R_par.sel(t=slice(41, None))).all()
    assert float(geo.T_cross) == 41.0 and str(geo.failure_mode.values) == "climb"
