"""Slow points of recurrent maps (Sussillo & Barak 2013): local minima of the speed
q(h) = ½‖F(h) − h‖², found by an exact-Hessian trust-region Newton minimisation
(``scipy.optimize.minimize(method='trust-exact')``, gradient and Hessian of q from
``torch.func``), kept when the gradient norm is ≤ ``gtol`` · max(1, ‖F(h) − h‖) and
deduplicated (:func:`dynlab.analysis.fixed_points.solve.deduplicate`).  A fixed point
(:mod:`dynlab.analysis.fixed_points.finder`) is a slow point of speed 0; a slow point of speed > 0 is
where the map moves least (the ghost of a fixed point).  Results are typed
(:class:`SlowPoints`), in float64."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize
import torch
from torch.func import jacrev

from dynlab.analysis.fixed_points.solve import Map, deduplicate, numpy_map
from dynlab.analysis.fixed_points.finder import spectrum

__all__ = ["SlowPoints", "find_slow_points"]




@dataclass(frozen=True)
class SlowPoints:
    """Distinct local minima of the speed q(h) = ½‖F(h) − h‖².

    Attributes:
        points: ``[u, S]``; speeds: ``[u]`` q at each; grad_norms: ``[u]`` ‖∇q‖;
        hits: ``[u]`` starts that ended at each; eig: ``[u, S]`` eigenvalues of DF there.
    """

    points: np.ndarray
    speeds: np.ndarray
    grad_norms: np.ndarray
    hits: np.ndarray
    eig: np.ndarray


def find_slow_points(
    fn: Map,
    starts: Any,
    *,
    gtol: float = 1e-8,
    max_speed: float | None = None,
    dedup_tol: float = 1e-6,
    maxiter: int = 500,
) -> SlowPoints:
    """Slow points of ``fn`` from ``starts [n, S]`` (module docstring): trust-region Newton
    minimisation of q, kept when ‖∇q‖ ≤ ``gtol`` · max(1, ‖F(h) − h‖) (and q ≤
    ``max_speed`` when given), deduplicated within ``dedup_tol`` · max(1, scale)."""
    x0 = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    if x0.ndim != 2 or x0.shape[0] == 0 or not np.all(np.isfinite(x0)):
        raise ValueError(f"starts has shape {x0.shape}; allowed: finite [n >= 1, S]")
    s = x0.shape[1]

    def q_t(h: torch.Tensor) -> torch.Tensor:
        r = fn(h) - h
        return 0.5 * (r * r).sum()

    grad_t = jacrev(q_t)
    hess_t = jacrev(grad_t)  # reverse over reverse: forward mode is not needed (nor all ops support it)

    def as_np(g: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], Any]:
        return lambda h: g(torch.as_tensor(h, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64)

    q, grad, hess = as_np(q_t), as_np(grad_t), as_np(hess_t)
    pts, speeds, gnorms = [], [], []
    for start in x0:
        opt = scipy.optimize.minimize(lambda h: float(q(h)), start, jac=grad, hess=hess, method="trust-exact",
                                      options={"gtol": 1e-14, "maxiter": maxiter})
        h = opt.x
        qv, gn = float(q(h)), float(np.linalg.norm(grad(h)))
        if gn <= gtol * max(1.0, np.sqrt(2 * qv)) and (max_speed is None or qv <= max_speed):
            pts.append(h)
            speeds.append(qv)
            gnorms.append(gn)
    scale = max(1.0, float(np.sqrt((x0**2).sum(-1).mean())))
    if not pts:
        z = np.zeros(0)
        return SlowPoints(np.zeros((0, s)), z, z, np.zeros(0, dtype=np.int64), np.zeros((0, s), dtype=np.complex128))
    p = np.asarray(pts)
    sp = np.asarray(speeds)
    u, _, hits = deduplicate(p, sp, dedup_tol * scale)
    pick = [int(np.argmin(np.linalg.norm(p - v, axis=1))) for v in u]
    _, df = numpy_map(fn)
    eig = np.asarray([spectrum(df(v))["eig"] for v in u], dtype=np.complex128).reshape(-1, s)
    return SlowPoints(u, sp[pick], np.asarray(gnorms)[pick], hits, eig)
