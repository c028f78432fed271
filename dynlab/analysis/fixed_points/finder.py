"""Fixed points and slow points of recurrent maps, their Jacobian spectra (float64).

A *map* is any function F: h ``[S]`` -> ``[S]`` written in torch operations (so that
``torch.func.jacrev`` differentiates it): a plain function, the return map F_w of a word w
of a tracker (:func:`word_map`: any model with the tracker protocol ``step(state [B, S],
tokens [B]) -> (logits, state)``, e.g. a :class:`dynlab.tracking.models.Tracker` of any registered
cell), or one step of a bare cell at a fixed input (:func:`cell_map`: any
:class:`dynlab.tracking.models.Cell`, built-in or registered with ``register_cell``).

The finder is a pipeline of small pure steps, in the manner of the fixed-point finders of
Golub & Sussillo (2018) and computation-thru-dynamics:

1. **initial points** (:func:`initial_points`): states the system visits (for a tracker, the
   states of one symbolic class), optionally subsampled and jittered; when no fixed point is
   found from them (and ``iterate`` > 0), the **orbit starts** (:func:`orbit_starts`): the
   states after ``iterate`` applications of F to each start (where the map's attractor is,
   when it is a stable fixed point) and the mean of each orbit's second half (the centre
   of an attracting invariant circle, where a repelling fixed point sits after a
   Neimark–Sacker bifurcation), solved in turn;
2. **solve** (:func:`solve`): plain Newton steps from every start at once (batched; a
   start they bring to ‖r‖ ≤ 1e-12 · max(1, ‖h‖) is solved, :func:`newton_all`), and for
   the other starts a Levenberg–Marquardt solve of
   r(h) = F(h) − h = 0 (``scipy.optimize.least_squares(method='lm')``) with the exact
   Jacobian DF(h) − I from ``torch.func.jacrev``, then up to ``newton_steps`` Newton steps
   (each kept only when it lowers ‖r‖).  LM minimises ½‖r‖², so where no root is near a
   start it ends in a local minimum of the speed;
3. **filter by residual** (:func:`keep_converged`): a solution is a fixed point when its
   residual ‖F(h*) − h*‖ ≤ ``tol`` · max(1, ‖h*‖);
4. **deduplicate** (:func:`deduplicate`): solutions closer than ``dedup_tol`` · max(1, scale)
   (scale = RMS norm of the starts) are one fixed point;
5. **Jacobian and spectrum** (:func:`spectrum`): the eigenvalues of DF(h*), the spectral
   radius ρ, and, given an orthonormal basis B ``[S, k]`` of a subspace U (for a tracker, the
   symbolic subspace), ρ∥ = spectral radius of Bᵀ DF B (DF compressed to U) and
   ρ⊥ = spectral radius of B⊥ᵀ DF B⊥ (compressed to U⊥, the orthogonal complement in the
   whole state).  A fixed point is **stable** when ρ < 1 (every eigenvalue inside the unit
   circle: nearby states converge to it).  ``fixed_dim`` is the nullity of DF(h*) − I
   (singular values ≤ ``rank_tol`` · max(1, ‖DF − I‖)): the dimension of the fixed set at
   h* (0 for an isolated fixed point, 1 on a line attractor).

**Affine maps** (:func:`affine_part`): when DF is the same at every start (to ``affine_tol``)
the map is F(h) = A h + b, and its fixed set {h : (A − I) h = −b} is solved in closed
form: empty when b is not in the range of A − I (no fixed point: ``count`` 0), otherwise an
affine subspace of dimension nullity(A − I).  Its point is kept under the residual rule of
step 3, like a solve (round-off in a nearly singular A − I can defeat it: then none).  A subspace of dimension > 0 is reported by
its dimension (``fixed_dim``) and ``count`` NaN: it holds infinitely many fixed points;
its representative point is the projection of the mean start onto it.

Steps 1–4 live in :mod:`dynlab.analysis.fixed_points.solve`; slow points (local minima of the
speed, :func:`find_slow_points`) in :mod:`dynlab.analysis.fixed_points.slow_points`; the per-state summaries
of a tracker's return maps in :mod:`dynlab.tracking.analysis.fixed_points.per_state`.  Results are typed
(:class:`FixedPoints`), all in float64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import torch

from dynlab.analysis.fixed_points.solve import (
    Map, deduplicate, jacobians, keep_converged, numpy_map, orbit_starts, solve,
)

__all__ = [
    "FixedPoints",
    "affine_fixed_set",
    "affine_part",
    "cell_map",
    "diagonal_spectrum",
    "find_fixed_points",
    "memoised_spectra",
    "spectrum",
    "word_map",
]


# -- maps ---------------------------------------------------------------------------------------


def word_map(model: Any, word: Sequence[int] | torch.Tensor) -> Map:
    """The return map F_w of ``word`` for a model with the tracker protocol: h ``[S]`` ->
    the state after reading the tokens of ``word`` from h (``model.step`` with batch 1).

    Pass a float64 copy of the model (:func:`dynlab.analysis.jacobian.analysis_copy`) for
    float64 results: the map computes in the model's own precision.
    """
    w = torch.as_tensor(word, dtype=torch.long).reshape(-1)
    if w.numel() == 0:
        raise ValueError("word is empty; allowed: a non-empty 1-D token sequence")
    tokens = [w[i].reshape(1) for i in range(w.numel())]

    def f(h: torch.Tensor) -> torch.Tensor:
        state = h.unsqueeze(0)
        for x in tokens:
            _, state = model.step(state, x.to(state.device))
        return state.squeeze(0)

    return f


def cell_map(cell: Any, u: Any) -> Map:
    """One step h -> h' of a bare cell (``Cell.step(h [B, S], u [B, D])``) at the fixed input
    ``u`` ``[D]`` (an embedded token, say): the one-step map F_x of that input."""
    u_t = torch.as_tensor(u)

    def f(h: torch.Tensor) -> torch.Tensor:
        _, new = cell.step(h.unsqueeze(0), u_t.to(device=h.device, dtype=h.dtype).reshape(1, -1))
        return new.squeeze(0)

    return f


# -- memo ----------------------------------------------------------------------------------------

#: Results of :func:`spectrum` and of the SVD in :func:`affine_fixed_set`, keyed by the bytes
#: of their inputs; active only inside :func:`memoised_spectra` (one call of
#: :func:`dynlab.tracking.analysis.fixed_points.per_state.tracker_fixed_points`).  An affine return map
#: F_w has the same Jacobian A_w for every symbolic state (the classes differ only in their
#: starts), so without it the same eigenvalue problems and SVDs are solved once per state;
#: with it, once per word.  Equal inputs give the very same numbers, so the results are
#: bit-identical to solving again.
_MEMO: dict | None = None


@contextmanager
def memoised_spectra(on: bool = True) -> Iterator[None]:
    """Inside it (``on``), :func:`spectrum` and the SVD of :func:`affine_fixed_set` reuse their
    results for byte-identical inputs (:data:`_MEMO`); ``on=False`` solves them again."""
    global _MEMO
    outer = _MEMO
    _MEMO = (outer if outer is not None else {}) if on else None
    try:
        yield
    finally:
        _MEMO = outer


def _cached(kind: str, arrays: Sequence[np.ndarray | None], extra: tuple, compute: Callable[[], Any]) -> Any:
    """``compute()``, or its earlier result for byte-identical ``arrays`` and equal ``extra``."""
    if _MEMO is None:
        return compute()
    h = hashlib.sha1(kind.encode())
    for a in arrays:
        h.update(b"none" if a is None else repr((a.shape, a.dtype.str)).encode() + np.ascontiguousarray(a).tobytes())
    key = (h.hexdigest(), extra)
    if key not in _MEMO:
        _MEMO[key] = compute()
    return _MEMO[key]


# -- 5. spectrum -------------------------------------------------------------------------------


def _radius(mat: np.ndarray) -> float:
    return float(np.max(np.abs(np.linalg.eigvals(mat)))) if mat.size else float("nan")


def _complement(basis: np.ndarray) -> np.ndarray:
    """Orthonormal basis ``[S, S - k]`` of the orthogonal complement of ``basis [S, k]``."""
    return scipy.linalg.null_space(basis.T) if basis.shape[1] else np.eye(basis.shape[0])


def spectrum(jac: Any, basis: Any | None = None, *, rank_tol: float = 1e-8) -> dict[str, Any]:
    """Step 5: of one Jacobian DF(h*) ``[S, S]``: ``eig`` (complex, largest modulus first),
    ``rho``, ``rho_par`` and ``rho_perp`` (on U and U⊥ of ``basis [S, k]``; NaN without a
    basis, or when the subspace is empty), ``stable`` (ρ < 1) and ``fixed_dim`` (nullity of
    DF − I; module docstring)."""
    a = np.asarray(jac, dtype=np.float64)
    b = None if basis is None else np.asarray(basis, dtype=np.float64)
    out = _cached("spectrum", (a, b), (float(rank_tol),), lambda: _spectrum(a, b, rank_tol))
    return {**out, "eig": out["eig"].copy()}


def _spectrum(a: np.ndarray, b: np.ndarray | None, rank_tol: float) -> dict[str, Any]:
    eig = np.linalg.eigvals(a)
    eig = eig[np.argsort(-np.abs(eig), kind="stable")]
    rho = float(np.abs(eig).max())
    rho_par = rho_perp = float("nan")
    if b is not None:
        if b.ndim != 2 or b.shape[0] != a.shape[0]:
            raise ValueError(f"basis has shape {b.shape}; allowed: [{a.shape[0]}, k]")
        if b.shape[1]:
            rho_par = _radius(b.T @ a @ b)
        c = _complement(b)
        if c.shape[1]:
            rho_perp = _radius(c.T @ a @ c)
    sv = np.linalg.svd(a - np.eye(a.shape[0]), compute_uv=False)
    fixed_dim = int((sv <= rank_tol * max(1.0, float(sv.max(initial=0.0)))).sum())
    return {"eig": eig, "rho": rho, "rho_par": rho_par, "rho_perp": rho_perp, "stable": rho < 1.0,
            "fixed_dim": fixed_dim}


def diagonal_spectrum(diag: Any, basis: Any | None = None, *, rank_tol: float = 1e-8) -> dict[str, Any]:
    """:func:`spectrum` of a diagonal Jacobian ``diag(d)`` given ``d [S]``, without forming it:
    the eigenvalues are ``d``; ρ∥ = ρ(Bᵀ diag(d) B) (k × k); ρ⊥ is the spectral radius of the
    symmetric P⊥ diag(d) P⊥ (its nonzero eigenvalues are those of Cᵀ diag(d) C, C an
    orthonormal basis of U⊥), found by Lanczos (``scipy.sparse.linalg.eigsh``) on products
    with ``d`` and ``B``; ``fixed_dim`` counts the d_i within ``rank_tol`` of 1, as the
    singular values of diag(d) − I are |d_i − 1|.  Real ``d`` only (a diagonal SSM's own-state
    Jacobian: Mamba's and GLA's decays)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    d = np.asarray(diag, dtype=np.float64)
    if d.ndim != 1 or np.iscomplexobj(diag):
        raise ValueError(f"diag must be a real vector; got shape {d.shape}")
    eig = d[np.argsort(-np.abs(d), kind="stable")]
    rho = float(np.abs(d).max())
    rho_par = rho_perp = float("nan")
    b = None if basis is None else np.asarray(basis, dtype=np.float64)
    if b is not None:
        if b.ndim != 2 or b.shape[0] != d.size:
            raise ValueError(f"basis has shape {b.shape}; allowed: [{d.size}, k]")
        q = np.linalg.qr(b)[0] if b.shape[1] else b  # orthonormal, as _complement's null space is
        if q.shape[1]:
            rho_par = _radius((q.T * d) @ q)
        if q.shape[1] < d.size:
            if d.size <= 64:  # small: the dense complement is exact and cheap
                c = _complement(q)
                rho_perp = _radius((c.T * d) @ c)
            else:
                def perp(v: np.ndarray) -> np.ndarray:
                    v = v - q @ (q.T @ v)
                    w = d * v
                    return w - q @ (q.T @ w)

                op = LinearOperator((d.size, d.size), matvec=perp, dtype=np.float64)
                rho_perp = float(np.abs(eigsh(op, k=1, which="LM", return_eigenvectors=False)).max())
    dev = np.abs(d - 1.0)
    fixed_dim = int((dev <= rank_tol * max(1.0, float(dev.max(initial=0.0)))).sum())
    return {"eig": eig, "rho": rho, "rho_par": rho_par, "rho_perp": rho_perp, "stable": rho < 1.0,
            "fixed_dim": fixed_dim}


