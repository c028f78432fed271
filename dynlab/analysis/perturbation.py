"""Perturbation injection along U and U-perp, and recovery (contraction) rates.

Protocol (paper A; docs/error-control.md).  Steps are 1-based: h(t) is the state after t tokens.

1. Run the model on ``tokens`` from ``init_state`` up to step t0 (float64 copy, eval mode).
2. From the clean tracked-layer states z_i(t0) = h_i(t0)[layer_slice(layer)] and their labels,
   compute the centroids, M(t0) and the orthonormal basis B of U(t0)
   (:func:`dynlab.analysis.geometry.symbolic_basis`).
3. For every sequence i draw an independent random unit direction: along U, d = B a / ||B a||
   with a ~ N(0, I_k); along U-perp, d = (I - B B^T) a / ||.|| with a ~ N(0, I_{S_layer}).
   Add delta_i = eps·M(t0)·d_i to the tracked-layer coordinates only; the other layers' state
   is left untouched.
4. Continue clean and perturbed runs with the true tokens x_{t0+1..T}.

Reported per direction and step t = t0..T (all distances on the tracked layer, RMS over the N
sequences):
- ``delta_norm``: RMS ||z_pert(t) - z_clean(t)|| (the perturbation's size);
- ``dist_pert``: RMS distance of z_pert(t) to the clean centroid of its correct class;
  ``dist_clean`` the same for the clean run (= R(t)); ``dist_excess = dist_pert - dist_clean``;
- ``q_pert``: q(t) = R/M of the perturbed population (its own centroids), ``q_clean`` likewise.
Recovery rate per direction: the least-squares slope of log(delta_norm(t)) against t over
t0..min(T, t0 + fit_steps) (natural log per step; negative = contraction, 0 = neutral, e.g.
log(lambda) for a map that contracts the direction by lambda each step).  Steps where
delta_norm has fallen below 1e-12 times its initial value are left out (round-off floor).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

from dynlab.analysis.centroids import class_centroids, pair_distances, separation
from dynlab.analysis.fit import line_fit
from dynlab.analysis.geometry import symbolic_basis
from dynlab.analysis.jacobian import device_dtype, analysis_copy
from dynlab.results.vocabulary import annotate

__all__ = ["perturbation_response"]

_FLOOR = 1e-12


def _q_of(z: np.ndarray, y: np.ndarray, n_classes: int) -> float:
    """q = R/M of states ``z [N, S]`` with labels ``y [N]`` (own centroids)."""
    c, counts = class_centroids(z, y, n_classes)
    present = counts > 0
    if present.sum() < 2:
        return float("nan")
    r = np.sqrt(((z - c[y]) ** 2).sum(-1).mean())
    big_m = separation(pair_distances(c, present), present)
    return float(r / big_m) if big_m > 0 else float("nan")


def _rms(x: np.ndarray) -> float:
    return float(np.sqrt((x**2).sum(-1).mean()))


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    ok = np.isfinite(y) & (y > _FLOOR * y[0])
    log_y = np.full(y.shape, np.nan)
    log_y[ok] = np.log(y[ok])
    return line_fit(t, log_y)[1]


def _reference_at_t0(z0: np.ndarray, y0: np.ndarray, g: int, rank_tol: float, t0: int) -> tuple[np.ndarray, float]:
    """Basis ``[S_layer, k]`` of U(t0) and M(t0) from the clean states ``z0 [N, S_layer]``; refuses an empty U or U_perp."""
    c0, counts0 = class_centroids(z0, y0, g)
    basis = symbolic_basis(c0, rank_tol)  # [S_layer, k]
    present = counts0 > 0
    if basis.shape[1] == 0 or present.sum() < 2:
        raise ValueError(f"U(t0={t0}) is empty; allowed: a t0 with at least two distinct class centroids")
    if basis.shape[1] == z0.shape[1]:
        raise ValueError(f"U(t0={t0}) fills the tracked layer (k={basis.shape[1]}); U_perp is empty")
    return basis, float(separation(pair_distances(c0, present), present))


def _perturbed_copies(h: torch.Tensor, sl: slice, basis: np.ndarray, scale: float, gen: np.random.Generator) -> torch.Tensor:
    """``[3N, S]``: the clean states ``h [N, S]``, then copies moved by ``scale`` along a random
    unit direction per sequence in U, then in U_perp (tracked-layer coordinates only)."""
    n, s_layer = h.shape[0], basis.shape[0]
    a_par = gen.standard_normal((n, basis.shape[1])) @ basis.T  # [N, S_layer]
    a_perp = gen.standard_normal((n, s_layer))
    a_perp = a_perp - (a_perp @ basis) @ basis.T  # [N, S_layer]
    dirs = [a / np.linalg.norm(a, axis=1, keepdims=True) for a in (a_par, a_perp)]
    stacked = [h]
    for d in dirs:
        hp = h.clone()
        hp[:, sl] = hp[:, sl] + torch.as_tensor(scale * d, device=h.device, dtype=h.dtype)
        stacked.append(hp)
    return torch.cat(stacked, dim=0)  # [3N, S]: clean, U, U_perp


def _step_row(z: np.ndarray, lab: np.ndarray, g: int) -> dict[str, Any]:
    """The per-step measurements of ``z [3, N, S_layer]`` (clean, U, U_perp) with labels ``lab [N]``."""
    c, _ = class_centroids(z[0], lab, g)
    target = c[lab]  # [N, S_layer]
    return {
        "delta_norm": [_rms(z[j] - z[0]) for j in (1, 2)],
        "dist_pert": [_rms(z[j] - target) for j in (1, 2)],
        "q_pert": [_q_of(z[j], lab, g) for j in (1, 2)],
        "dist_clean": _rms(z[0] - target),
        "q_clean": _q_of(z[0], lab, g),
    }


def _response_dataset(rows: list[dict[str, Any]], steps: np.ndarray, fit_steps: int | None, m_t0: float, k_u: int,
                      attrs: dict[str, Any]) -> xr.Dataset:
    """The per-step rows as the Dataset of :func:`perturbation_response`, with the recovery rates."""
    delta = np.array([r["delta_norm"] for r in rows]).T  # [2, T']
    dist_pert = np.array([r["dist_pert"] for r in rows]).T  # [2, T']
    q_pert = np.array([r["q_pert"] for r in rows]).T  # [2, T']
    dist_clean = np.array([r["dist_clean"] for r in rows])  # [T']
    q_clean = np.array([r["q_clean"] for r in rows])  # [T']
    last = steps.size if fit_steps is None else min(steps.size, int(fit_steps) + 1)
    rates = np.array([_slope(steps[:last], delta[j, :last]) for j in range(2)])
    dt2 = ("direction", "t")
    data = {
        "delta_norm": (dt2, delta),
        "dist_pert": (dt2, dist_pert),
        "dist_excess": (dt2, dist_pert - dist_clean[None]),
        "q_pert": (dt2, q_pert),
        "dist_clean": ("t", dist_clean),
        "q_clean": ("t", q_clean),
        "recovery_rate": ("direction", rates),
        "M_t0": ((), m_t0),
        "k_U": ((), k_u),
    }
    return annotate(xr.Dataset(
        data, coords={"direction": ("direction", ["U", "U_perp"]), "t": ("t", steps)}, attrs=attrs,
    ))


def _check_response_args(x: torch.Tensor, y: np.ndarray, t0: int, eps: float, fit_steps: int | None) -> None:
    """Refuse inputs :func:`perturbation_response` cannot use, naming the field."""
    if x.ndim != 2 or y.shape != tuple(x.shape):
        raise ValueError(f"tokens {tuple(x.shape)} and labels {y.shape}; allowed: both [N, T]")
    if not 1 <= t0 <= x.shape[1]:
        raise ValueError(f"t0={t0}; allowed: 1..{x.shape[1]}")
    if not eps > 0:
        raise ValueError(f"eps={eps}; allowed: a positive float")
    if fit_steps is not None and fit_steps < 1:
        raise ValueError(f"fit_steps={fit_steps}; allowed: None or an integer >= 1")


def perturbation_response(
    model: nn.Module,
    tokens: Any,
    labels: Any,
    *,
    t0: int,
    eps: float = 0.1,
    layer: int = -1,
    n_classes: int | None = None,
    rank_tol: float = 1e-6,
    fit_steps: int | None = None,
    rng: np.random.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> xr.Dataset:
    """Inject eps·M(t0) perturbations along U and U-perp at t0 and follow them (module docstring).

    Args:
        model: tracker following the model protocol.
        tokens: ``[N, T]`` token indices.
        labels: ``[N, T]`` true group state after each step (label[:, t-1] is the state at t).
        t0: injection step, 1 <= t0 <= T.
        eps: perturbation size in units of M(t0).
        layer: tracked layer.
        n_classes: number of classes (default ``model.n_classes``).
        rank_tol: relative rank tolerance of U(t0).
        fit_steps: number of steps after t0 used for the recovery-rate fit (default all).
        rng: numpy Generator for the random directions (default ``default_rng(0)``).

    Returns:
        Dataset with dims ``direction`` (['U', 'U_perp']) and ``t`` (t0..T): ``delta_norm,
        dist_pert, dist_excess, q_pert (direction, t)``, ``dist_clean, q_clean (t)``,
        ``recovery_rate (direction)``, scalars ``M_t0``, ``k_U``; attrs t0, eps, layer.
    """
    m = analysis_copy(model, dtype)
    device, dt = device_dtype(m)
    x = torch.as_tensor(tokens, device=device, dtype=torch.long)
    y = np.asarray(labels.detach().cpu() if hasattr(labels, "detach") else labels, dtype=np.int64)
    _check_response_args(x, y, t0, eps, fit_steps)
    n, t_max = x.shape
    g = int(m.n_classes) if n_classes is None else int(n_classes)
    sl = m.layer_slice(layer)

    with torch.no_grad():
        h = m.init_state(n).to(device=device, dtype=dt)  # [N, S]
        for i in range(t0):
            _, h = m.step(h, x[:, i])
        z0 = h[:, sl].cpu().numpy().astype(np.float64)  # [N, S_layer]
        basis, m_t0 = _reference_at_t0(z0, y[:, t0 - 1], g, rank_tol, t0)
        hs = _perturbed_copies(h, sl, basis, eps * m_t0, rng if rng is not None else np.random.default_rng(0))
        rows: list[dict[str, Any]] = []
        for t in range(t0, t_max + 1):
            if t > t0:
                _, hs = m.step(hs, x[:, t - 1].repeat(3))
            z = hs[:, sl].cpu().numpy().astype(np.float64).reshape(3, n, -1)  # [3, N, S_layer]
            rows.append(_step_row(z, y[:, t - 1], g))
    attrs = {"t0": int(t0), "eps": float(eps), "layer": int(layer), "rank_tol": float(rank_tol)}
    return _response_dataset(rows, np.arange(t0, t_max + 1), fit_steps, m_t0, int(basis.shape[1]), attrs)
