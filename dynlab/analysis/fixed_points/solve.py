"""Steps 1-4 of the fixed-point finder (:mod:`dynlab.analysis.fixed_points.finder`, whose docstring
describes the pipeline): the starts (initial points, orbit starts), the Levenberg-Marquardt
solve with Newton polishing, the residual filter and the deduplication; and the numpy view of
a torch map they all solve on (float64)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize
import torch
from torch.func import jacrev, vmap

__all__ = [
    "Map", "NEWTON_ACCEPT", "Solutions", "deduplicate", "initial_points", "jacobians", "keep_converged", "newton_all",
    "numpy_map", "orbit_starts", "solve",
]

#: A map F: h ``[S]`` -> ``[S]`` in torch operations (``torch.func.jacrev`` differentiates it).
Map = Callable[[torch.Tensor], torch.Tensor]


def numpy_map(fn: Map) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """numpy wrappers ``h -> F(h)`` and ``h -> DF(h)`` (``torch.func.jacrev``) of a torch map (float64, CPU)."""
    jac = jacrev(fn)

    def f(h: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.as_tensor(h, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64)

    def df(h: np.ndarray) -> np.ndarray:
        return jac(torch.as_tensor(h, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64)

    return f, df


def jacobians(fn: Map, points: Any) -> np.ndarray:
    """DF at every one of ``points [n, S]``, as ``[n, S, S]`` (float64, CPU), from one batched
    call (``torch.func.vmap`` over ``jacrev``): the same Jacobians as ``numpy_map``'s ``df``
    point by point (to round-off; bit for bit where DF does not depend on h), at a fraction
    of the cost for the small states of the analyses."""
    x = torch.as_tensor(np.atleast_2d(np.asarray(points, dtype=np.float64)))
    return _rows(jacrev(fn), x)


def _rows(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> np.ndarray:
    """``fn`` of every row of ``x``, stacked, as float64 numpy: one ``vmap`` call, or row by
    row for a map ``vmap`` cannot batch (data-dependent Python control flow, an op without
    a batching rule): the same numbers either way, only slower."""
    try:
        out = vmap(fn)(x)
    except (RuntimeError, NotImplementedError):
        out = torch.stack([fn(row) for row in x])
    return out.detach().cpu().numpy().astype(np.float64)


# -- 1. initial points -------------------------------------------------------------------------


def initial_points(states: Any, n: int | None = None, *, noise: float = 0.0,
                   rng: np.random.Generator | None = None) -> np.ndarray:
    """Starts ``[n, S]``: ``n`` of ``states`` ``[N, S]`` (the first ``n``; all when None),
    each moved by ``noise`` × (RMS state norm) × a standard normal vector / sqrt(S)."""
    x = np.asarray(states, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"states has shape {x.shape}; allowed: [N >= 1, S]")
    if n is not None:
        if n < 1:
            raise ValueError(f"n={n}; allowed: None or an integer >= 1")
        x = x[:n]
    x = x.copy()
    if noise > 0:
        gen = rng if rng is not None else np.random.default_rng(0)
        scale = float(np.sqrt((x**2).sum(-1).mean())) or 1.0
        x += noise * scale * gen.standard_normal(x.shape) / np.sqrt(x.shape[1])
    return x


def orbit_starts(fn: Map, starts: Any, iterate: int, *, max_starts: int = 2, dedup_tol: float = 1e-6) -> np.ndarray:
    """Starts ``[m, S]`` from the forward orbits of ``fn``: each of ``starts [n, S]`` is mapped
    ``iterate`` times; returned are the distinct end points (the first ``max_starts``,
    distinct within ``dedup_tol`` · max(1, RMS norm of the starts)) and the mean of the second
    half of each kept orbit.  Orbits that leave the finite numbers give none; an empty
    ``[0, S]`` when none stays finite.  A stable fixed point is where an orbit ends; a
    repelling one inside an attracting invariant circle is near the orbit's mean."""
    x0 = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    if iterate < 1:
        raise ValueError(f"iterate={iterate}; allowed: an integer >= 1")
    f, _ = numpy_map(fn)
    scale = max(1.0, float(np.sqrt((x0**2).sum(-1).mean())))
    ends: list[np.ndarray] = []
    means: list[np.ndarray] = []
    half = iterate // 2
    with np.errstate(over="ignore", invalid="ignore"):
        for start in x0:
            h, tail = start.copy(), np.zeros_like(start)
            for k in range(iterate):
                h = f(h)
                if not np.all(np.isfinite(h)):
                    break
                if k >= half:
                    tail += h
            else:
                if all(np.linalg.norm(h - e) > dedup_tol * scale for e in ends):
                    ends.append(h)
                    means.append(tail / (iterate - half))
                if len(ends) >= max_starts:
                    break
    return np.asarray([*ends, *means], dtype=np.float64).reshape(-1, x0.shape[1])


# -- 2. solve ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solutions:
    """Raw solves, one row per start: end points ``[n, S]``, their residuals ‖F(h) − h‖
    ``[n]`` and the starts ``[n, S]``."""

    points: np.ndarray
    residuals: np.ndarray
    starts: np.ndarray


#: A start that plain Newton steps bring to ‖r‖ ≤ NEWTON_ACCEPT · max(1, ‖h‖) (far below any
#: acceptance ``tol`` of :func:`keep_converged`) is taken as solved, without the LM solve.
NEWTON_ACCEPT = 1e-12


