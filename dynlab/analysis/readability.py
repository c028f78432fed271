"""Decoder-aligned readability: how close the spread of the states comes to a decision boundary.

The literal ratio q = R/M (:mod:`dynlab.analysis.geometry`) compares the RMS scatter over
*every* direction with the smallest centroid distance.  That is a sufficient condition for
readability, far from a necessary one: a decoder only sees the error along the directions
that separate two classes.  A tracker that parks a large error in U⊥, or along directions
between classes that are far apart, is still read perfectly while q ≥ 0.5.  The ratios
here keep only the error a decoder sees.

**Pairwise ratio, nearest-centroid decoder** (``q_pair``).  For two present classes a, g at
step t with centroids c_a, c_g, distance d_ag = ||c_a - c_g|| and unit vector
u_ag = (c_a - c_g)/d_ag, the nearest-centroid decision between a and g depends only on the
projection of the state on u_ag: a state of class a is misread as g exactly when its
residual r = h - c_a has <r, -u_ag> > d_ag / 2.  With the pooled within-pair spread

    s_ag² = ( Σ_{i ∈ a} <r_i, u_ag>² + Σ_{i ∈ g} <r_i, u_ag>² ) / (n_a + n_g - 2)

(unbiased: each class's centroid uses up one degree of freedom along u_ag), the pair's ratio
is s_ag / d_ag and ``q_pair(t)`` is the worst (largest) pair.  **Threshold τ = 0.5**: at
s/d = 1/2 the RMS projected error reaches the decision boundary at d/2.  Below it the
typical state is read correctly; for Gaussian errors the pair's misread rate at τ is
Φ(-1) ≈ 16 %, and it falls to 2 % at s/d = 1/4.  A pair with d_ag = 0 (two classes merged,
e.g. a collapsed tracker) has ratio +inf: it cannot be read.

**Trained-decoder ratio** (``q_dec``).  The trained linear readout z = W f + b scores class
a against g with the hyperplane (w_a - w_g)·f + b_a - b_g = 0.  For a feature vector f of
class a, μ_ag = ((w_a - w_g)·f + b_a - b_g) / ||w_a - w_g|| is its signed distance to that
boundary (positive on the correct side); m_ag = mean of μ_ag over class a (the centroid's
distance, as μ is linear) and σ_ag² its unbiased variance over class a.  The ratio is
σ_ag / (2 m_ag), +inf when m_ag ≤ 0 (the class centroid itself is misread), and ``q_dec``
is the worst ordered pair (a present with ≥ 2 samples, g any other class of the readout).
The factor 2 puts it on the scale of ``q_pair``: for the nearest-centroid readout
(w_a = c_a, b_a = -||c_a||²/2) the boundary normal is u_ag and m_ag = d_ag / 2, so the two
ratios agree when the classes have equal spreads.  Same τ = 0.5, same reason: the RMS
error along the boundary normal reaches the boundary.

**Reference separation** (``*_ref``): the same spreads divided by the distances (d_ag or
m_ag) of a reference step t_ref (the training length), the "initial between-class
separation", instead of those at step t.

**Linear probe** (:func:`fit_probe`): a multinomial logistic regression (scikit-learn)
fitted on states at t_ref and applied unchanged at every step; its accuracy(t) needs no
threshold on a ratio and no assumption about the decoder.

Every function here works on one time chunk, ``h [N, Tc, F]`` (float64) with labels
``y [N, Tc]``, and returns ``[Tc]`` arrays, so the caller can stream arbitrarily long
sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dynlab.analysis.centroids import class_stats, class_sums, pair_distances

__all__ = ["decoder_ratio", "fit_probe", "pairwise_ratio", "probe_accuracy", "readout_margins"]


def pairwise_ratio(
    h: np.ndarray, y: np.ndarray, n_classes: int, ref_dist: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Worst-pair projected ratio ``q_pair`` (module docstring) for one chunk.

    Args:
        h: ``[N, Tc, F]`` states; y: ``[N, Tc]`` labels in ``0..n_classes-1``.
        ref_dist: ``[G, G]`` reference pair distances (NaN for pairs absent then); when given,
            the spreads are divided by these instead of the distances at each step.

    Returns:
        ``q_pair [Tc]`` (NaN when fewer than two classes are present), ``min_count [Tc]``
        (smallest count of a present class) and, with ``ref_dist``, ``q_pair_ref [Tc]``.
    """
    counts, cent, onehot = class_stats(h, y, n_classes)
    tc = h.shape[1]
    resid = h - cent[np.arange(tc)[None, :], y]  # [N, Tc, F]
    dots = np.matmul(resid.transpose(1, 0, 2), cent.transpose(0, 2, 1)).transpose(1, 0, 2)  # [N, Tc, G]  <r_i, c_g>
    own = np.take_along_axis(dots, y[..., None], axis=-1)  # [N, Tc, 1]  <r_i, c_{y_i}>
    proj2 = (own - dots) ** 2  # [N, Tc, G]  <r_i, c_{y_i} - c_g>² = d² <r_i, u>²
    s2 = class_sums(onehot, proj2)  # [Tc, G, G]  sum over class a toward g
    pooled = s2 + np.swapaxes(s2, 1, 2)  # [Tc, G, G] both classes of the pair
    present = counts > 0
    dof = counts[:, :, None] + counts[:, None, :] - 2.0  # [Tc, G, G]
    pair = present[:, :, None] & present[:, None, :] & ~np.eye(n_classes, dtype=bool) & (dof > 0)
    dist = pair_distances(cent, present)  # [Tc, G, G], NaN for a pair with an absent class
    proj_var = np.where(pair, pooled, 0.0) / np.where(pair, dof, 1.0)  # [Tc, G, G]  d² s²
    safe = np.where(dist > 0, dist, 1.0)
    spread = np.sqrt(proj_var) / safe  # [Tc, G, G]  s, the RMS projected residual
    out = {
        "q_pair": _worst(spread / safe, pair, dist > 0),
        "min_count": np.where(present, counts, np.inf).min(1),
    }
    if ref_dist is not None:
        ref = np.asarray(ref_dist, dtype=np.float64)[None]  # [1, G, G]
        ok = pair & np.isfinite(ref)
        out["q_pair_ref"] = _worst(spread / np.where(ok & (ref > 0), ref, 1.0), ok, (dist > 0) & (ref > 0))
    return out


