"""Horizon forecast from the training length: when will the trained decoder start to misread?

``T_horizon`` predicts the max-pass length mp of a tracker from sequences no longer than
the training length t_ref (docs/error-control.md, "Horizon forecast").  Steps are 1-based.

For the readout features f_i(t) (the input of the final linear readout z = W f + b) of N
fresh sequences of length t_ref, with true classes a_i(t):

- **decoder margins**: μ_ig(t) = ((w_a − w_g)·f_i + b_a − b_g) / ‖w_a − w_g‖, the signed
  distance of sample i to the boundary between its class a and class g
  (:func:`dynlab.analysis.readability.readout_margins`);
- per ordered pair (a, g) at step t, over the samples of class a: the mean m_ag(t) (the
  centroid's distance to that boundary) and the unbiased standard deviation s_ag(t) (the
  error along the boundary normal); pairs with fewer than two samples of a are left out
  at that step;
- **scale**: ρ(t) = RMS over samples of ‖f_i(t)‖, and m̃ = m/ρ, s̃ = s/ρ.  A linear
  decoder's error rate depends on m/s only, and the normalised pair moves only when the
  geometry does, not when all states grow together (an exploding tracker);
- **drift** (Corollary 1: the error along U moves linearly in t): least-squares lines
  m̃_ag(t) ≈ α_ag + β_ag·t and s̃_ag(t) ≈ γ_ag + δ_ag·t over the fit window
  [⌈t_ref/2⌉, t_ref] (the window of the ``T_forecast_*`` forecasts).  β < 0 is the class
  drifting towards a boundary (a systematic error), δ > 0 the error spreading;
- **Gaussian error model**: class a is misread as g with probability
  Φ(−m̂_ag(t)/ŝ_ag(t)) (ŝ floored at 1e-12); its error is the union bound
  e_a(t) = min(1, Σ_g Φ(−m̂_ag/ŝ_ag)), and the predicted accuracy is
  A(t) = 1 − Σ_a π_a e_a(t), π_a the share of class a among the window's samples;
- **T_horizon** = the first integer t in [t_ref, horizon] with A(t) < ``threshold`` (0.9,
  the accuracy threshold of mp); NaN (censored) when A stays at or above it up to
  ``horizon``, or when no pair has two fitted steps.  When the measured accuracy of these
  sequences (argmax of the readout) is below ``threshold`` at ``persist`` consecutive steps
  t ≤ t_ref, T_horizon is the first of them (the observed failure, as for the
  ``T_forecast_*`` forecasts).

Everything is float64; nothing beyond step t_ref is run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import ndtr

from dynlab.analysis.geometry import crossing_time
from dynlab.analysis.centroids import class_stats, class_sums
from dynlab.analysis.fit import line_fit
from dynlab.analysis.readability import readout_margins

__all__ = ["MarginStats", "margin_statistics", "predicted_accuracy", "horizon_forecast"]

#: Spread floor of the Gaussian error model (a zero fitted spread reads as a certain decision).
_SPREAD_FLOOR = 1e-12

MarginStats = dict[str, np.ndarray]


def margin_statistics(f: Any, y: Any, weight: Any, bias: Any) -> MarginStats:
    """Per-step decoder-margin statistics of ``f [N, T, F]`` (readout features) with labels
    ``y [N, T]`` under the readout ``weight [G, F]``, ``bias [G]`` (module docstring).

    Returns:
        ``m, s [T, G, G]`` (mean and unbiased std of μ_ag over the samples of class a;
        NaN where a has fewer than two samples or on the diagonal), ``counts [T, G]``,
        ``scale [T]`` (RMS feature norm ρ) and ``accuracy [T]`` (fraction decoded correctly
        by the argmax of the readout; a non-finite feature counts as misread).
    """
    f = np.asarray(f, dtype=np.float64)
    y = np.asarray(y, dtype=np.int64)
    w = np.asarray(weight, dtype=np.float64)
    b = np.asarray(bias, dtype=np.float64)
    if f.ndim != 3 or y.shape != f.shape[:2] or w.shape != (b.shape[0], f.shape[2]):
        raise ValueError(f"f {f.shape}, y {y.shape}, weight {w.shape}, bias {b.shape}; allowed: [N, T, F], [N, T], [G, F], [G]")
    g = w.shape[0]
    with np.errstate(invalid="ignore", over="ignore"):
        mu = readout_margins(f, y, w, b)  # [N, T, G]
        counts, mean, onehot = class_stats(mu, y, g)  # [T, A], [T, A, G] class means of μ, [N, T, A]
        dev = mu - mean[np.arange(y.shape[1])[None, :], y]  # [N, T, G] μ minus its class mean
        var = class_sums(onehot, dev**2) / np.maximum(counts - 1.0, 1.0)[..., None]
        scale = np.sqrt((f**2).sum(-1).mean(0))  # [T]
        others = np.where(np.arange(g) == y[..., None], np.inf, mu)  # [N, T, G]
        accuracy = (np.isfinite(f).all(-1) & (others.min(-1) > 0)).mean(0)  # [T]
    valid = (counts >= 2)[:, :, None] & ~np.eye(g, dtype=bool)[None]  # [T, A, G]
    return {
        "m": np.where(valid, mean, np.nan),
        "s": np.where(valid, np.sqrt(var), np.nan),
        "counts": counts,
        "scale": scale,
        "accuracy": accuracy,
    }


def predicted_accuracy(stats: MarginStats, t_ref: int, steps: Any, fit_from: int | None = None) -> np.ndarray:
    """Accuracy A(t) ``[len(steps)]`` of the Gaussian error model with the margins and
    spreads extrapolated linearly from the fit window [fit_from, t_ref] (module docstring;
    ``fit_from`` default ⌈t_ref/2⌉).  NaN when no pair has two fitted steps."""
    m, s = stats["m"], stats["s"]
    n_t, g = m.shape[0], m.shape[1]
    if not 1 <= t_ref <= n_t:
        raise ValueError(f"t_ref={t_ref}; allowed: 1..{n_t} (the steps of the statistics)")
    lo = math.ceil(t_ref / 2) if fit_from is None else int(fit_from)
    if not 1 <= lo <= t_ref:
        raise ValueError(f"fit_from={fit_from}; allowed: 1..t_ref={t_ref}")
    t = np.arange(lo, t_ref + 1, dtype=np.float64)
    win = slice(lo - 1, t_ref)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = stats["scale"][win][:, None]  # [W, 1]
        m_n = (m[win] / scale[..., None]).reshape(t.size, g * g)  # [W, G·G]
        s_n = (s[win] / scale[..., None]).reshape(t.size, g * g)
    m_ok = np.where(np.isfinite(m_n) & np.isfinite(s_n), m_n, np.nan)
    s_ok = np.where(np.isfinite(m_ok), s_n, np.nan)
    am, bm = line_fit(t, m_ok)
    as_, bs = line_fit(t, s_ok)
    fitted = np.isfinite(am) & np.isfinite(as_)  # [G·G]
    if not fitted.any():
        return np.full(np.size(steps), np.nan)
    ts = np.asarray(steps, dtype=np.float64)[:, None]  # [S, 1]
    m_hat = am[fitted] + bm[fitted] * ts  # [S, K]
    s_hat = np.maximum(as_[fitted] + bs[fitted] * ts, _SPREAD_FLOOR)
    p_pair = np.zeros((ts.shape[0], g * g))
    p_pair[:, fitted] = ndtr(-m_hat / s_hat)
    err = np.minimum(p_pair.reshape(-1, g, g).sum(-1), 1.0)  # [S, A] union bound over g
    counts = stats["counts"][win].sum(0)  # [A]
    share = counts / counts.sum()
    return 1.0 - err @ share


def horizon_forecast(
    stats: MarginStats,
    t_ref: int,
    horizon: int,
    *,
    threshold: float = 0.9,
    persist: int = 3,
    fit_from: int | None = None,
) -> float:
    """``T_horizon``: the first step at which the predicted accuracy falls below
    ``threshold`` (module docstring); the observed failure when it lies inside t ≤ t_ref.

    Args:
        stats: :func:`margin_statistics` of steps 1..T with T ≥ t_ref.
        t_ref: training length (the last step read).
        horizon: the last step searched (the evaluated horizon); NaN beyond it.
        threshold: accuracy threshold in (0, 1) (mp's, 0.9).
        persist: consecutive steps of measured accuracy below threshold that count as an
            observed failure inside the training length.
        fit_from: first step of the fit window (default ⌈t_ref/2⌉).
    """
    if not 0 < threshold < 1:
        raise ValueError(f"threshold={threshold}; allowed: a float in (0, 1)")
    if horizon < t_ref:
        raise ValueError(f"horizon={horizon}; allowed: an integer >= t_ref={t_ref}")
    acc = np.asarray(stats["accuracy"][:t_ref], dtype=np.float64)
    seen, failed = crossing_time(1.0 - acc, 1.0 - threshold + 1e-12, np.arange(1, t_ref + 1), persist)
    if failed:
        return float(seen)
    steps = np.arange(t_ref, int(horizon) + 1)
    a = predicted_accuracy(stats, t_ref, steps, fit_from)
    below = np.flatnonzero(a < threshold)  # NaN compares False: no forecast
    return float(steps[below[0]]) if below.size else float("nan")
