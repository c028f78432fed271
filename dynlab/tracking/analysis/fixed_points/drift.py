"""Corollary 1 from the return maps: the drift η̄ along U and the crossing time it predicts.

Paper A's Corollary 1: for a near-affine tracker the error along the symbolic subspace U
grows linearly, e_U(t) ≈ e_U(0) + t·η̄.  dynlab reads η̄ off the geometry of the return
maps instead of fitting it to a curve:

- **Drift of one class under one word** (:func:`return_map_drift`).  For a state-preserving
  word w and a class centroid c_g (at t_ref), the drift per token along U is

      η_{g,w} = ‖Bᵀ (F_w(c_g) − c_g)‖ / |w|

  with B an orthonormal basis of U.  When F_w has a fixed point h* and is affine,
  F_w(h) = h* + A (h − h*), so F_w(c_g) − c_g = (A − I)(c_g − h*): the class's offset from
  the fixed point seen through A − I.  Theorem 1 makes A the identity on U for an exact
  affine tracker, so what is left along U is the part of the offset that A − I does not
  cancel; when F_w has no fixed point (its translation b is not in the range of A − I)
  it is the translation that no state can absorb.  Either way it is what one pass of w
  adds to the error along U.
- **η̄** (:func:`mean_drift`): the mean of η_{g,w} over the classes and words — the
  average drift per token of Corollary 1.
- **Predicted crossing** (:func:`corollary1_crossing`): with e_U(t_ref) = R∥(t_ref) (the RMS
  scatter along U at the reference step) and the separation held at M(t_ref), the error
  e_U(t) = e_U(t_ref) + (t − t_ref)·η̄ reaches τ·M(t_ref) at

      T_cross_fp = t_ref + (τ·M(t_ref) − R∥(t_ref)) / η̄,

  i.e. the crossing of q∥ = R∥/M over τ that Corollary 1 predicts (``T_cross_par`` is the
  measured one).  It is t_ref when R∥(t_ref) ≥ τ·M(t_ref) already, and NaN (never,
  censored) when η̄ ≤ 0 or the crossing lies beyond the horizon.

All float64; the functions are pure (a map in, numbers out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["corollary1_crossing", "mean_drift", "return_map_drift"]

Map = Callable[[torch.Tensor], torch.Tensor]


def return_map_drift(fn: Map, point: Any, basis: Any, word_length: int) -> float:
    """η_{g,w} = ‖Bᵀ (F(c) − c)‖ / |w| of the map ``fn`` (F_w) at ``point`` c ``[S]`` with the
    orthonormal ``basis`` B ``[S, k]`` of U (module docstring); NaN when F(c) is not finite
    or U is empty."""
    if word_length < 1:
        raise ValueError(f"word_length={word_length}; allowed: an integer >= 1")
    c = np.asarray(point, dtype=np.float64).reshape(-1)
    b = np.asarray(basis, dtype=np.float64)
    if b.ndim != 2 or b.shape[0] != c.size:
        raise ValueError(f"basis has shape {b.shape}; allowed: [{c.size}, k]")
    if b.shape[1] == 0:
        return float("nan")
    with torch.no_grad():
        fc = fn(torch.as_tensor(c, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64).reshape(-1)
    if not np.all(np.isfinite(fc)):
        return float("nan")
    return float(np.linalg.norm(b.T @ (fc - c))) / word_length


def mean_drift(maps: Sequence[Map], word_lengths: Sequence[int], points: Any, basis: Any) -> float:
    """η̄: the mean of :func:`return_map_drift` over the maps (words) and the ``points``
    ``[P, S]`` (class centroids), NaN-skipping; NaN when none is finite."""
    p = np.atleast_2d(np.asarray(points, dtype=np.float64))
    if len(maps) != len(word_lengths):
        raise ValueError(f"{len(maps)} maps and {len(word_lengths)} word lengths; allowed: one length per map")
    vals = [return_map_drift(fn, c, basis, n) for fn, n in zip(maps, word_lengths) for c in p]
    vals = [v for v in vals if np.isfinite(v)]
    return float(np.mean(vals)) if vals else float("nan")


def corollary1_crossing(e0: float, eta: float, threshold: float, t0: float, horizon: float | None = None) -> float:
    """First t ≥ ``t0`` with e0 + (t − t0)·eta ≥ ``threshold`` (module docstring): ``t0`` when
    e0 ≥ threshold; NaN when eta ≤ 0 (or not finite) and e0 < threshold, or when the crossing
    lies beyond ``horizon``."""
    e0, eta, threshold, t0 = (float(x) for x in (e0, eta, threshold, t0))
    if not (np.isfinite(e0) and np.isfinite(threshold) and np.isfinite(t0)):
        return float("nan")
    if e0 >= threshold:
        return t0
    if not (np.isfinite(eta) and eta > 0):
        return float("nan")
    t = t0 + (threshold - e0) / eta
    return float("nan") if horizon is not None and t > horizon else float(t)