# -- affine maps -------------------------------------------------------------------------------


def affine_part(fn: Map, points: Any, *, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray] | None:
    """``(A [S, S], b [S])`` when DF is the same at every one of ``points [n, S]`` (largest
    entry difference ≤ ``tol`` · max(1, max |A|)) and at the origin, so that F(h) = A h + b;
    None otherwise.  With one point only the origin is compared."""
    f, _ = numpy_map(fn)
    p = np.atleast_2d(np.asarray(points, dtype=np.float64))
    jacs = jacobians(fn, np.concatenate([p, np.zeros_like(p[:1])]))  # the points, then the origin
    a0 = jacs[0]
    if not np.all(np.isfinite(a0)):
        return None
    scale = max(1.0, float(np.abs(a0).max()))
    if not np.all(np.abs(jacs[1:] - a0).reshape(len(jacs) - 1, -1).max(axis=1) <= tol * scale):
        return None
    b = f(p[0]) - a0 @ p[0]
    return a0, b


def affine_fixed_set(a: Any, b: Any, *, rank_tol: float = 1e-8) -> tuple[np.ndarray, np.ndarray] | None:
    """The fixed set of h -> A h + b: ``(p [S], N [S, d])`` with {p + N c} the fixed points
    (N orthonormal, d = nullity of A − I at ``rank_tol`` relative), or None when empty
    (b not in the range of A − I: its least-squares residual exceeds ``rank_tol`` ·
    max(1, ‖b‖, ‖A − I‖ ‖p‖))."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = a - np.eye(a.shape[0])
    u, sv, vt = _cached("svd", (m,), (), lambda: np.linalg.svd(m))
    cut = rank_tol * max(1.0, float(sv.max(initial=0.0)))
    rank = int((sv > cut).sum())
    # least-squares solution of m p = -b on the range
    coef = (u[:, :rank].T @ -b) / sv[:rank]
    p = vt[:rank].T @ coef
    miss = float(np.linalg.norm(m @ p + b))
    if miss > rank_tol * max(1.0, float(np.linalg.norm(b)), float(sv.max(initial=0.0)) * float(np.linalg.norm(p))):
        return None
    return p, vt[rank:].T


# -- the finder ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedPoints:
    """Distinct fixed points of a map found from a set of starts.

    Attributes:
        points: ``[u, S]`` distinct fixed points, most often reached first.
        residuals: ``[u]`` ‖F(h*) − h*‖.
        hits: ``[u]`` starts that converged to each.
        eig: ``[u, S]`` eigenvalues of DF(h*) (complex, largest modulus first).
        rho, rho_par, rho_perp: ``[u]`` spectral radius of DF(h*), on U and on U⊥.
        stable: ``[u]`` ρ < 1.
        fixed_dim: ``[u]`` dimension of the fixed set at each point (nullity of DF − I).
        count: distinct fixed points (NaN for an affine map whose fixed set is a subspace
            of dimension > 0: infinitely many; see ``fixed_dim``).
        best_residual: smallest residual over every solve (the distance from a fixed point
            when none was found).
        affine: the map was found affine (closed-form fixed set).
        n_starts: starts used.
    """

    points: np.ndarray
    residuals: np.ndarray
    hits: np.ndarray
    eig: np.ndarray
    rho: np.ndarray
    rho_par: np.ndarray
    rho_perp: np.ndarray
    stable: np.ndarray
    fixed_dim: np.ndarray
    count: float
    best_residual: float
    affine: bool
    n_starts: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.points.shape[0] > 0


def _with_spectra(fn: Map, points: np.ndarray, residuals: np.ndarray, hits: np.ndarray, basis: Any | None,
                  rank_tol: float, jacs: Sequence[np.ndarray] | None = None) -> dict[str, np.ndarray]:
    _, df = numpy_map(fn)
    specs = [spectrum(jacs[i] if jacs is not None else df(p), basis, rank_tol=rank_tol) for i, p in enumerate(points)]
    s = points.shape[1]
    return {
        "points": points, "residuals": residuals, "hits": hits,
        "eig": np.asarray([sp["eig"] for sp in specs], dtype=np.complex128).reshape(-1, s),
        "rho": np.asarray([sp["rho"] for sp in specs], dtype=np.float64),
        "rho_par": np.asarray([sp["rho_par"] for sp in specs], dtype=np.float64),
        "rho_perp": np.asarray([sp["rho_perp"] for sp in specs], dtype=np.float64),
        "stable": np.asarray([sp["stable"] for sp in specs], dtype=bool),
        "fixed_dim": np.asarray([sp["fixed_dim"] for sp in specs], dtype=np.int64),
    }


def find_fixed_points(
    fn: Map,
    starts: Any,
    *,
    basis: Any | None = None,
    tol: float = 1e-8,
    dedup_tol: float = 1e-6,
    rank_tol: float = 1e-8,
    affine_tol: float = 1e-10,
    newton_steps: int = 5,
    iterate: int = 0,
) -> FixedPoints:
    """Fixed points of ``fn`` from ``starts [n, S]`` through the pipeline of the module
    docstring (affine maps in closed form).  ``basis`` ``[S, k]``: orthonormal basis of U for
    ρ∥ and ρ⊥.  ``iterate`` > 0: when no start reaches a fixed point of a map that is not
    affine, the :func:`orbit_starts` of ``iterate`` applications are solved instead (then
    ``extra["orbit_starts"]`` is their number; ``best_residual`` is the smallest over both
    sets of solves)."""
    x0 = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    if x0.ndim != 2 or x0.shape[0] == 0 or not np.all(np.isfinite(x0)):
        raise ValueError(f"starts has shape {x0.shape}; allowed: finite [n >= 1, S]")
    s = x0.shape[1]
    scale = max(1.0, float(np.sqrt((x0**2).sum(-1).mean())))
    aff = affine_part(fn, x0, tol=affine_tol)
    if aff is not None:
        a, b = aff
        fixed = affine_fixed_set(a, b, rank_tol=rank_tol)
        f, _ = numpy_map(fn)
        if fixed is None:
            # no fixed point: the smallest residual is that of the least-squares point
            lsq = np.linalg.lstsq(a - np.eye(s), -b, rcond=None)[0]
            best = float(np.linalg.norm(f(lsq) - lsq))
            empty = _with_spectra(fn, np.zeros((0, s)), np.zeros(0), np.zeros(0, dtype=np.int64), basis, rank_tol)
            return FixedPoints(**empty, count=0.0, best_residual=best, affine=True, n_starts=x0.shape[0])
        p, null = fixed
        if null.shape[1]:
            p = p + null @ (null.T @ (x0.mean(0) - p))  # the fixed point nearest the mean start
        res = np.asarray([float(np.linalg.norm(f(p) - p))])
        if not res[0] <= tol * max(1.0, float(np.linalg.norm(p))):  # the point does not evaluate as fixed (round-off
            # of a nearly singular A − I, or overflow): the same acceptance rule as the solves
            empty = _with_spectra(fn, np.zeros((0, s)), np.zeros(0), np.zeros(0, dtype=np.int64), basis, rank_tol)
            return FixedPoints(**empty, count=0.0, best_residual=float(res[0]), affine=True, n_starts=x0.shape[0])
        parts = _with_spectra(fn, p[None], res, np.asarray([x0.shape[0]]), basis, rank_tol, jacs=[a])
        parts["fixed_dim"] = np.asarray([null.shape[1]], dtype=np.int64)
        count = 1.0 if null.shape[1] == 0 else float("nan")
        return FixedPoints(**parts, count=count, best_residual=float(res[0]), affine=True, n_starts=x0.shape[0])
    sol = solve(fn, x0, newton_steps=newton_steps)
    best = float(np.min(sol.residuals)) if sol.residuals.size else float("nan")
    conv = keep_converged(sol, tol)
    extra: dict[str, Any] = {}
    if iterate > 0 and conv.points.shape[0] == 0:
        more = orbit_starts(fn, x0, iterate, dedup_tol=dedup_tol)
        extra["orbit_starts"] = int(more.shape[0])
        if more.shape[0]:
            sol = solve(fn, more, newton_steps=newton_steps)
            best = float(np.nanmin([best, *sol.residuals]))
            conv = keep_converged(sol, tol)
    pts, res, hits = deduplicate(conv.points, conv.residuals, dedup_tol * scale) if conv.points.size else (
        np.zeros((0, s)), np.zeros(0), np.zeros(0, dtype=np.int64))
    parts = _with_spectra(fn, pts.reshape(-1, s), res, hits, basis, rank_tol)
    return FixedPoints(**parts, count=float(pts.shape[0]), best_residual=best, affine=False, n_starts=x0.shape[0],
                       extra=extra)
