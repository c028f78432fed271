"""Paper A's geometry of the state on paper B's tasks: U, R, M, q, a probe, T_cross, Jacobians, fixed points.

The symbolic variable a task model's state must carry, and the distance since it was
written, per task (``docs/preregistration-task-geometry.md`` fixes the rule):

- **passkey**: the key's last digit (10 classes); a probe sample is the needle followed by
  ``d`` filler tokens and the question (a passkey sample at depth 0 with ``d`` filler
  tokens); the state read is the one after the last filler token, ``d`` tokens after the
  needle ends; its accuracy is the whole key predicted exactly;
- **copying**: the first letter of the string (26 classes); a probe sample is a string of
  ``d`` letters; the state read is the one after the separator ``|``; its accuracy is the
  per-character accuracy of the copy;
- **babi**: the room of the person asked about (6 classes); a probe sample is a qa1
  story of the task's ``n_facts`` moves, the asked person the one who moved last, then
  ``d`` filler tokens and the question "Where is <person>?"; the state read is the one
  after the last filler token, ``d`` tokens after that last move; its accuracy is the
  room answered exactly (teacher forcing).

Per distance bin, the states of one layer (the flat ``[H·P·N]`` SSM state, last layer by
default) go through :func:`dynlab.analysis.geometry.geometry_over_time` with the bins in the
place of the steps: class centroids, U (rank tolerance 1e-6), R (pooled unbiased scatter),
M, q = R/M, R_par, R_perp; beside them a cross-validated linear probe (standardised states,
``LogisticRegression``, 5-fold ``cross_val_score``).  T_cross is the first distance whose q
reaches ``tau`` (default 1, persistence 1 bin); never crossed: censored at the largest
distance (``T_cross`` = that distance, ``crossed`` False).  The retrieval horizon is the
first distance whose accuracy is below 0.5, censored the same way.

The recurrence (:class:`dynlab.lm.analysis.recurrence.LMRecurrence`): one token step of the whole LM on a flat state
(every layer's SSM state, then every layer's convolution window), with the tracker
protocol of :mod:`dynlab.analysis.jacobian` and :mod:`dynlab.analysis.fixed_points.finder`
(``step(state [B, S], tokens [B]) -> (logits [B, V], state [B, S])``), so their Jacobians,
spectra split along and across U (ρ∥, ρ⊥) and fixed-point finder apply unchanged.  The
spectra the study records are those of the tracked (last) layer's own block of the step
Jacobian (:func:`dynlab.lm.analysis.recurrence.layer_jacobians`): the eigenproblem of the whole flat state costs about
95 s a sample at the quick presets' size (4864 numbers), the block's 3 s.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import xarray as xr
from torch import nn

from dynlab.analysis.geometry import crossing_time, geometry_over_time
from dynlab.lm.analysis.recurrence import FP_MAX_STATE, LMRecurrence, filler_fixed_points, recurrence_spectra
from dynlab.results.vocabulary import annotate
from dynlab.lm.data.babi import ROOMS, BabiTask
from dynlab.lm.data.tasks import CopyingTask, PasskeyTask

__all__ = ["DISTANCES", "probe_accuracy", "distance_geometry", "task_probes", "model_task_geometry",
           "preregistered_test", "geometry_row", "censored_first_below"]

#: Distance bins: pre-registered for passkey (tokens) and copying (letters); babi (tokens) came after the pre-registration.
DISTANCES = {"passkey": (8, 16, 32, 64, 128, 256, 512), "copying": (4, 8, 16, 32, 64),
             "babi": (8, 16, 32, 64, 128, 256, 512)}
N_CLASSES = {"passkey": 10, "copying": 26, "babi": len(ROOMS)}
PROBE_SEED_OFFSET = 1_000_003 + 7
#: Probe samples per distance bin (pre-registered).
PROBE_SAMPLES = 256


def probe_accuracy(states: np.ndarray, labels: np.ndarray, folds: int = 5, seed: int = 0) -> float:
    """Mean ``folds``-fold cross-validated accuracy of a logistic-regression probe of
    ``labels [N]`` from standardised ``states [N, S]`` (stratified folds, shuffled with
    ``seed``); NaN when a class has fewer members than ``folds`` allows or only one class."""
    from sklearn.decomposition import PCA
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.preprocessing import StandardScaler

    _, counts = np.unique(labels, return_counts=True)
    k = min(folds, int(counts.min()))
    if counts.size < 2 or k < 2:
        return float("nan")
    # PCA (every component) before the L2-penalised regression changes no optimum: the
    # weights lie in the span of the (centred, standardised) training states, so fitting
    # in its coordinates is the same problem in at most N dimensions instead of S.  Where
    # 300 lbfgs steps stop short of the optimum the two can score a little differently
    # (0.227 vs 0.231 on an untrained quick-size passkey model, 2.6x faster).
    clf = make_pipeline(StandardScaler(), PCA(svd_solver="full"), LogisticRegression(max_iter=300))
    cv = StratifiedKFold(n_splits=k, shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 300 lbfgs iterations: a probe, not a fit to the last digit
        return float(cross_val_score(clf, np.asarray(states, np.float64), labels, cv=cv).mean())


def censored_first_below(values: Sequence[float], distances: Sequence[int], level: float) -> tuple[float, bool]:
    """``(first distance with value < level, True)``; ``(largest distance, False)`` when none."""
    for v, d in zip(values, distances):
        if v < level:
            return float(d), True
    return float(distances[-1]), False


def distance_geometry(states: Any, labels: Any, accuracy: Sequence[float], distances: Sequence[int], n_classes: int,
                      *, tau: float = 1.0, probe: bool = True) -> xr.Dataset:
    """Geometry per distance bin of ``states [N, D, S]`` with ``labels [N, D]`` (bin j = ``distances[j]``).

    Returns a dataset on dim ``distance``: ``q, R, M, R_par, R_perp, k_U, probe_accuracy,
    accuracy`` and scalars ``T_cross, crossed, horizon, horizon_reached`` (module docstring).
    """
    h = np.asarray(states, np.float64)
    y = np.asarray(labels, np.int64)
    dist = np.asarray(distances, np.int64)
    g = geometry_over_time(h, y, n_classes=n_classes, tau=tau, persist=1, saturation_t=0)
    t_idx, crossed = crossing_time(g["q"].values, tau, np.arange(dist.size), persist=1)
    t_cross = float(dist[int(t_idx)]) if crossed else float(dist[-1])
    horizon, reached = censored_first_below(accuracy, dist, 0.5)
    probes = [probe_accuracy(h[:, j], y[:, j]) if probe else float("nan") for j in range(dist.size)]
    keep = ["q", "R", "M", "R_par", "R_perp", "k_U"]
    ds = xr.Dataset({k: ("distance", g[k].values) for k in keep}, coords={"distance": dist})
    ds["probe_accuracy"] = ("distance", np.asarray(probes))
    ds["accuracy"] = ("distance", np.asarray(accuracy, np.float64))
    ds["T_cross"] = ((), t_cross)
    ds["crossed"] = ((), bool(crossed))
    ds["horizon"] = ((), horizon)
    ds["horizon_reached"] = ((), bool(reached))
    ds.attrs.update(tau=float(tau), persist=1, accuracy_level=0.5)
    return ds


def task_probes(kind: str, task: Any, generator: torch.Generator, n: int, d: int) -> tuple[torch.Tensor, int, Any, np.ndarray]:
    """``(tokens [n, L], read position, TaskBatch, labels [n])`` of one distance bin ``d``.

    The state read is the one after ``tokens[:, :position]`` (module docstring)."""
    if kind not in DISTANCES:
        raise ValueError(f"task kind {kind!r} has no symbolic variable; allowed: {', '.join(DISTANCES)}")
    assert isinstance(task, (PasskeyTask, CopyingTask, BabiTask))
    batch, position, labels = task.probe_samples(generator, n, d)  # each task's own (any tokenizer)
    return batch.tokens, position, batch, labels


@torch.no_grad()
def _states_at(model: nn.Module, tokens: torch.Tensor, position: int, layer: int) -> np.ndarray:
    """The flat SSM state of ``layer`` after ``tokens[:, :position]`` -> ``[B, H·P·N]`` float64."""
    dev = next(model.parameters()).device
    _, states = model(tokens[:, :position].to(dev), None)
    s = states[layer]
    return s.reshape(s.shape[0], -1).double().cpu().numpy()


def model_task_geometry(model: nn.Module, kind: str, task: Any, seed: int, *, n: int = 256,
                        distances: Sequence[int] | None = None, layer: int = -1, tau: float = 1.0,
                        probe: bool = True) -> tuple[xr.Dataset, dict[int, tuple[torch.Tensor, np.ndarray]]]:
    """:func:`distance_geometry` of one model on fresh probe samples (seed ``seed + PROBE_SEED_OFFSET``).

    Returns the dataset and, per distance, the probe prefixes (the tokens up to the state
    read) with their labels, for the Jacobians and fixed points."""
    from dynlab.lm.run.task import score_batch

    dist = tuple(DISTANCES[kind] if distances is None else distances)
    generator = torch.Generator().manual_seed(seed + PROBE_SEED_OFFSET)
    model.eval()
    hs, ys, acc, tokens_at = [], [], [], {}
    for d in dist:
        tokens, position, batch, labels = task_probes(kind, task, generator, n, d)
        hs.append(_states_at(model, tokens, position, layer))
        ys.append(labels)
        tokens_at[d] = (tokens[:, :position], labels)
        hits, mask = score_batch(model, batch)
        acc.append(float(hits[mask].mean()) if kind == "copying" else
                   float(np.mean([hits[b][mask[b]].all() for b in range(len(hits))])))
    ds = distance_geometry(np.stack(hs, 1), np.stack(ys, 1), acc, dist, N_CLASSES[kind], tau=tau, probe=probe)
    return ds, tokens_at


def geometry_row(model: nn.Module, kind: str, task: Any, seed: int, *, n: int | None = None,
                 distances: Sequence[int] | None = None, n_jac: int = 4) -> xr.Dataset:
    """Everything :mod:`dynlab.lm.analysis.state_geometry` measures on one tested model, under the
    dataset names ``geo_*`` on dim ``distance`` (scalars for T_cross, the horizon, the
    Jacobian spectra at the largest distance and the filler fixed points; passkey and
    babi only: copying has no filler)."""
    ds, tokens_at = model_task_geometry(model, kind, task, seed, n=PROBE_SAMPLES if n is None else n,
                                        distances=distances)
    prefix, labels = tokens_at[int(ds.distance.values[-1])]
    spectra = recurrence_spectra(model, prefix, labels, N_CLASSES[kind], n_jac=n_jac)
    fp = {"fp_count": float("nan"), "fp_residual": float("nan"), "fp_rho_par": float("nan"),
          "fp_rho_perp": float("nan")}
    if kind in ("passkey", "babi") and LMRecurrence(model).state_size <= FP_MAX_STATE:
        space = task.text(" ")  # the filler token: a space in the task's tokens
        fp = filler_fixed_points(model, prefix, labels, N_CLASSES[kind], filler=space[-1] if space else ord(" "))
    for k, v in {**spectra, **fp}.items():
        ds[k] = ((), v)
    out = ds.rename({k: f"geo_{k}" for k in ds.data_vars})
    out.attrs = {"geo_tau": ds.attrs["tau"], "geo_accuracy_level": 0.5}
    return annotate(out)


def _log2_pairs(ds: xr.Dataset) -> dict[str, np.ndarray]:
    """log2 T_cross (NaN when censored), log2 horizon, its censoring and log2 of the largest distance, ok rows."""
    ok = ds["status"].values.astype(str) == "ok" if "status" in ds else np.ones(ds.sizes["run"], bool)
    ok &= np.isfinite(ds["geo_T_cross"].values.astype(float))
    sel = ds.isel(run=np.flatnonzero(ok))
    t = np.log2(sel["geo_T_cross"].values.astype(float))
    return {"t": np.where(sel["geo_crossed"].values.astype(bool), t, np.nan),
            "h": np.log2(sel["geo_horizon"].values.astype(float)),
            "h_cens": ~sel["geo_horizon_reached"].values.astype(bool),
            "far": np.full(t.size, np.log2(float(sel["distance"].values[-1]))),
            "iv": sel["intervention"].values.astype(str), "phase": sel["phase"].values.astype(str)}


def preregistered_test(datasets: dict[str, xr.Dataset], *, n_boot: int = 2000) -> dict[str, Any]:
    """The statistic of ``docs/preregistration-task-geometry.md`` on analysed task datasets
    (name -> dataset): per task and pooled, Pearson r (95 % bootstrap CI, seed 0) and
    Spearman ρ of log2 T_cross vs log2 horizon, censored values at their bound
    (:func:`dynlab.analysis.correlation.tcross_mp_correlation`, ``censoring="replace"``);
    per task and arm the mean log2 T_cross and horizon."""
    from dynlab.analysis.correlation import tcross_mp_correlation

    pairs = {k: _log2_pairs(ds) for k, ds in datasets.items()}
    pairs["pooled"] = {f: np.concatenate([p[f] for p in pairs.values()]) for f in next(iter(pairs.values()))}
    out: dict[str, Any] = {}
    for name, p in pairs.items():
        c = tcross_mp_correlation(p["t"], p["h"], horizon=p["far"], mp_censored=p["h_cens"], censoring="replace",
                                  n_boot=n_boot, rng=np.random.default_rng(0))
        arms = {iv: {"log2_T_cross": float(np.nanmean(np.where(np.isnan(p["t"]), p["far"], p["t"])[m])),
                     "log2_horizon": float(p["h"][m].mean()), "n": int(m.sum())}
                for iv in dict.fromkeys(p["iv"]) for m in [(p["iv"] == iv) & (p["phase"] == "post")] if m.any()}
        out[name] = {"pearson_r": c.pearson_r, "pearson_ci": c.pearson_ci, "spearman_rho": c.spearman_rho,
                     "n": c.n_used, "n_tcross_censored": c.n_tcross_censored, "n_horizon_censored": c.n_mp_censored,
                     "arms": arms}
    return out
