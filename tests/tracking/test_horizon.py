"""The horizon forecast T_horizon on cases whose answer is known in closed form."""

import math

import numpy as np
import pytest
import torch
from scipy.stats import norm

from dynlab.tracking.analysis.spec import AnalysisSpec
from dynlab.tracking.analysis.pipeline import analyze_tracker
from dynlab.tracking.analysis.horizon import horizon_forecast, margin_statistics, predicted_accuracy
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Cell, Tracker, register_cell
from dynlab.tracking.task import WordProblem


def _stats(m: np.ndarray, s: np.ndarray, n_classes: int, scale: np.ndarray | None = None) -> dict:
    """Statistics of T steps where every ordered pair has margin ``m [T]`` and spread ``s [T]``."""
    t = m.size
    off = ~np.eye(n_classes, dtype=bool)
    return {
        "m": np.where(off, m[:, None, None], np.nan),
        "s": np.where(off, s[:, None, None], np.nan),
        "counts": np.full((t, n_classes), 100.0),
        "scale": np.ones(t) if scale is None else scale,
        "accuracy": np.ones(t),
    }


def _first_step_above(x: float) -> int:
    """The first integer step strictly above x."""
    return math.floor(x) + 1


def test_margin_drifting_at_a_constant_rate_exhausts_at_the_closed_form_step():
    # m(t) = m0 − v t, s constant: A(t) = Φ(m/s) < 0.9  ⇔  t > (m0 − z σ) / v, z = Φ⁻¹(0.9)
    t = np.arange(1, 61, dtype=np.float64)
    m0, v, sigma = 2.0, 0.01, 0.5
    stats = _stats(m0 - v * t, np.full(60, sigma), 2)
    expected = _first_step_above((m0 - norm.ppf(0.9) * sigma) / v)
    assert expected == 136
    assert horizon_forecast(stats, 60, 1000) == expected
    # the same geometry in states that all grow by 5 % a step: the forecast reads m/s only
    grow = 1.05**t
    scaled = _stats((m0 - v * t) * grow, np.full(60, sigma) * grow, 2, scale=grow)
    assert horizon_forecast(scaled, 60, 1000) == expected
    # beyond the evaluated horizon: censored
    assert np.isnan(horizon_forecast(stats, 60, 120))


def test_spread_growing_linearly_and_the_union_bound_over_classes():
    # m constant, s(t) = δ t (Corollary 1 with e_U(0) = 0); S3 has 5 rivals per class, so the
    # union bound puts the class error at 5 Φ(−m/s) and A < 0.9 ⇔ m/s < Φ⁻¹(1 − 0.1/5)
    t = np.arange(1, 61, dtype=np.float64)
    m, delta = 3.0, 0.004
    stats = _stats(np.full(60, m), delta * t, 6)
    expected = _first_step_above(m / (norm.ppf(1 - 0.1 / 5) * delta))
    assert horizon_forecast(stats, 60, 5000) == expected
    steps = np.array([60.0, 300.0])
    np.testing.assert_allclose(predicted_accuracy(stats, 60, steps), 1 - 5 * norm.cdf(-m / (delta * steps)), rtol=1e-12, atol=0)


def test_no_drift_is_censored_and_an_observed_failure_is_its_own_step():
    stats = _stats(np.full(60, 1.0), np.full(60, 0.1), 2)
    assert np.isnan(horizon_forecast(stats, 60, 1000))
    acc = np.ones(60)
    acc[[9, 19, 20, 21]] = 0.5  # one dip at 10 does not persist; 20–22 do
    stats["accuracy"] = acc
    assert horizon_forecast(stats, 60, 1000) == 20.0


def test_refusals_name_the_field():
    stats = _stats(np.full(10, 1.0), np.full(10, 0.1), 2)
    with pytest.raises(ValueError, match="threshold"):
        horizon_forecast(stats, 10, 100, threshold=1.0)
    with pytest.raises(ValueError, match="horizon"):
        horizon_forecast(stats, 10, 5)
    with pytest.raises(ValueError, match="t_ref"):
        predicted_accuracy(stats, 11, [11])
    with pytest.raises(ValueError, match="allowed"):
        margin_statistics(np.zeros((4, 3, 2)), np.zeros((4, 2), dtype=int), np.zeros((2, 2)), np.zeros(2))


def test_margin_statistics_against_a_direct_count():
    rng = np.random.default_rng(0)
    f = rng.standard_normal((50, 4, 3))
    y = rng.integers(0, 3, size=(50, 4))
    w, b = rng.standard_normal((3, 3)), rng.standard_normal(3)
    st = margin_statistics(f, y, w, b)
    t, a, g = 2, 1, 2
    rows = f[y[:, t] == a, t]
    mu = (rows @ (w[a] - w[g]) + b[a] - b[g]) / np.linalg.norm(w[a] - w[g])
    np.testing.assert_allclose(st["m"][t, a, g], mu.mean(), rtol=1e-12, atol=0)
    np.testing.assert_allclose(st["s"][t, a, g], mu.std(ddof=1), rtol=1e-12, atol=0)
    np.testing.assert_allclose(st["scale"][t], np.sqrt((f[:, t] ** 2).sum(-1).mean()), rtol=1e-12, atol=0)
    np.testing.assert_allclose(st["accuracy"][t], ((f[:, t] @ w.T + b).argmax(-1) == y[:, t]).mean())
    assert np.isnan(st["m"][t, a, a])


