"""Decision margins of the nearest-centroid decoder, and the C2 'neutral oscillation' edge case.

Definitions, for states h_i(t) of one layer with labels g_i(t) and class centroids c_g(t)
(present classes only, as in :mod:`dynlab.analysis.geometry`):

- exact nearest-centroid margin of state i: the signed distance to the nearest bisecting
  hyperplane between its own centroid and another one,
      mu_i(t) = min_{g' != g_i} (||h_i - c_g'||^2 - ||h_i - c_{g_i}||^2) / (2 ||c_{g_i} - c_g'||);
  mu_i > 0 iff the state is decoded correctly; mu_i = ||c_g - c_g'||/2 >= M/2 at the centroid.
- summaries per t: ``margin_min`` = min_i mu_i, ``margin_min_rel`` = margin_min / (M/2)
  (1 = every state sits on a centroid of a pair at distance M, <= 0 = some state misread),
  ``frac_correct`` = fraction with mu_i > 0, ``frac_in_ball`` = fraction with
  ||h_i - c_{g_i}|| < M/2 (the sufficient condition behind tau = 0.5).

C2 edge case (two classes 0 and 1): u(t) = (c_1(t) - c_0(t)) / ||.|| is the unit vector of
U (fixed orientation: from class 0 to class 1).  The signed error along U of sequence i is
e_i(t) = (h_i(t) - c_{g_i(t)}(t)) · u(t).  An affine parity tracker whose transition acts as
-1 on U flips the sign of e at every flipping token while |e| stays put ("neutral
oscillation": no contraction, no growth), and it is harmless as long as |e| < M/2, the
binary margin, which is wide: for G classes spread as a regular simplex the half-margin
relative to the centroid radius is sqrt(G / (2 (G - 1))) (1 for G = 2) and smaller for
cyclic or nested arrangements (0.5 for six points on a circle).  Reported per t: RMS and
max |e|, max |e| / (M/2), the fraction of sequences whose sign of e differs from the
previous step, and the median ratio |e_i(t)| / |e_i(t-1)| (1 = neutral, < 1 = contraction).

Group-order summary: for each run's geometry dataset, half_margin_rel = median over t of
(M(t)/2) / centroid_radius(t), the room for error relative to the size of the symbolic
configuration, together with q_max and T_cross; sorted by group order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from dynlab.analysis.centroids import centre, check_labels, class_stats, pair_distances, separation
from dynlab.analysis.geometry import DEFAULT_ELEMENTS_PER_CHUNK, iter_chunks
from dynlab.results.vocabulary import annotate

__all__ = ["decision_margin", "binary_signed_error", "margin_vs_group_order"]


def decision_margin(
    states: Any,
    labels: Any | None = None,
    *,
    n_classes: int,
    elements_per_chunk: int = DEFAULT_ELEMENTS_PER_CHUNK,
) -> xr.Dataset:
    """Nearest-centroid margins per step (module docstring); streams over time like geometry.

    Args:
        states: ``[N, T, S]`` with ``labels`` ``[N, T]``, or an iterable of
            ``(states_chunk [N, Tc, S], labels_chunk [N, Tc])`` with ``labels=None``.
        n_classes: number of classes G.

    Returns:
        Dataset over ``t``: ``margin_min, margin_min_rel, frac_correct, frac_in_ball, half_M``.
    """
    if n_classes < 2:
        raise ValueError(f"n_classes={n_classes}; allowed: an integer >= 2")
    g = int(n_classes)
    parts: dict[str, list[np.ndarray]] = {}
    for h, y in iter_chunks(states, labels, elements_per_chunk):
        if h.ndim != 3 or y.shape != h.shape[:2]:
            raise ValueError(f"states must be [N, Tc, S] and labels [N, Tc]; got {h.shape}, {y.shape}")
        check_labels(y, g)
        n, tc, _ = h.shape
        counts, c, _ = class_stats(h, y, g)  # [Tc, G], [Tc, G, S] zero rows if absent
        present = counts > 0
        cc, cbar = centre(c, present)  # [Tc, G, S], [Tc, S]
        hc = h - cbar[None]  # [N, Tc, S] centred
        csq = (cc**2).sum(-1)  # [Tc, G]
        d2 = (hc**2).sum(-1)[..., None] + csq[None] - 2.0 * np.einsum("nts,tgs->ntg", hc, cc)  # [N, Tc, G]
        d2 = np.maximum(d2, 0.0)
        pdist = pair_distances(c, present)  # [Tc, G, G], NaN for a pair with an absent class
        tidx = np.arange(tc)[None, :]
        own = np.take_along_axis(d2, y[..., None], axis=-1)  # [N, Tc, 1]
        sep = pdist[tidx, y]  # [N, Tc, G]  ||c_{g_i} - c_g'||
        valid = present[None] & (np.arange(g)[None, None, :] != y[..., None]) & (sep > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.where(valid, (d2 - own) / (2.0 * sep), np.inf).min(-1)  # [N, Tc]
        mu = np.where(np.isfinite(mu), mu, np.nan)
        big_m = separation(pdist, present)  # [Tc]
        with np.errstate(invalid="ignore"):
            parts.setdefault("margin_min", []).append(mu.min(0))
            parts.setdefault("frac_correct", []).append((mu > 0).mean(0))
            parts.setdefault("frac_in_ball", []).append((np.sqrt(own[..., 0]) < big_m[None] / 2).mean(0))
        parts.setdefault("half_M", []).append(big_m / 2)
    if not parts:
        raise ValueError("no time steps given; allowed: at least one step")
    cols = {k: np.concatenate(v) for k, v in parts.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["margin_min_rel"] = cols["margin_min"] / cols["half_M"]
    names = ("margin_min", "margin_min_rel", "frac_correct", "frac_in_ball", "half_M")
    steps = np.arange(1, cols["half_M"].size + 1)
    return annotate(xr.Dataset({k: ("t", cols[k]) for k in names}, coords={"t": ("t", steps)}))


def binary_signed_error(
    states: Any,
    labels: Any | None = None,
    *,
    n_keep: int = 8,
    elements_per_chunk: int = DEFAULT_ELEMENTS_PER_CHUNK,
) -> xr.Dataset:
    """Signed error along U for a two-class (C2) run (module docstring).

    Args:
        states: ``[N, T, S]`` with ``labels`` ``[N, T]`` in {0, 1}, or chunks as in geometry.
        n_keep: number of sequences whose full trace ``e_U(sample, t)`` is kept.

    Returns:
        Dataset over ``t``: ``e_U_rms, e_U_absmax, half_M, e_U_absmax_rel, sign_flip_frac,
        abs_ratio_median``, trace ``e_U(sample, t)``; scalars ``e_U_absmax_rel_max``,
        ``sign_flip_frac_mean`` (over t >= 2) and ``inside_margin`` (max |e| < M/2 at every t).
        Steps where only one class is present give NaN.
    """
    parts: dict[str, list[np.ndarray]] = {}
    prev: np.ndarray | None = None
    for h, y in iter_chunks(states, labels, elements_per_chunk):
        if h.ndim != 3 or y.shape != h.shape[:2]:
            raise ValueError(f"states must be [N, Tc, S] and labels [N, Tc]; got {h.shape}, {y.shape}")
        check_labels(y, 2)
        counts, c, _ = class_stats(h, y, 2)  # [Tc, 2], [Tc, 2, S]
        present = counts > 0
        diff = c[:, 1] - c[:, 0]  # [Tc, S]
        sep = pair_distances(c, present)[:, 0, 1]  # [Tc], NaN when a class is absent
        ok = present.all(1) & (sep > 0)
        u = diff / np.where(ok, sep, 1.0)[:, None]  # [Tc, S]
        resid = h - c[np.arange(h.shape[1])[None, :], y]  # [N, Tc, S]
        e = np.einsum("nts,ts->nt", resid, u)  # [N, Tc]
        e[:, ~ok] = np.nan
        half = np.where(ok, sep / 2, np.nan)
        e_prev = np.concatenate([np.full((e.shape[0], 1), np.nan) if prev is None else prev[:, None], e[:, :-1]], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            flip = np.where(np.isnan(e) | np.isnan(e_prev), np.nan, (np.sign(e) != np.sign(e_prev)).astype(np.float64))
            ratio = np.abs(e) / np.abs(e_prev)
        absmax = np.abs(e).max(0)
        parts.setdefault("e_U_rms", []).append(np.sqrt((e**2).mean(0)))
        parts.setdefault("e_U_absmax", []).append(absmax)
        parts.setdefault("half_M", []).append(half)
        parts.setdefault("sign_flip_frac", []).append(flip.mean(0))
        parts.setdefault("abs_ratio_median", []).append(np.median(ratio, axis=0))
        parts.setdefault("trace", []).append(e[:n_keep])
        prev = e[:, -1]
    if not parts:
        raise ValueError("no time steps given; allowed: at least one step")
    cols = {k: np.concatenate(v, axis=-1) for k, v in parts.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        cols["e_U_absmax_rel"] = cols["e_U_absmax"] / cols["half_M"]
    steps = np.arange(1, cols["half_M"].size + 1)
    rel_max = float(np.nanmax(cols["e_U_absmax_rel"])) if np.isfinite(cols["e_U_absmax_rel"]).any() else float("nan")
    flips = cols["sign_flip_frac"][1:]
    flip_mean = float(np.nanmean(flips)) if np.isfinite(flips).any() else float("nan")
    names = ("e_U_rms", "e_U_absmax", "half_M", "e_U_absmax_rel", "sign_flip_frac", "abs_ratio_median")
    data: dict[str, Any] = {k: ("t", cols[k]) for k in names}
    data["e_U"] = (("sample", "t"), cols["trace"])
    data["e_U_absmax_rel_max"] = ((), rel_max)
    data["sign_flip_frac_mean"] = ((), flip_mean)
    data["inside_margin"] = ((), bool(rel_max < 1))
    return annotate(xr.Dataset(data, coords={"t": ("t", steps)}))


def margin_vs_group_order(
    geometries: Sequence[xr.Dataset], groups: Sequence[str], orders: Sequence[int]
) -> xr.Dataset:
    """Decision-margin summary across runs of different groups, sorted by group order.

    Args:
        geometries: per-run datasets from :func:`dynlab.analysis.geometry.geometry_over_time`.
        groups: group name per run (e.g. 'C2', 'C6', 'S3').
        orders: group order |G| per run.

    Returns:
        Dataset over ``run`` (coords ``group``, ``group_order``): ``half_margin_rel`` (median
        over t of (M/2) / centroid_radius), ``q_max`` (max over t of q), ``T_cross``.
    """
    if not (len(geometries) == len(groups) == len(orders)) or len(geometries) == 0:
        raise ValueError(
            f"{len(geometries)} geometries, {len(groups)} groups, {len(orders)} orders; allowed: equal, >= 1"
        )
    rel, qmax, tcross = [], [], []
    for ds in geometries:
        for var in ("M", "centroid_radius", "q", "T_cross"):
            if var not in ds:
                raise ValueError(f"geometry dataset lacks {var!r}; allowed: output of geometry_over_time")
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = (ds["M"].values / 2) / ds["centroid_radius"].values
        rel.append(float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else float("nan"))
        qv = ds["q"].values
        qmax.append(float(np.nanmax(qv)) if np.isfinite(qv).any() else float("nan"))
        tcross.append(float(ds["T_cross"].values))
    order = np.argsort(np.asarray(orders), kind="stable")

    def pick(values: Sequence[Any]) -> np.ndarray:
        return np.asarray(values)[order]

    return annotate(xr.Dataset(
        {"half_margin_rel": ("run", pick(rel)), "q_max": ("run", pick(qmax)), "T_cross": ("run", pick(tcross))},
        coords={
            "run": np.arange(len(order)),
            "group": ("run", [str(x) for x in pick(list(groups))]),
            "group_order": ("run", pick(orders).astype(np.int64)),
        },
    ))
