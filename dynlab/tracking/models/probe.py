"""Measure a cell's family from its state Jacobian (docs/error-control.md, "The models").

A cell is *affine* when J_t = ∂h_t/∂h_{t-1} does not depend on h_{t-1}.  The probe draws
random inputs and pairs of random states, computes J at both states with
``torch.func.jacrev`` (batched with ``vmap``) in float64, and calls the cell
state-dependent when the relative difference ‖J(h) − J(h')‖_F / ‖J(h)‖_F exceeds
``tol`` for any probe.
"""

from __future__ import annotations

import copy

import torch
from torch.func import jacrev, vmap

from dynlab.tracking.models.cell_base import Cell

__all__ = ["measure_family", "probe_jacobian_variation"]


def probe_jacobian_variation(cell: Cell, n_probes: int = 8, scale: float = 1.0, seed: int = 0) -> float:
    """Largest relative change of the state Jacobian between two random states.

    Random states are N(0, scale²) per entry, inputs N(0, 1); float64 throughout.
    Returns max over probes of ‖J(h) − J(h')‖_F / max(‖J(h)‖_F, 1e-300).
    """
    gen = torch.Generator().manual_seed(seed)
    c = copy.deepcopy(cell).to(torch.float64).eval()
    u = torch.randn(n_probes, c.d_in, generator=gen, dtype=torch.float64)
    h1 = scale * torch.randn(n_probes, c.state_size, generator=gen, dtype=torch.float64)
    h2 = scale * torch.randn(n_probes, c.state_size, generator=gen, dtype=torch.float64)

    def one(h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # h [S], x [D] -> [S]
        return c.step(h[None], x[None])[1][0]

    jac = vmap(jacrev(one))  # [P, S, S]
    with torch.no_grad():
        j1, j2 = jac(h1, u), jac(h2, u)
    num = torch.linalg.matrix_norm(j1 - j2)
    den = torch.linalg.matrix_norm(j1).clamp_min(1e-300)
    return float((num / den).max())


def measure_family(cell: Cell, n_probes: int = 8, tol: float = 1e-9, seed: int = 0) -> str:
    """``"affine"`` if the state Jacobian is the same at random states, else ``"state-dependent"``."""
    return "state-dependent" if probe_jacobian_variation(cell, n_probes, seed=seed) > tol else "affine"