def _worst(ratio: np.ndarray, valid: np.ndarray, finite: np.ndarray) -> np.ndarray:
    """Max of ``ratio [Tc, G, G]`` over valid pairs; +inf where a valid pair is not ``finite``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(valid, np.where(finite, ratio, np.inf), -np.inf)
    worst = r.max(axis=(1, 2))
    return np.where(valid.any(axis=(1, 2)), worst, np.nan)


def readout_margins(f: np.ndarray, y: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Signed boundary distances ``μ [N, Tc, G]`` of each sample to its class's boundaries.

    ``μ[i, t, g] = ((w_a - w_g)·f + b_a - b_g) / ||w_a - w_g||`` with a = y[i, t]; 0 at g = a
    and wherever ``w_a = w_g``.
    """
    g = weight.shape[0]
    z = f @ weight.T + bias  # [N, Tc, G]
    own = np.take_along_axis(z, y[..., None], axis=-1)  # [N, Tc, 1]
    wn = np.linalg.norm(weight[:, None, :] - weight[None, :, :], axis=-1)  # [G, G]
    wn_row = wn[y]  # [N, Tc, G]
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(wn_row > 0, (own - z) / np.where(wn_row > 0, wn_row, 1.0), 0.0)
    return np.where(np.arange(g) == y[..., None], 0.0, mu)


def decoder_ratio(
    f: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    ref_margin: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Worst-pair trained-decoder ratio ``q_dec`` (module docstring) for one chunk.

    Args:
        f: ``[N, Tc, F]`` the readout's input; y: ``[N, Tc]`` labels.
        weight: ``[G, F]``, bias ``[G]``: the final linear readout (rows = classes).
        ref_margin: ``[G, G]`` centroid-to-boundary distances m_ag at a reference step (NaN
            where class a was absent); when given, also ``q_dec_ref``.

    Returns:
        ``q_dec [Tc]``, ``dec_margin [Tc]`` (smallest m_ag over the pairs, in feature units)
        and, with ``ref_margin``, ``q_dec_ref [Tc]``.
    """
    n_classes = weight.shape[0]
    mu = readout_margins(f, y, weight, bias)  # [N, Tc, G]
    counts, m, onehot = class_stats(mu, y, n_classes)  # [Tc, A], [Tc, A, G] class mean of μ, [N, Tc, A]
    # unbiased variance, two-pass for accuracy: Σ (μ - m_a)² over class a
    dev = mu - m[np.arange(y.shape[1])[None, :], y]  # [N, Tc, G]  μ minus its class mean
    var = class_sums(onehot, dev**2) / np.maximum(counts - 1.0, 1.0)[..., None]
    wn = np.linalg.norm(weight[:, None, :] - weight[None, :, :], axis=-1)  # [G, G]
    valid = (counts >= 2)[:, :, None] & ~np.eye(n_classes, dtype=bool)[None] & (wn > 0)[None]  # [Tc, A, G]
    spread = np.sqrt(var)
    out = {
        "q_dec": _worst(spread / (2.0 * np.where(m > 0, m, 1.0)), valid, m > 0),
        "dec_margin": np.where(valid.any((1, 2)), np.where(valid, m, np.inf).min((1, 2)), np.nan),
    }
    if ref_margin is not None:
        ref = np.asarray(ref_margin, dtype=np.float64)[None]
        ok = valid & np.isfinite(ref)
        out["q_dec_ref"] = _worst(spread / (2.0 * np.where(ok & (ref > 0), ref, 1.0)), ok, ref > 0)
    return out


def fit_probe(states: Any, labels: Any, seed: int = 0):
    """Multinomial logistic-regression probe (scikit-learn) on ``states [N, F]``, ``labels [N]``.

    Features are standardised first (a ``StandardScaler`` in the same pipeline); L2
    penalty C = 1.0, lbfgs, up to 1000 iterations.  Returns the fitted pipeline, or None when
    fewer than two classes are present (nothing to separate).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x = np.asarray(states, dtype=np.float64)
    yy = np.asarray(labels, dtype=np.int64)
    if np.unique(yy).size < 2 or not np.isfinite(x).all():
        return None
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000, random_state=seed))
    return probe.fit(x, yy)


def probe_accuracy(probe, h: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Fraction of correct probe predictions at each step of ``h [N, Tc, F]``, ``y [N, Tc]``.

    Steps whose states are not finite (an exploding tracker) score 0.
    """
    n, tc, f = h.shape
    if probe is None:
        return np.full(tc, np.nan)
    flat = h.transpose(1, 0, 2).reshape(tc * n, f)  # [Tc·N, F] time-major
    ok = np.isfinite(flat).all(1) & (np.abs(flat).max(1, initial=0.0) < 1e150)
    pred = np.full(tc * n, -1, dtype=np.int64)
    if ok.any():
        pred[ok] = probe.predict(flat[ok])
    return (pred.reshape(tc, n) == y.T).mean(1)
