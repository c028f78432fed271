"""The one least-squares line fit of the analyses: v ≈ a + b·t over the finite entries.

Closed form, column by column (t centred on the mean of each column's fitted steps, the
numerically stable form), so a stack of series ``[T, K]`` is fitted at once.  Used by the
Corollary-1 fit of :mod:`dynlab.analysis.geometry`, the margin and spread drifts of
:mod:`dynlab.tracking.analysis.horizon`, the recovery rate of :mod:`dynlab.analysis.perturbation`
and the crossing forecast of the tracker analysis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["line_fit"]


def _columns(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(a [K], b [K])`` of ``v [T, K]`` against ``t [T]`` (see :func:`line_fit`)."""
    ok = np.isfinite(v)  # [T, K]
    n = ok.sum(0)
    tt = np.where(ok, t[:, None], 0.0)
    vv = np.where(ok, v, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_mean = tt.sum(0) / n
        v_mean = vv.sum(0) / n
        dt = np.where(ok, t[:, None] - t_mean, 0.0)
        sxx = (dt**2).sum(0)
        slope = (dt * np.where(ok, v - v_mean, 0.0)).sum(0) / sxx
    bad = (n < 2) | ~(sxx > 0)
    slope = np.where(bad, np.nan, slope)
    return np.where(bad, np.nan, v_mean - slope * t_mean), slope


def line_fit(t: Any, v: Any) -> tuple[Any, Any]:
    """Least-squares ``v ≈ a + b·t`` over the finite entries of ``v``: ``(a, b)``.

    Args:
        t: ``[T]`` steps (finite).
        v: ``[T]`` values, or ``[T, K]``: K series fitted independently.

    Returns:
        floats ``(a, b)`` for ``v [T]``, arrays ``(a [K], b [K])`` for ``v [T, K]``; NaN where
        a series has fewer than two finite entries at distinct steps.
    """
    t = np.asarray(t, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if t.ndim != 1 or v.shape[:1] != t.shape or v.ndim not in (1, 2):
        raise ValueError(f"t {t.shape}, v {v.shape}; allowed: t [T] with v [T] or [T, K]")
    a, b = _columns(t, v[:, None] if v.ndim == 1 else v)
    return (float(a[0]), float(b[0])) if v.ndim == 1 else (a, b)
