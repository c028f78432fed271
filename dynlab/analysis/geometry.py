"""Geometry of hidden states over time: centroids, symbolic subspace U, scatter, q(t), T_cross.

Definitions (paper A; docs/error-control.md), for the states h_i(t) of one layer of N sequences with true
group states (labels) g_i(t) at step t (1-based: h(t) is the state after t tokens):

- class centroid   c_g(t) = mean of h_i(t) over the sequences i with g_i(t) = g; only classes
  *present* at t (at least one sequence) take part in everything below;
- separation       M(t) = min_{g != g'} ||c_g(t) - c_g'(t)||  (NaN when fewer than 2 classes);
- scatter          R(t) = sqrt( sum_i ||h_i(t) - c_{g_i(t)}(t)||^2 / (N - G_t) ), the RMS distance of
  a state to its own class centroid with the pooled unbiased denominator (G_t = classes present:
  each estimated centroid uses up one sample; with (1/N) instead, a group with many classes and
  few samples per class looks far tighter than it is — at 128 samples over 120 classes the
  plain mean gave about half the true R).  Every sequence weighs the same, so classes weigh
  by count;
- ratio            q(t) = R(t) / M(t);
- symbolic subspace U(t) = span{c_g(t) - c_g'(t)} = span{c_g(t) - cbar(t)} with cbar the mean
  of the present centroids.  Orthonormal basis: right singular vectors of the centred centroid
  matrix whose singular values exceed ``rank_tol`` times the largest one (relative tolerance);
- R_par(t), R_perp(t): RMS of the residual h_i - c_{g_i} projected on U(t) and on its
  orthogonal complement (same denominator), so R^2 = R_par^2 + R_perp^2;
- centroid radius  r_c(t) = sqrt( mean over present g of ||c_g(t) - cbar(t)||^2 ) (scale of
  the symbolic configuration, used by :mod:`dynlab.analysis.margin`).

Readability threshold tau: 0.5 for a nearest-centroid decoder (a state closer than M/2 to its
own centroid is decoded correctly).  Alternative (``threshold="readout"``): the trained linear
readout z = W h + b gives tau_readout(t) = m(t) / M(t) with
m(t) = min over present g != g' of ((w_g - w_g')·c_g + b_g - b_g') / ||w_g - w_g'||, the
smallest distance from a class centroid to one of its own readout decision boundaries
(negative when a centroid itself is misread).  For the nearest-centroid readout this equals
M/2, i.e. tau = 0.5, so the two thresholds are on the same scale.

T_cross (persistence rule): the first evaluated step t with q >= tau at t and at the next
``persist - 1`` evaluated steps (``persist`` consecutive evaluated steps in all).  A run whose
last stretch above tau is shorter than ``persist`` at the horizon is *not* counted as crossed.
NaN q (fewer than two classes present) counts as below tau.  Merged classes (M = 0 with two
or more classes present, e.g. a collapsed tracker whose states are all equal) give q = +inf:
they cannot be told apart, so such a tracker has failed, never 'robust'.  When no step qualifies, T_cross is
NaN (censored at the horizon) and ``crossed`` is False.

Overflow: at steps where the states are not finite (or the centroids exceed 1e150, an
exploding tracker), R, R_par and R_perp are +inf, M is NaN and q = +inf, so the run counts
as crossed there; the Corollary-1 fit uses finite points only.

Failure mode: 'saturation' when crossed with T_cross <= ``saturation_t`` (q above threshold
from the first steps; note R(1) = 0 whenever the initial state is fixed, as h(1) depends on
the first token only, so "from the start" needs a grace of a few steps), 'climb' when crossed
later, 'robust' when never crossed within the horizon.

Corollary 1 (near-affine trackers): e_U(t) := R_par(t) ≈ e_U(0) + t·eta.  eta and e_U(0) are
fitted by ordinary least squares over the evaluated steps in ``fit_window`` (default: from
t = 1 up to T_cross when crossed, else the whole horizon).  The predicted crossing is the t at
which the fit reaches the mean threshold level over the window, mean(tau(t)·M(t)):
T_cross_par_pred = (mean(tau·M) - e_U(0)) / eta; +inf when eta <= 0, NaN when fewer than two
steps lie in the window.  Because it fits R_par against tau·M, it predicts the crossing of
q_par = R_par/M (``T_cross_par`` in :func:`dynlab.tracking.analysis.pipeline.analyze_tracker`), not that
of q; hence its name.

The definitions above are computed in one chunked pass over the states; the helpers here
are the pieces of that pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import xarray as xr

from dynlab.analysis.centroids import as_numpy, centre, check_labels, class_centroids, class_stats, pair_distances, separation
from dynlab.analysis.fit import line_fit
from dynlab.results.vocabulary import annotate

__all__ = [
    "class_centroids",  # from dynlab.analysis.centroids
    "symbolic_basis",
    "geometry_over_time",
    "readout_tau",
    "crossing_time",
    "failure_mode",
]

DEFAULT_ELEMENTS_PER_CHUNK = 4_000_000


def symbolic_basis(centroids: Any, rank_tol: float = 1e-6) -> np.ndarray:
    """Orthonormal basis of U = span{c_g - c_g'} from a set of centroids.

    Args:
        centroids: ``[G, S]`` class centroids; rows containing NaN (absent classes) are ignored.
        rank_tol: relative rank tolerance: a singular direction of the centred centroid matrix
            is kept when its singular value exceeds ``rank_tol`` times the largest.

    Returns:
        basis ``[S, k]`` with orthonormal columns, k <= min(G - 1, S) (k = 0 when all centroids
        coincide or fewer than two are given).
    """
    c = as_numpy(centroids)
    if c.ndim != 2:
        raise ValueError(f"centroids must be [G, S]; got shape {c.shape}")
    if not rank_tol > 0:
        raise ValueError(f"rank_tol={rank_tol}; allowed: a positive float")
    c = c[~np.isnan(c).any(axis=1)]  # [G', S]
    if c.shape[0] < 2:
        return np.zeros((c.shape[1], 0))
    d = c - c.mean(axis=0, keepdims=True)  # [G', S]
    _, s, vh = np.linalg.svd(d, full_matrices=False)
    keep = s > rank_tol * s[0] if s[0] > 0 else np.zeros_like(s, dtype=bool)
    return vh[keep].T.copy()  # [S, k]


def readout_tau(centroids: Any, weight: Any, bias: Any | None = None) -> float:
    """Readout-based threshold tau_readout = m / M for one set of centroids (module docstring).

    Args:
        centroids: ``[G, S]`` class centroids (NaN rows = absent classes, ignored).
        weight: ``[C, S]`` readout weight (C >= G; row g scores class g).
        bias: ``[C]`` readout bias (default zeros).
    """
    c = as_numpy(centroids)
    w = as_numpy(weight)
    b = np.zeros(w.shape[0]) if bias is None else as_numpy(bias)
    if w.ndim != 2 or w.shape[1] != c.shape[1] or w.shape[0] < c.shape[0]:
        raise ValueError(f"weight must be [C>=G, S]={c.shape}; got {w.shape}")
    present = ~np.isnan(c).any(axis=1)
    m, big_m = _readout_margin(c[None], present[None], w, b)
    return float(m[0] / big_m[0])


def _readout_margin(c: np.ndarray, present: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Readout margin m(t) and separation M(t) for centroids ``c [T, G, S]``, ``present [T, G]``."""
    g = c.shape[1]
    c0 = np.where(present[..., None], c, 0.0)  # [T, G, S]
    wd = w[:g, None, :] - w[None, :g, :]  # [G, G', S]  w_g - w_g'
    bd = b[:g, None] - b[None, :g]  # [G, G']
    wn = np.linalg.norm(wd, axis=-1)  # [G, G']
    score = np.einsum("tgs,ghs->tgh", c0, wd) + bd  # [T, G, G']
    pair = present[:, :, None] & present[:, None, :] & ~np.eye(g, dtype=bool) & (wn > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        dist = np.where(pair, score / np.where(wn > 0, wn, 1.0), np.inf)  # [T, G, G']
    m = dist.min(axis=(1, 2))
    m = np.where(np.isfinite(m), m, np.nan)
    return m, separation(pair_distances(c0, present), present)


def _chunk_geometry(
    h: np.ndarray,
    y: np.ndarray,
    n_classes: int,
    rank_tol: float,
    readout: tuple[np.ndarray, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """Per-step geometry for one time chunk ``h [N, Tc, S]``, ``y [N, Tc]`` -> dict of ``[Tc]``."""
    n, tc, _ = h.shape
    counts, c0, _ = class_stats(h, y, n_classes)  # [Tc, G], [Tc, G, S] zero rows for absent classes
    present = counts > 0  # [Tc, G]
    resid = h - c0[np.arange(tc)[None, :], y]  # [N, Tc, S]
    n_present = present.sum(1)  # [Tc]
    dof = np.maximum(n - n_present, 1).astype(np.float64)  # [Tc] pooled unbiased denominator
    r2 = (resid**2).sum(-1).sum(0) / dof  # [Tc]
    d, _ = centre(c0, present)  # [Tc, G, S]
    # Steps whose states overflowed (an exploding tracker) get R = inf below; the SVD
    # sees zeros there instead of inf/NaN, which LAPACK cannot take.
    ok_t = np.isfinite(d).all((1, 2)) & (np.abs(d).max((1, 2), initial=0.0) < 1e150)  # [Tc]
    _, sv, vh = np.linalg.svd(np.where(ok_t[:, None, None], d, 0.0), full_matrices=False)  # sv [Tc, K], vh [Tc, K, S]
    keep = (sv > rank_tol * sv[:, :1]) & (sv[:, :1] > 0) & (n_present[:, None] >= 2)  # [Tc, K]
    coef = np.einsum("nts,tks->ntk", resid, vh) * keep[None]  # [N, Tc, K]
    resid_par = np.einsum("ntk,tks->nts", coef, vh)  # [N, Tc, S]
    r_par2 = (resid_par**2).sum(-1).sum(0) / dof  # [Tc]
    r_perp2 = ((resid - resid_par) ** 2).sum(-1).sum(0) / dof  # [Tc]
    big_m = separation(pair_distances(c0, present), present)  # [Tc]
    radius = np.sqrt((d**2).sum(-1).sum(-1) / np.maximum(n_present, 1))  # [Tc]
    out = {
        "R": np.where(ok_t, np.sqrt(r2), np.inf),
        "M": np.where(ok_t, big_m, np.nan),
        "R_par": np.where(ok_t, np.sqrt(r_par2), np.inf),
        "R_perp": np.where(ok_t, np.sqrt(r_perp2), np.inf),
        "centroid_radius": np.where(n_present >= 2, radius, np.nan),
        "k_U": keep.sum(1).astype(np.int64),
        "n_present": n_present.astype(np.int64),
    }
    if readout is not None:
        m_read, _ = _readout_margin(c0, present, *readout)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["tau_readout"] = m_read / big_m
    return out


def iter_chunks(states: Any, labels: Any, elements_per_chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(states [N, Tc, S], labels [N, Tc])`` float64/int64 chunks in time order."""
    if labels is not None:
        h_all = states
        n, t, s = h_all.shape
        tc = max(1, elements_per_chunk // max(1, n * s))
        for t0 in range(0, t, tc):
            yield as_numpy(h_all[:, t0 : t0 + tc]), as_numpy(labels[:, t0 : t0 + tc], np.int64)
        return
    for chunk in states:
        h, y = chunk
        yield as_numpy(h), as_numpy(y, np.int64)


def crossing_time(q: Any, tau: Any, t: Any, persist: int) -> tuple[float, bool]:
    """First ``t`` where ``q >= tau`` holds for ``persist`` consecutive entries (NaN, False if none).

    Args:
        q: ``[T]`` ratio at the evaluated steps (NaN counts as below threshold).
        tau: scalar or ``[T]`` threshold.
        t: ``[T]`` step index of each entry.
        persist: number of consecutive evaluated steps required.
    """
    if persist < 1:
        raise ValueError(f"persist={persist}; allowed: an integer >= 1")
    q = np.asarray(q, dtype=np.float64)
    above = np.asarray(q >= np.asarray(tau, dtype=np.float64))  # NaN compares False
    run = 0
    for i, a in enumerate(above):
        run = run + 1 if a else 0
        if run == persist:
            return float(np.asarray(t)[i - persist + 1]), True
    return float("nan"), False


def failure_mode(t_cross: float, crossed: bool, saturation_t: int) -> str:
    """'robust' (never crossed), 'saturation' (crossed at t <= saturation_t) or 'climb'."""
    if not crossed:
        return "robust"
    return "saturation" if t_cross <= saturation_t else "climb"


def _nan_free_mean(values: np.ndarray) -> float:
    """Mean of the non-NaN entries of ``values``; NaN (and no warning) when there are none
    (an empty window, or M undefined at every step: a group with one class, C1)."""
    known = values[~np.isnan(values)]
    return float(known.mean()) if known.size else float("nan")


def _check_geometry_args(
    states: Any, labels: Any, n_classes: int, tau: float, threshold: str, readout_weight: Any,
    persist: int, saturation_t: int, rank_tol: float,
) -> None:
    """Refuse arguments :func:`geometry_over_time` cannot use, naming the field and the allowed values."""
    if threshold not in ("nearest_centroid", "readout"):
        raise ValueError(f"threshold={threshold!r}; allowed: 'nearest_centroid', 'readout'")
    if threshold == "readout" and readout_weight is None:
        raise ValueError("threshold='readout' needs readout_weight; allowed: a [C, S] array")
    if not 0 < tau:
        raise ValueError(f"tau={tau}; allowed: a positive float")
    if not rank_tol > 0:
        raise ValueError(f"rank_tol={rank_tol}; allowed: a positive float")
    if persist < 1 or saturation_t < 0:
        raise ValueError(f"persist={persist}, saturation_t={saturation_t}; allowed: >= 1, >= 0")
    if n_classes < 1:
        raise ValueError(f"n_classes={n_classes}; allowed: an integer >= 1")
    if labels is not None and (np.ndim(states) != 3 or tuple(np.shape(labels)) != tuple(np.shape(states)[:2])):
        raise ValueError(
            f"states must be [N, T, S] and labels [N, T]; got {tuple(np.shape(states))} "
            f"and {tuple(np.shape(labels))}"
        )
    if labels is None and hasattr(states, "shape"):
        raise ValueError("labels=None needs an iterable of (states, labels) chunks; allowed: array + labels")


def _readout_arrays(readout_weight: Any, readout_bias: Any, n_classes: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(W [C, S], b [C])`` float64 of a given readout (b = 0 when absent), None without one."""
    if readout_weight is None:
        return None
    w = as_numpy(readout_weight)
    b = np.zeros(w.shape[0]) if readout_bias is None else as_numpy(readout_bias)
    if w.ndim != 2 or w.shape[0] < n_classes or b.shape != (w.shape[0],):
        raise ValueError(
            f"readout_weight {w.shape} / bias {b.shape}; allowed: [C >= {n_classes}, S] / [C]"
        )
    return w, b


def _accumulate(
    states: Any, labels: Any, n_classes: int, rank_tol: float,
    readout: tuple[np.ndarray, np.ndarray] | None, elements_per_chunk: int,
) -> dict[str, np.ndarray]:
    """:func:`_chunk_geometry` of every chunk, checked and concatenated in time: name -> ``[T]``."""
    parts: dict[str, list[np.ndarray]] = {}
    n_seen = None
    for h, y in iter_chunks(states, labels, elements_per_chunk):
        if h.ndim != 3 or y.shape != h.shape[:2]:
            raise ValueError(f"chunk states must be [N, Tc, S] and labels [N, Tc]; got {h.shape}, {y.shape}")
        if n_seen is not None and h.shape[0] != n_seen:
            raise ValueError(f"chunk has N={h.shape[0]}; allowed: the first chunk's N={n_seen}")
        if readout is not None and readout[0].shape[1] != h.shape[2]:
            raise ValueError(f"readout_weight has S={readout[0].shape[1]}; allowed: S={h.shape[2]}")
        n_seen = h.shape[0]
        check_labels(y, n_classes)
        for key, val in _chunk_geometry(h, y, n_classes, rank_tol, readout).items():
            parts.setdefault(key, []).append(val)
    if not parts:
        raise ValueError("no time steps given; allowed: at least one step")
    return {k: np.concatenate(v) for k, v in parts.items()}


def _fit_bounds(fit_window: tuple[int, int] | None, t_cross: float, crossed: bool, steps: np.ndarray) -> tuple[int, int]:
    """Inclusive steps of the Corollary-1 fit: ``fit_window``, else 1..T_cross (crossed) or the horizon."""
    if fit_window is None:
        return 1, int(t_cross) if crossed else int(steps[-1])
    lo, hi = int(fit_window[0]), int(fit_window[1])
    if lo > hi:
        raise ValueError(f"fit_window={fit_window}; allowed: (t_lo, t_hi) with t_lo <= t_hi")
    return lo, hi


def _corollary1_fit(steps: np.ndarray, r_par: np.ndarray, level_t: np.ndarray, lo: int,
                    hi: int) -> tuple[float, float, float]:
    """``(e_U0, eta, T_cross_par_pred)``: R_par ≈ e_U0 + eta·t on [lo, hi], crossing the
    mean of ``level_t`` = τ·M over the window (module docstring)."""
    win = (steps >= lo) & (steps <= hi)
    e0, eta = line_fit(steps[win], r_par[win])
    level = _nan_free_mean(level_t[win])
    if not np.isfinite(eta) or np.isnan(level):  # no fit, or no threshold level (one class: C1)
        return e0, eta, float("nan")
    if eta <= 0:
        return e0, eta, float("inf")
    return e0, eta, (level - e0) / eta


def geometry_over_time(
    states: Any,
    labels: Any | None = None,
    *,
    n_classes: int,
    tau: float = 0.5,
    threshold: Literal["nearest_centroid", "readout"] = "nearest_centroid",
    readout_weight: Any | None = None,
    readout_bias: Any | None = None,
    persist: int = 3,
    saturation_t: int = 3,
    rank_tol: float = 1e-6,
    fit_window: tuple[int, int] | None = None,
    elements_per_chunk: int = DEFAULT_ELEMENTS_PER_CHUNK,
) -> xr.Dataset:
    """q(t), R(t), M(t), R_par(t), R_perp(t), T_cross and Corollary-1 fit (module docstring).

    Memory is flat in the sequence length: time is processed chunk by chunk.

    Args:
        states: either a full array ``[N, T, S]`` (numpy or torch) of one layer's states with
            ``labels`` ``[N, T]``, or (``labels=None``) an iterable of chunks
            ``(states_chunk [N, Tc, S], labels_chunk [N, Tc])`` in time order (same N).
        labels: ``[N, T]`` integer true group state at each step, or None for chunks.
        n_classes: number of classes G (labels in ``0..G-1``).
        tau: nearest-centroid threshold (default 0.5).
        threshold: 'nearest_centroid' (q >= tau) or 'readout' (q >= tau_readout(t); needs
            ``readout_weight`` ``[C, S]`` and optionally ``readout_bias`` ``[C]``).
        persist: consecutive evaluated steps with q at or above threshold that define T_cross.
        saturation_t: a crossing at t <= saturation_t is labelled 'saturation'.
        rank_tol: relative singular-value tolerance for the basis of U.
        fit_window: inclusive (t_lo, t_hi) of the Corollary-1 fit (default: 1..T_cross, or the
            whole horizon when not crossed).
        elements_per_chunk: chunk size (N·Tc·S floats) when a full array is given.

    Returns:
        Dataset with dim ``t`` (1-based step, coordinate) and variables ``q, R, M, R_par,
        R_perp, centroid_radius, k_U, n_present`` (+ ``tau_readout`` when a readout is given),
        scalars ``T_cross, T_cross_par_pred, eta, e_U0, horizon, failure_mode, crossed``, attrs
        ``tau, threshold, rank_tol, persist, saturation_t, fit_window``.
    """
    _check_geometry_args(states, labels, n_classes, tau, threshold, readout_weight, persist, saturation_t, rank_tol)
    readout = _readout_arrays(readout_weight, readout_bias, n_classes)
    cols = _accumulate(states, labels, n_classes, rank_tol, readout, elements_per_chunk)
    steps = np.arange(1, cols["R"].size + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = cols["R"] / cols["M"]
    q[np.isinf(cols["R"])] = np.inf  # overflowed states: the tracker has failed (q = +inf)
    q[(cols["M"] == 0) & (cols["n_present"] >= 2)] = np.inf  # merged classes cannot be read
    tau_t = cols["tau_readout"] if threshold == "readout" else np.full(steps.size, float(tau))
    t_cross, crossed = crossing_time(q, tau_t, steps, persist)
    mode = failure_mode(t_cross, crossed, saturation_t)
    lo, hi = _fit_bounds(fit_window, t_cross, crossed, steps)
    e0, eta, t_pred = _corollary1_fit(steps, cols["R_par"], tau_t * cols["M"], lo, hi)

    data_vars: dict[str, Any] = {"q": ("t", q), **{key: ("t", val) for key, val in cols.items()}}
    data_vars.update(
        T_cross=((), t_cross),
        T_cross_par_pred=((), t_pred),  # predicts the crossing of q_par = R_par/M (Corollary 1)
        eta=((), eta),
        e_U0=((), e0),
        horizon=((), float(steps[-1])),
        crossed=((), crossed),
        failure_mode=((), mode),
    )
    return annotate(xr.Dataset(
        data_vars,
        coords={"t": ("t", steps)},
        attrs={
            "tau": float(tau),
            "threshold": threshold,
            "rank_tol": float(rank_tol),
            "persist": int(persist),
            "saturation_t": int(saturation_t),
            "fit_window": [lo, hi],
        },
    ))
