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
2. **solve** (:func:`solve`): from each start, a Levenberg–Marquardt solve of
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

**Slow points** (:func:`find_slow_points`; Sussillo & Barak 2013): local minima of the
speed q(h) = ½‖F(h) − h‖², found by an exact-Hessian trust-region Newton minimisation
(``scipy.optimize.minimize(method='trust-exact')``, gradient and Hessian of q from
``torch.func``), kept when the gradient norm is ≤ ``gtol`` · max(1, ‖F(h) − h‖) and
deduplicated.  A fixed point is a slow point of speed 0; a slow point of speed > 0 is
where the map moves least (the ghost of a fixed point).

Results are typed (:class:`FixedPoints`, :class:`SlowPoints`), all in float64.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg
import scipy.optimize
import torch
import xarray as xr
from torch.func import jacrev

from dynlab.analysis.jacobian import analysis_copy
from dynlab.results.vocabulary import annotate

__all__ = [
    "FixedPoints",
    "SlowPoints",
    "Solutions",
    "affine_fixed_set",
    "affine_part",
    "cell_map",
    "deduplicate",
    "find_fixed_points",
    "find_slow_points",
    "generator_power_words",
    "initial_points",
    "keep_converged",
    "orbit_starts",
    "solve",
    "spectrum",
    "tracker_fixed_points",
    "word_map",
]

Map = Callable[[torch.Tensor], torch.Tensor]


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