def newton_all(fn: Map, starts: Any, steps: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plain Newton steps h ← h − (DF(h) − I)⁻¹ r(h) on r(h) = F(h) − h from every start at
    once (F and DF batched over the starts with ``torch.func.vmap``), a start's step kept
    only while it lowers its ‖r‖ (a start stops at its first step that does not).  Returns
    ``(points [n, S], residuals [n], accepted [n])``, accepted where ‖r‖ ≤
    :data:`NEWTON_ACCEPT` · max(1, ‖h‖).  Near a fixed point (a tracker's states at the
    reference step lie on its attractors) this is where the LM solve ends too, for a
    fraction of its cost; the starts it does not bring there go to the LM solve."""
    x = np.atleast_2d(np.asarray(starts, dtype=np.float64)).copy()
    n, s = x.shape

    def residual(h: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return _rows(fn, torch.as_tensor(h)) - h

    with np.errstate(over="ignore", invalid="ignore"):
        r = residual(x)
        norm = np.linalg.norm(r, axis=1)
        moving = np.isfinite(norm)
        for _ in range(steps):
            if not moving.any():
                break
            idx = np.flatnonzero(moving)
            jac = jacobians(fn, x[idx]) - np.eye(s)
            step = np.full((idx.size, s), np.nan)
            for k, j in enumerate(idx):  # a singular DF − I stops that start
                try:
                    step[k] = np.linalg.solve(jac[k], -r[j])
                except np.linalg.LinAlgError:
                    pass
            trial = x[idx] + step
            ok = np.all(np.isfinite(trial), axis=1)
            r_t = np.full_like(trial, np.nan)
            if ok.any():
                r_t[ok] = residual(trial[ok])
            n_t = np.linalg.norm(r_t, axis=1)
            better = ok & (n_t < norm[idx])
            x[idx[better]], r[idx[better]], norm[idx[better]] = trial[better], r_t[better], n_t[better]
            moving[idx[~better]] = False
    accepted = np.isfinite(norm) & (norm <= NEWTON_ACCEPT * np.maximum(1.0, np.linalg.norm(x, axis=1)))
    return x, norm, accepted


def solve(fn: Map, starts: Any, *, newton_steps: int = 5, max_nfev: int | None = None) -> Solutions:
    """Step 2: from every start, plain Newton steps first (:func:`newton_all`, all starts at
    once); a start they do not bring to a fixed point gets the Levenberg–Marquardt solve on
    r(h) = F(h) − h, then Newton polishing (module docstring)."""
    x0 = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    f, df = numpy_map(fn)
    s = x0.shape[1]
    eye = np.eye(s)
    pts, res = [], []
    quick, quick_res, accepted = newton_all(fn, x0)
    for i, start in enumerate(x0):
        if accepted[i]:
            pts.append(quick[i])
            res.append(float(quick_res[i]))
            continue
        try:
            sol = scipy.optimize.least_squares(
                lambda h: f(h) - h, start, jac=lambda h: df(h) - eye, method="lm",
                xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=max_nfev or 200 * (s + 1),
            )
            h = sol.x
        except (np.linalg.LinAlgError, ValueError, FloatingPointError):
            h = start.copy()
        r = f(h) - h
        for _ in range(newton_steps):
            if not np.all(np.isfinite(r)):
                break
            try:
                step = np.linalg.lstsq(df(h) - eye, -r, rcond=None)[0]
            except np.linalg.LinAlgError:
                break
            h_new = h + step
            r_new = f(h_new) - h_new
            if not np.linalg.norm(r_new) < np.linalg.norm(r):
                break
            h, r = h_new, r_new
        pts.append(h)
        res.append(float(np.linalg.norm(r)) if np.all(np.isfinite(r)) else float("inf"))
    return Solutions(np.asarray(pts).reshape(-1, s), np.asarray(res, dtype=np.float64), x0)


# -- 3. filter and 4. deduplicate ----------------------------------------------------------------


def keep_converged(sol: Solutions, tol: float = 1e-8) -> Solutions:
    """Step 3: the solutions with residual ≤ ``tol`` · max(1, ‖h*‖)."""
    norms = np.linalg.norm(sol.points, axis=1) if sol.points.size else np.zeros(0)
    ok = np.isfinite(sol.residuals) & (sol.residuals <= tol * np.maximum(1.0, norms))
    return Solutions(sol.points[ok], sol.residuals[ok], sol.starts[ok])


def deduplicate(points: Any, residuals: Any, tol: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step 4: greedy clustering of ``points [n, S]`` in order of increasing residual: a point
    within distance ``tol`` of a kept one joins it.  Returns ``(unique [u, S], their residuals
    [u], hits [u])``, hits = how many points each kept one absorbed (itself included),
    ordered by hits (descending), then residual."""
    p = np.asarray(points, dtype=np.float64)
    r = np.asarray(residuals, dtype=np.float64).reshape(-1)
    if p.ndim != 2 or p.shape[0] != r.size:
        raise ValueError(f"points {p.shape} and residuals {r.shape}; allowed: [n, S] and [n]")
    kept: list[int] = []
    hits: list[int] = []
    for i in np.argsort(r, kind="stable"):
        for j, k in enumerate(kept):
            if np.linalg.norm(p[i] - p[k]) <= tol:
                hits[j] += 1
                break
        else:
            kept.append(int(i))
            hits.append(1)
    order = sorted(range(len(kept)), key=lambda j: (-hits[j], r[kept[j]]))
    idx = np.asarray([kept[j] for j in order], dtype=np.int64)
    return p[idx], r[idx], np.asarray([hits[j] for j in order], dtype=np.int64)
