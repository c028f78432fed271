"""Fixed points of a tracker's return maps per symbolic state (the ``fp_*`` variables of
paper A's analysis): the state-preserving words of a group's generators, and
:func:`tracker_fixed_points`, which runs :func:`dynlab.analysis.fixed_points.finder.find_fixed_points`
from each class's states for every word and summarises the principal fixed points per state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr

from dynlab.analysis.fixed_points.solve import Map, initial_points
from dynlab.analysis.fixed_points.finder import find_fixed_points, memoised_spectra, word_map
from dynlab.analysis.jacobian import analysis_copy
from dynlab.results.vocabulary import annotate

__all__ = ["generator_power_words", "tracker_fixed_points"]


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
    once (:func:`dynlab.analysis.fixed_points.finder.memoised_spectra`; the same numbers); False solves
    them again per state.
    """
    with memoised_spectra(memo):
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