def _np_map(fn: Map, jac: Map) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """numpy wrappers ``h -> F(h)`` and ``h -> DF(h)`` of a torch map (float64, CPU)."""

    def f(h: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return fn(torch.as_tensor(h, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64)

    def df(h: np.ndarray) -> np.ndarray:
        return jac(torch.as_tensor(h, dtype=torch.float64)).detach().cpu().numpy().astype(np.float64)

    return f, df


def _jacobian(fn: Map) -> Map:
    return jacrev(fn)


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
    f, _ = _np_map(fn, _jacobian(fn))
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


def solve(fn: Map, starts: Any, *, newton_steps: int = 5, max_nfev: int | None = None) -> Solutions:
    """Step 2: Levenberg–Marquardt on r(h) = F(h) − h from each start, then Newton polishing
    (module docstring)."""
    x0 = np.atleast_2d(np.asarray(starts, dtype=np.float64))
    f, df = _np_map(fn, _jacobian(fn))
    s = x0.shape[1]
    eye = np.eye(s)
    pts, res = [], []
    for start in x0:
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


# -- memo ----------------------------------------------------------------------------------------

#: Results of :func:`spectrum` and of the SVD in :func:`affine_fixed_set`, keyed by the bytes
#: of their inputs; active only inside :func:`_memoised` (one :func:`tracker_fixed_points`
#: call).  An affine return map F_w has the same Jacobian A_w for every symbolic state (the
#: classes differ only in their starts), so without it the same eigenvalue problems and
#: SVDs are solved once per state; with it, once per word.  Equal inputs give the very
#: same numbers, so the results are bit-identical to solving again.
_MEMO: dict | None = None


@contextmanager
def _memoised(on: bool = True) -> Iterator[None]:
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


# -- affine maps -------------------------------------------------------------------------------


def affine_part(fn: Map, points: Any, *, tol: float = 1e-10) -> tuple[np.ndarray, np.ndarray] | None:
    """``(A [S, S], b [S])`` when DF is the same at every one of ``points [n, S]`` (largest
    entry difference ≤ ``tol`` · max(1, max |A|)) and at the origin, so that F(h) = A h + b;
    None otherwise.  With one point only the origin is compared."""
    f, df = _np_map(fn, _jacobian(fn))
    p = np.atleast_2d(np.asarray(points, dtype=np.float64))
    a0 = df(p[0])
    if not np.all(np.isfinite(a0)):
        return None
    scale = max(1.0, float(np.abs(a0).max()))
    for q in [*p[1:], np.zeros_like(p[0])]:
        if not np.abs(df(q) - a0).max() <= tol * scale:
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
    _, df = _np_map(fn, _jacobian(fn))
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
        f, _ = _np_map(fn, _jacobian(fn))
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
    _, df = _np_map(fn, _jacobian(fn))
    eig = np.asarray([spectrum(df(v))["eig"] for v in u], dtype=np.complex128).reshape(-1, s)
    return SlowPoints(u, sp[pick], np.asarray(gnorms)[pick], hits, eig)


# -- trackers: per symbolic state -------------------------------------------------------------


def generator_power_words(group: Any) -> list[list[int]]:
    """For each generator a of ``group`` (a :class:`dynlab.tracking.groups.Group`), the
    state-preserving word a^{ord(a)} as token indices (tokens are element indices)."""
    out = []
    for perm in group.generators:
        a = group.elements.index(tuple(perm))
        if a == group.identity:
            continue
        out.append([a] * group.element_order(a))
    return out


def _embed_basis(basis: Any | None, state_size: int, sl: slice) -> np.ndarray | None:
    if basis is None:
        return None
    b = np.asarray(basis, dtype=np.float64)
    full = np.zeros((state_size, b.shape[1]))
    full[sl] = b
    return full


def _state_summary(maps: Sequence[Map], words: Sequence[Sequence[int]], x0: np.ndarray, s: int,
                   basis: np.ndarray | None, tol: float, dedup_tol: float,
                   rank_tol: float, iterate: int = 0) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    """The ``fp_*`` summaries of one symbolic state from its starts ``x0`` (:func:`tracker_fixed_points`),
    and the eigenvalues (real, imaginary parts ``[W·S]``) at its principal fixed points."""
    eig_re = np.full(len(words) * s, np.nan)
    eig_im = np.full(len(words) * s, np.nan)
    res, cnt, dim, rperp, rpar, stab = [], [], [], [], [], []
    for j, (w, fn) in enumerate(zip(words, maps)):
        fp = find_fixed_points(fn, x0, basis=basis, tol=tol, dedup_tol=dedup_tol, rank_tol=rank_tol, iterate=iterate)
        res.append(fp.best_residual)
        cnt.append(fp.count)
        if fp.found:
            dim.append(fp.fixed_dim[0])
            rperp.append(fp.rho_perp[0] ** (1.0 / len(w)))
            rpar.append(fp.rho_par[0] ** (1.0 / len(w)))
            stab.append(bool(fp.stable[0]))
            eig_re[j * s:(j + 1) * s] = fp.eig[0].real
            eig_im[j * s:(j + 1) * s] = fp.eig[0].imag
    row = {"fp_residual": max(res), "fp_count": max(cnt) if not np.isnan(cnt).any() else np.nan}
    if dim:
        row.update(fp_dim=max(dim), fp_stable=float(all(stab)),
                   fp_rho_perp=np.nanmax(rperp) if np.isfinite(rperp).any() else np.nan,
                   fp_rho_par=np.nanmax(rpar) if np.isfinite(rpar).any() else np.nan)
    return row, eig_re, eig_im


def tracker_fixed_points(
    model: Any,
    words: Sequence[Sequence[int]],
    states: Any,
    labels: Any,
    *,
    n_classes: int,
    basis: Any | None = None,
    layer: int = -1,
    starts: int = 8,
    tol: float = 1e-8,
    dedup_tol: float = 1e-6,
    rank_tol: float = 1e-8,
    max_states: int | None = None,
    iterate: int = 500,
    memo: bool = True,
) -> xr.Dataset:
    """Fixed points of the return maps F_w of state-preserving ``words`` per symbolic state.

    For every class g present in ``labels`` ``[N]`` and every word w, the fixed points of F_w
    are sought from the first ``starts`` states of class g in ``states`` ``[N, S]`` (full flat
    states, e.g. after t_ref tokens) with :func:`find_fixed_points`; ``basis`` ``[S_layer,
    k]`` is an orthonormal basis of U in the coordinates of ``model.layer_slice(layer)``
    (embedded in the full state, zero elsewhere; U⊥ is its complement in the full state).
    The model is copied to float64 (:func:`dynlab.analysis.jacobian.analysis_copy`).

    With ``max_states``, only the states g < ``max_states`` are solved (the others are NaN):
    the work grows as states × words × starts.  Where no start of g reaches a fixed point of
    F_w, the orbit starts after ``iterate`` applications of F_w are solved
    (:func:`find_fixed_points`; 0 turns that off): a class's states at t_ref can lie far from
    where F_w sends them (a long run of one generator is a word the training never showed).

    The *principal* fixed point of (g, w) is the one reached from most of g's starts.
    Summaries per state g (dim ``state``; NaN for an absent class):

    - ``fp_residual``: max over words of the smallest residual ‖F_w(h) − h‖ reached (that of
      the principal fixed point when one was found);
    - ``fp_count``: max over words of the number of distinct fixed points (NaN when the fixed
      set of an affine F_w is a subspace of dimension > 0);
    - ``fp_dim``: max over words of the fixed set's dimension at the principal fixed point;
    - ``fp_rho_perp``, ``fp_rho_par``: max over words of ρ⊥^{1/|w|} and ρ∥^{1/|w|} at the
      principal fixed point (spectral radius per token, so words of different lengths
      compare; 1 = neutral, < 1 = contracting);
    - ``fp_stable``: 1 when every word's principal fixed point is stable, else 0;
    - ``fp_eig_real``, ``fp_eig_imag`` (``state, k_fp``): the eigenvalues of DF_w at the
      principal fixed points, all words one after another (S per word; NaN where a word has
      none).

    Returns an ``xarray.Dataset`` (vocabulary-annotated) with attrs ``fp_words`` (the words)
    and ``fp_starts``.  ``memo`` (default) solves each distinct Jacobian's spectrum and SVD
    once (:data:`_MEMO`; the same numbers); False solves them again per state.
    """
    with _memoised(memo):
        return _tracker_fixed_points(model, words, states, labels, n_classes, basis, layer, starts, tol, dedup_tol,
                                     rank_tol, max_states, iterate)


def _tracker_fixed_points(model: Any, words: Sequence[Sequence[int]], states: Any, labels: Any, n_classes: int,
                          basis: Any | None, layer: int, starts: int, tol: float, dedup_tol: float, rank_tol: float,
                          max_states: int | None, iterate: int) -> xr.Dataset:
    m = analysis_copy(model, torch.float64).cpu()
    h = np.asarray(states, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    s = int(m.state_size)
    if h.ndim != 2 or h.shape != (y.size, s):
        raise ValueError(f"states {h.shape} and labels {y.shape}; allowed: [N, {s}] and [N]")
    if len(words) == 0:
        raise ValueError("words is empty; allowed: at least one state-preserving word")
    b_full = _embed_basis(basis, s, m.layer_slice(layer))
    n_w = len(words)
    summ = {k: np.full(n_classes, np.nan) for k in
            ("fp_residual", "fp_count", "fp_dim", "fp_rho_perp", "fp_rho_par", "fp_stable")}
    eig_re = np.full((n_classes, n_w * s), np.nan)
    eig_im = np.full((n_classes, n_w * s), np.nan)
    maps = [word_map(m, w) for w in words]
    for g in range(n_classes if max_states is None else min(n_classes, int(max_states))):
        own = h[y == g]
        if own.shape[0] == 0:
            continue
        row, eig_re[g], eig_im[g] = _state_summary(maps, words, initial_points(own, starts), s, b_full, tol, dedup_tol,
                                                   rank_tol, iterate)
        for k, v in row.items():
            summ[k][g] = v
    data = {k: ("state", v) for k, v in summ.items()}
    data["fp_eig_real"] = (("state", "k_fp"), eig_re)
    data["fp_eig_imag"] = (("state", "k_fp"), eig_im)
    ds = xr.Dataset(data, coords={"state": np.arange(n_classes), "k_fp": np.arange(n_w * s)},
                    attrs={"fp_words": "; ".join(" ".join(str(int(t)) for t in w) for w in words),
                           "fp_starts": int(starts), "fp_iterate": int(iterate)})
    return annotate(ds)
