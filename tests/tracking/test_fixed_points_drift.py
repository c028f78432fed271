"""Corollary 1 from the return maps (dynlab.tracking.analysis.fixed_points.drift) on affine maps whose drift along
U and crossing time are known in closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlab.analysis.fixed_points.finder import find_fixed_points
from dynlab.tracking.analysis.fixed_points.drift import corollary1_crossing, mean_drift, return_map_drift


def _affine(a: np.ndarray, b: np.ndarray):
    at, bt = torch.as_tensor(a), torch.as_tensor(b)
    return lambda h: at @ h + bt


def test_translation_along_U_drifts_linearly_and_crosses_when_predicted():
    """F(h) = A h + b with A = I on U = span(e0, e1) (Theorem 1) and 0.5 on U⊥, b_U = (0.3, 0.4):
    no fixed point, every pass of a word of 5 tokens adds b_U along U, so η̄ = 0.5/5 = 0.1 per
    token, and an error of 0.2 reaches 1.2 after 10 tokens, two words (t_ref = 60: t = 70).
    Iterating the map reproduces it exactly."""
    a = np.diag([1.0, 1.0, 0.5, 0.5])
    b = np.array([0.3, 0.4, 1.0, -2.0])
    basis = np.eye(4)[:, :2]
    fn = _affine(a, b)
    assert not find_fixed_points(fn, np.zeros((1, 4))).found  # a translation along U: none
    c = np.array([0.12, 0.16, 3.0, 1.0])  # error 0.2 along U, along b_U
    eta = return_map_drift(fn, c, basis, word_length=5)
    assert eta == pytest.approx(0.1, rel=1e-12, abs=1e-12)
    t = corollary1_crossing(0.2, eta, 1.2, 60)
    assert t == pytest.approx(70.0, rel=1e-12, abs=1e-12)
    h, words = torch.as_tensor(c), 0
    while float(torch.linalg.norm(h[:2])) < 1.2 - 1e-12:
        h, words = fn(h), words + 1
    assert 60 + 5 * words == pytest.approx(t, rel=1e-12, abs=1e-12)


def test_drift_is_the_offset_from_the_fixed_point_through_A_minus_I():
    """With a fixed point h*, F(c) − c = (A − I)(c − h*): the drift along U is ‖Bᵀ(A − I)(c − h*)‖/|w|
    (here A = 0.9 on U: the class is pulled towards h*, so the state at h* does not drift)."""
    rng = np.random.default_rng(1)
    a = np.diag([0.9, 0.9, 0.3])
    b = rng.standard_normal(3)
    fn = _affine(a, b)
    h_star = find_fixed_points(fn, rng.standard_normal((2, 3))).points[0]
    np.testing.assert_allclose(h_star, np.linalg.solve(np.eye(3) - a, b), rtol=1e-7, atol=1e-12)
    basis = np.eye(3)[:, :2]
    c = h_star + np.array([0.5, -0.2, 4.0])
    want = np.linalg.norm(basis.T @ (a - np.eye(3)) @ (c - h_star)) / 3
    assert return_map_drift(fn, c, basis, word_length=3) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert return_map_drift(fn, h_star, basis, word_length=3) == pytest.approx(0.0, rel=0, abs=1e-12)


def test_mean_drift_averages_over_words_and_points():
    a = np.eye(2)
    maps = [_affine(a, np.array([0.2, 0.0])), _affine(a, np.array([0.0, 0.6]))]
    basis = np.eye(2)[:, :1]  # U = span(e0): the second map does not drift along U
    eta = mean_drift(maps, [2, 3], np.zeros((2, 2)), basis)
    assert eta == pytest.approx((0.1 + 0.1 + 0.0 + 0.0) / 4, rel=1e-12, abs=1e-12)
    assert np.isnan(mean_drift(maps, [2, 3], np.zeros((1, 2)), np.zeros((2, 0))))  # U empty


def test_crossing_rules():
    assert corollary1_crossing(0.6, 0.1, 0.5, 60) == 60.0  # crossed already at t_ref
    assert np.isnan(corollary1_crossing(0.1, 0.0, 0.5, 60))  # no drift: never
    assert np.isnan(corollary1_crossing(0.1, -0.1, 0.5, 60))
    assert np.isnan(corollary1_crossing(0.1, 0.001, 0.5, 60, horizon=100))  # beyond the horizon
    assert corollary1_crossing(0.1, 0.01, 0.5, 60, horizon=100) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="word_length"):
        return_map_drift(lambda h: h, np.zeros(2), np.eye(2), 0)