# -- a tracker whose drift along the decision normal is set by construction ----------------

DRIFT = {"c": 0.01, "kappa": 2.0, "eta": 0.1, "radius": 10.0}


@register_cell("test-drift")
class DriftCell(Cell):
    """C2 tracker: state (one-hot parity, step count k, ξ = ±η by the last token).

    Readout features (s·a(k), sqrt(R² − a²), ξ) with s = ±1 the parity and a(k) = 1 − c·k:
    their norm is constant, and with readout rows ±(1, 0, κ) every sample's margin is
    (a(t) ± κξ)/sqrt(1 + κ²), so the class margin drifts by −c/sqrt(1 + κ²) a step while
    its spread stays κη/sqrt(1 + κ²): A(t) < 0.9 ⇔ a(t) < Φ⁻¹(0.9)·κη.
    """

    family = "affine"

    def __init__(self, d_in: int, hidden: int, nonlinearity=None, **_):
        super().__init__(d_in, hidden, 4, 3, nonlinearity)

    def precompute(self, u):  # u [B, T, 2] one-hot tokens (0 = identity, 1 = flip)
        return {"u": u}

    def transition(self, h, p):
        flip = p["u"][:, 1:2]  # [B, 1]
        parity = h[:, :2] * (1 - flip) + h[:, :2].flip(-1) * flip
        xi = DRIFT["eta"] * (p["u"][:, 1:2] - p["u"][:, 0:1])
        return torch.cat([parity, h[:, 2:3] + 1, xi], dim=-1)

    def readout(self, hs, p):  # hs [B, T, 4] -> [B, T, 3]
        s = hs[..., 0:1] - hs[..., 1:2]
        a = 1 - DRIFT["c"] * hs[..., 2:3]
        return torch.cat([s * a, torch.sqrt(DRIFT["radius"] ** 2 - a**2), hs[..., 3:4]], dim=-1)


def _drift_tracker(c: float) -> Tracker:
    DRIFT["c"] = c
    m = Tracker("test-drift", 2, 2, hidden=4, d_embed=2).double()
    with torch.no_grad():
        m.embed.weight.copy_(torch.eye(2))
        m.readout.weight.copy_(torch.tensor([[1.0, 0.0, DRIFT["kappa"]], [-1.0, 0.0, -DRIFT["kappa"]]]))
        m.readout.bias.zero_()

    def init_state(batch, device=None, dtype=None):
        h = torch.zeros(batch, 4, device=device, dtype=dtype or torch.float64)
        h[:, 0] = 1.0
        return h

    m.init_state = init_state  # type: ignore[method-assign]
    return m


SPEC = AnalysisSpec(n_samples=64, perturb_samples=16, perturb_steps=5, lyap_samples=2, lyap_steps=5, n_words=2)


@pytest.fixture
def restore_drift():
    saved = dict(DRIFT)
    yield
    DRIFT.update(saved)


@pytest.mark.usefixtures("restore_drift")
def test_tracker_with_a_set_drift_gets_the_closed_form_horizon():
    task = WordProblem(get_group("C2"))
    c, ke = 0.01, DRIFT["kappa"] * DRIFT["eta"]
    ds = analyze_tracker(_drift_tracker(c), task, SPEC, horizon=300, t_ref=60)
    expected = _first_step_above((1 - norm.ppf(0.9) * ke) / c)  # 75; the q_dec = τ rule would give 80
    assert expected == 75
    assert abs(float(ds["T_horizon"]) - expected) <= 1, float(ds["T_horizon"])
    assert ds["T_horizon"].attrs["units"] == "tokens"
    # a drift four times slower: four times the distance to cover
    ds = analyze_tracker(_drift_tracker(c / 4), task, SPEC, horizon=400, t_ref=60)
    assert abs(float(ds["T_horizon"]) - _first_step_above((1 - norm.ppf(0.9) * ke) / (c / 4))) <= 3
    # no drift: never
    assert np.isnan(float(analyze_tracker(_drift_tracker(0.0), task, SPEC, horizon=400, t_ref=60)["T_horizon"]))


@pytest.mark.usefixtures("restore_drift")
def test_tracker_failing_inside_the_training_length_reports_the_observed_step():
    # a(t) < κη (half the samples misread) from t > 0.8/0.021 = 38.1: T_horizon = 39 exactly
    ds = analyze_tracker(_drift_tracker(0.021), WordProblem(get_group("C2")), SPEC, horizon=200, t_ref=60)
    assert float(ds["T_horizon"]) == 39.0
