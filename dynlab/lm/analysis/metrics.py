"""Length-generalization metrics for language models (docs/length-generalization.md), as xarray objects.

Definitions (positions: ``t`` counts the tokens of context, so the target at ``t`` is
``x_t`` predicted from ``x_0 … x_{t-1}``; ``nll[s, t-1]`` in the arrays below):

- PPL(t) = exp( (1/S) Σ_s −log q(x_t^s | x_{<t}^s) ): the NLL is averaged over samples at
  each position first, then exponentiated (never the mean of per-sample perplexities).
  :func:`binned_ppl` pools the NLL over samples *and* the positions of a bin, then
  exponentiates (same rule, less noise). :func:`log_binned_ppl` does the same on
  log-spaced bins (paper B's Fig. 1 axis, to 128K tokens and beyond): the bin ending at
  ``e_k`` holds the positions ``e_{k-1} < t ≤ e_k``, ``e`` the distinct rounded points of a
  geometric grid from 1 to the last position.
- Length generalization (Definition 3.2): with p* = min_{t ≤ T_train} PPL(t) at t*, the
  model generalizes to T > T_train iff PPL(t) ≤ p* for every t in [t*, T]. The worst
  violation is max_{t ≥ t*} PPL(t) − p* (≤ 0 when the verdict is a pass).
- Effective remembrance: EffRem_T(t) = d(q(·|x_{0:T}), q(·|x_{t:T})), averaged over samples,
  where x_{a:b} = x_a … x_{b−1} and q(·|·) is the next-token distribution after the context,
  with d = total variation ½Σ_v|p(v) − q(v)| (default), Jensen–Shannon divergence in bits
  (∈ [0, 1]) or 1 − cos(p, q) (computed as ½‖p/‖p‖ − q/‖q‖‖², equal to 1 − cos). All three
  are exactly 0 for identical distributions, so EffRem_T(0) = 0 exactly.
- In-range and far PPL (:func:`ppl_ranges`): ``ppl_in`` is the mean binned PPL over the
  bins ending in (T_train/2, T_train], ``ppl_far`` over the bins ending in the last eighth
  (7L/8, L] of the evaluation length L, and ``far_in_ratio = ppl_far / p*`` (p* of
  Definition 3.2); a ratio above 1 means the PPL rises beyond the training length.
  ``far_over_in = ppl_far / ppl_in`` divides by one in-range reference for every T_train
  (p* is the lowest-PPL bin at or below T_train, which can be a bin of the first few
  positions, with almost no context, so its position moves with T_train and the budget).
- State statistics per layer, head and position: mean and standard deviation (population)
  of the state entries pooled over samples and the head's P·N entries, and the mean over
  samples of the head's Euclidean (Frobenius) state norm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import xarray as xr

from dynlab.results.vocabulary import annotate, attrs_of

__all__ = [
    "DISTANCES", "position_ppl", "binned_ppl", "log_bin_ends", "log_binned_ppl", "LengthGeneralization", "length_generalization",
    "distribution_distance", "effective_remembrance", "state_statistics", "ppl_ranges",
]

DISTANCES = ("tv", "js", "cos")


def _nll_2d(nll: np.ndarray) -> np.ndarray:
    arr = np.asarray(nll, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"nll must be [sample, position] with at least one position, got shape {arr.shape}")
    return arr


def position_ppl(nll: np.ndarray) -> xr.DataArray:
    """PPL(t) from ``nll [S, T]`` (nats) -> DataArray over ``t = 1..T``."""
    arr = _nll_2d(nll)
    t = np.arange(1, arr.shape[1] + 1)
    return xr.DataArray(np.exp(arr.mean(axis=0)), dims=("t",), coords={"t": ("t", t, attrs_of("t"))}, name="ppl",
                        attrs=attrs_of("ppl"))


def binned_ppl(nll: np.ndarray, bin_width: int) -> xr.DataArray:
    """exp(mean NLL over samples and the positions of each bin) -> DataArray over ``t_bin`` =
    bin end (the axis of ``ppl_binned`` in a study dataset).

    Bins are ``(k·w, (k+1)·w]``; a trailing partial bin is dropped.
    """
    arr = _nll_2d(nll)
    if bin_width < 1 or bin_width > arr.shape[1]:
        raise ValueError(f"bin_width must be in [1, {arr.shape[1]}], got {bin_width}")
    n_bins = arr.shape[1] // bin_width
    pooled = arr[:, : n_bins * bin_width].reshape(arr.shape[0], n_bins, bin_width).mean(axis=(0, 2))
    t = (np.arange(n_bins) + 1) * bin_width
    return xr.DataArray(np.exp(pooled), dims=("t_bin",), coords={"t_bin": ("t_bin", t, attrs_of("t_bin"))}, name="ppl_binned",
                        attrs=attrs_of("ppl_binned", bin_width=int(bin_width)))


def log_bin_ends(length: int, n_bins: int) -> np.ndarray:
    """The ends ``e_k`` of :func:`log_binned_ppl`'s bins: the distinct values of
    ``round(geomspace(1, length, n_bins))`` (fewer than ``n_bins`` where the first ones round
    alike), the last one ``length``."""
    if length < 1 or n_bins < 1:
        raise ValueError(f"length and n_bins must be positive, got {length} and {n_bins}")
    return np.unique(np.round(np.geomspace(1, length, max(n_bins, 2))).astype(np.int64))


def log_binned_ppl(ppl: xr.DataArray, n_bins: int = 48) -> xr.DataArray:
    """PPL(t) pooled on log-spaced bins: ``exp`` of the mean of ``log PPL(t)`` (the mean NLL
    over samples at t) over the positions ``e_{k-1} < t ≤ e_k`` of each bin
    (:func:`log_bin_ends`) -> DataArray over ``t_log`` = the bin end.

    ``ppl``: a :func:`position_ppl` curve on ``t = 1..T`` (its other dims are kept). Every
    position counts once, so the bins hold 1, 1, …, then ever more positions.
    """
    t = np.asarray(ppl["t"].values)
    if t.size == 0 or not np.array_equal(t, np.arange(1, t.size + 1)):
        raise ValueError("ppl must be a position_ppl curve on t = 1..T")
    ends = log_bin_ends(int(t.size), n_bins)
    starts = np.concatenate([[0], ends[:-1]])
    logp = np.log(np.asarray(ppl.transpose(..., "t").values, dtype=np.float64))  # [..., T]
    pooled = np.add.reduceat(logp, starts, axis=-1) / (ends - starts)  # bin k: positions starts[k] < t <= ends[k]
    dims = tuple(d for d in ppl.dims if d != "t") + ("t_log",)
    return xr.DataArray(np.exp(pooled), dims=dims,
                        coords={**{d: ppl[d] for d in dims[:-1] if d in ppl.coords},
                                "t_log": ("t_log", ends, attrs_of("t_log"))},
                        name="ppl_log", attrs=attrs_of("ppl_log", n_bins=int(n_bins)))


@dataclass(frozen=True)
class LengthGeneralization:
    """Definition 3.2 verdict: ``passed``; p* and t*; worst violation max_{t ≥ t*} PPL(t) − p* at ``worst_t``."""

    passed: bool
    p_star: float
    t_star: int
    worst_violation: float
    worst_t: int
    max_t: int

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


def length_generalization(ppl: xr.DataArray, train_length: int) -> LengthGeneralization:
    """Apply Definition 3.2 to ``ppl(t)`` (a curve on one position dim: ``t`` as
    :func:`position_ppl` gives, ``t_bin`` as :func:`binned_ppl`) with training length ``train_length``.

    Needs at least one position ``t ≤ train_length`` and one beyond it.
    """
    (dim,) = ppl.dims
    t = np.asarray(ppl[dim].values)
    values = np.asarray(ppl.values, dtype=np.float64)
    inside = t <= train_length
    if not inside.any() or inside.all():
        raise ValueError(f"ppl must have positions both <= and > train_length={train_length}; got t in [{t.min()}, {t.max()}]")
    i_star = int(np.argmin(np.where(inside, values, np.inf)))
    p_star = float(values[i_star])
    after = np.arange(len(t)) >= i_star
    excess = np.where(after, values - p_star, -np.inf)
    i_worst = int(np.argmax(excess))
    worst = float(excess[i_worst])
    return LengthGeneralization(passed=bool(worst <= 0.0), p_star=p_star, t_star=int(t[i_star]),
                                worst_violation=worst, worst_t=int(t[i_worst]), max_t=int(t.max()))


def ppl_ranges(ppl_binned: xr.DataArray, p_star: xr.DataArray | float,
               train_length: int | xr.DataArray) -> xr.Dataset:
    """``ppl_in``, ``ppl_far``, ``far_in_ratio`` and ``far_over_in`` (module docstring) of binned PPL curves
    ``ppl_binned`` (on the bin ends, dim ``t_bin``, as :func:`binned_ppl` gives and a study
    dataset holds; NaN where a curve has no bin; any other dims are kept) of models trained
    at ``train_length``; ``p_star`` and ``train_length`` broadcast against them.  The far
    range ends at the last bin any curve has."""
    t = ppl_binned["t_bin"]
    last = float(t.where(ppl_binned.notnull().any([d for d in ppl_binned.dims if d != "t_bin"])).max())
    inside = ppl_binned.where((t > train_length / 2) & (t <= train_length)).mean("t_bin")
    far = ppl_binned.where((t > last - last / 8) & (t <= last)).mean("t_bin")
    return annotate(xr.Dataset({"ppl_in": inside, "ppl_far": far, "far_in_ratio": far / p_star,
                                "far_over_in": far / inside}))


def distribution_distance(p: np.ndarray, q: np.ndarray, kind: str = "tv") -> np.ndarray:
    """Distance between distributions along the last axis: ``[..., V], [..., V] -> [...]`` (float64)."""
    if kind not in DISTANCES:
        raise ValueError(f"distance must be one of {DISTANCES}, got {kind!r}")
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    if kind == "tv":
        return 0.5 * np.abs(p - q).sum(axis=-1)
    if kind == "js":
        m = 0.5 * (p + q)

        def kl(a: np.ndarray) -> np.ndarray:
            ratio = np.where(a > 0, a / np.where(m > 0, m, 1.0), 1.0)
            return np.where(a > 0, a * np.log2(ratio), 0.0).sum(axis=-1)

        return 0.5 * kl(p) + 0.5 * kl(q)
    pn = p / np.linalg.norm(p, axis=-1, keepdims=True)
    qn = q / np.linalg.norm(q, axis=-1, keepdims=True)
    return 0.5 * ((pn - qn) ** 2).sum(axis=-1)


#: Dataset name of EffRem under each distance (their long names and units: the vocabulary).
EFFREM_NAMES = {"tv": "effrem", "js": "effrem_js", "cos": "effrem_cos"}


def effective_remembrance(p_full: np.ndarray, p_trunc: np.ndarray, t: np.ndarray, kind: str = "tv") -> xr.DataArray:
    """EffRem_T(t) averaged over samples.

    Args:
        p_full: ``[S, V]`` q(·|x_{0:T}).
        p_trunc: ``[S, n_t, V]`` q(·|x_{t:T}) for each t.
        t: ``[n_t]`` truncation starts.
        kind: ``"tv"``, ``"js"`` or ``"cos"``.
    """
    p_full = np.asarray(p_full, dtype=np.float64)
    p_trunc = np.asarray(p_trunc, dtype=np.float64)
    t = np.asarray(t)
    if p_trunc.ndim != 3 or p_trunc.shape[0] != p_full.shape[0] or p_trunc.shape[1] != len(t):
        raise ValueError(f"p_trunc must be [S, n_t, V] with S={p_full.shape[0]}, n_t={len(t)}, got {p_trunc.shape}")
    d = distribution_distance(p_full[:, None, :], p_trunc, kind).mean(axis=0)  # [n_t]
    name = EFFREM_NAMES[kind]
    return xr.DataArray(d, dims=("t",), coords={"t": ("t", t, attrs_of("t"))}, name=name,
                        attrs=attrs_of(name, distance=kind))


def state_statistics(states: np.ndarray, positions: np.ndarray) -> xr.Dataset:
    """Statistics of recurrent states ``[S, layer, head, n_pos, entries]`` at ``positions [n_pos]``.

    Returns a Dataset with ``state_mean``, ``state_std``, ``state_norm`` over (layer, head, t).
    """
    arr = np.asarray(states, dtype=np.float64)
    if arr.ndim != 5 or arr.shape[3] != len(positions):
        raise ValueError(f"states must be [sample, layer, head, position, entries] with {len(positions)} positions, got {arr.shape}")
    coords = {"layer": np.arange(arr.shape[1]), "head": np.arange(arr.shape[2]), "t": np.asarray(positions)}
    dims = ("layer", "head", "t")
    mean = arr.mean(axis=(0, 4))
    std = arr.std(axis=(0, 4))
    norm = np.linalg.norm(arr, axis=4).mean(axis=0)
    return annotate(xr.Dataset(
        {"state_mean": (dims, mean), "state_std": (dims, std), "state_norm": (dims, norm)}, coords=coords
    ))
