"""The error-control analysis of one trained tracker (SPEC A4), as one xarray Dataset.

:func:`analyze_tracker` runs, on fresh sequences of the tracker's word problem:

1. **geometry** over time of the tracked layer's states (streamed in chunks, memory flat
   in length): ``q, R, M, R_par, R_perp (t)``, ``T_cross``, ``failure_mode`` and the
   Corollary-1 fit (:func:`dynlab.analysis.geometry.geometry_over_time`).  Also
   ``q_par = R_par / M``, its crossing ``T_cross_par`` and ``failure_mode_par`` (same
   rules as ``failure_mode``): a nearest-centroid decision
   depends only on the component of h in U, so scatter in U⊥ (where state-dependent
   trackers park their error) cannot cause a misread; q_par is the decoder-relevant
   ratio, q = R/M the paper's;
2. **return map on U** (Theorem 1): Jacobians of state-preserving words at the class
   centroids of step ``t_ref`` (default: the training length), restricted to U(t_ref);
   every eigenvalue is kept (dim ``k``) plus the summary ``return_map_eig_max``, the
   median over words and centroids of the largest |eigenvalue|
   (:func:`dynlab.analysis.jacobian.return_map_on_U`);
3. **perturbation recovery** along U and U⊥ injected at ``t_ref``
   (:func:`dynlab.analysis.perturbation.perturbation_response`);
4. **finite-time Lyapunov exponents** along trajectories (QR method);
5. for two-class groups (C2), the **signed error along U** that shows neutral
   oscillation (:func:`dynlab.analysis.margin.binary_signed_error`).

Where the logits are a linear map of the tracked state (dense RNN cells), the trained
readout's own threshold ``tau_readout(t)`` = (smallest centroid-to-boundary distance)/M
and the crossing of q over it, ``T_cross_readout``, are reported too.

A tracker whose states overflow (an unstable affine map run to length 1000) has failed:
from the first non-finite step on, q is +inf (``blowup_t`` records that step).

All of it is float64.  The variables are per run; the study stacks runs along ``run``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import xarray as xr
from pydantic import Field

from dynlab.analysis.geometry import class_centroids, crossing_time, failure_mode, geometry_over_time, symbolic_basis
from dynlab.analysis.jacobian import analysis_copy, lyapunov_exponents, return_map_on_U
from dynlab.analysis.margin import binary_signed_error
from dynlab.analysis.perturbation import perturbation_response
from dynlab.config import Spec
from dynlab.tasks import WordProblem

__all__ = ["AnalysisSpec", "analyze_tracker", "stream_states"]


class AnalysisSpec(Spec):
    """Settings of :func:`analyze_tracker` (not part of the run id: analyses can be redone).

    ``horizon`` None means the longest evaluated length; ``t_ref`` None means the
    training length (the curriculum's ``max_length``).
    """

    n_samples: int = Field(512, ge=8)
    horizon: int | None = Field(None, ge=2)
    chunk: int = Field(200, ge=1)
    tau: float = Field(0.5, gt=0)
    persist: int = Field(3, ge=1)
    rank_tol: float = Field(1e-6, gt=0)
    t_ref: int | None = Field(None, ge=1)
    n_words: int = Field(4, ge=1)
    word_length: int = Field(6, ge=1)
    perturb_eps: float = Field(0.25, gt=0)
    perturb_steps: int = Field(100, ge=2)
    perturb_samples: int = Field(256, ge=8)
    lyap_k: int = Field(4, ge=1)
    lyap_steps: int = Field(100, ge=1)
    lyap_samples: int = Field(16, ge=1)
    seed: int = 20_000


def stream_states(
    model: torch.nn.Module,
    task: WordProblem,
    n_samples: int,
    horizon: int,
    chunk: int,
    generator: torch.Generator,
    layer: int = -1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(states [N, Tc, S_layer], labels [N, Tc])`` chunks of fresh sequences.

    The recurrent state is carried between chunks, so only one chunk is in memory.
    """
    sl = model.layer_slice(layer)
    device = next(model.parameters()).device
    state = model.init_state(n_samples)
    label = torch.zeros(n_samples, dtype=torch.long)
    t0 = 0
    with torch.no_grad():
        while t0 < horizon:
            tc = min(chunk, horizon - t0)
            tokens, labels = task.sample(generator, n_samples, tc, start=label)
            label = labels[:, -1]
            out = model(tokens.to(device), state, return_states=True)
            state = out.final_state
            yield out.states[..., sl].double().cpu().numpy(), labels.numpy()
            t0 += tc


def _centroids_at(model, task: WordProblem, n: int, t_ref: int, gen: torch.Generator, layer: int):
    """Full-state centroids ``[G, S]`` and tracked-layer centroids ``[G, S_l]`` at step t_ref."""
    tokens, labels = task.sample(gen, n, t_ref)
    with torch.no_grad():
        out = model(tokens, return_states=False)
    h = out.final_state.double().cpu().numpy()  # [N, S]
    y = labels[:, -1].numpy()
    full, counts = class_centroids(h, y, task.n_classes)
    present = counts > 0
    layer_c = full[:, model.layer_slice(layer)]
    return full[present], layer_c[present], np.flatnonzero(present)


def _linear_readout_of_state(model: torch.nn.Module, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(W [C, S], b [C])`` when the logits are a linear map of the tracked layer's state.

    True for a :class:`~dynlab.models.Tracker` whose linear readout reads the last cell
    and whose last cell outputs its state (the dense RNN cells); None otherwise (Mamba-style
    cells read out C_t·h_t, an input-dependent map, so no fixed margin exists).
    """
    from dynlab.models.cells import Cell

    cells = getattr(model, "cells", None)
    head = getattr(model, "readout", None)
    if not cells or not isinstance(head, torch.nn.Linear):
        return None
    last = cells[-1]
    if layer not in (-1, len(cells) - 1) or type(last).readout is not Cell.readout:
        return None
    return head.weight.detach().double().cpu().numpy(), head.bias.detach().double().cpu().numpy()


def _blowup_step(geo: xr.Dataset) -> float:
    """First step whose states overflowed (R = +inf, see geometry), NaN when none."""
    blown = np.isinf(geo["R"].values)
    return float(geo["t"].values[blown][0]) if blown.any() else float("nan")


def analyze_tracker(
    model: torch.nn.Module,
    task: WordProblem,
    spec: AnalysisSpec,
    horizon: int,
    t_ref: int,
    layer: int = -1,
) -> xr.Dataset:
    """Run every analysis of the module docstring on ``model`` (a tracker, any device).

    Args:
        model: a tracker (:class:`dynlab.models.Tracker` or the same protocol).
        task: its word problem.
        spec: analysis settings.
        horizon: number of steps followed for q(t) (e.g. the longest evaluated length).
        t_ref: reference step for U, the return map and the perturbation (e.g. training length).
        layer: tracked layer.
    """
    m = analysis_copy(model, torch.float64).cpu()
    gen = torch.Generator().manual_seed(spec.seed)
    readout = _linear_readout_of_state(m, layer)
    with np.errstate(over="ignore", invalid="ignore"):  # exploding trackers get q = inf in geometry
        geo = geometry_over_time(
            stream_states(m, task, spec.n_samples, horizon, spec.chunk, gen, layer),
            n_classes=task.n_classes,
            tau=spec.tau,
            persist=spec.persist,
            rank_tol=spec.rank_tol,
            readout_weight=None if readout is None else readout[0],
            readout_bias=None if readout is None else readout[1],
        )
    out = geo.copy()
    out["blowup_t"] = ((), _blowup_step(geo))
    if "tau_readout" in out:
        t_read, _ = crossing_time(out["q"].values, out["tau_readout"].values, out["t"].values, spec.persist)
        out["T_cross_readout"] = ((), t_read)
    # Decoder-relevant readability: a nearest-centroid decision depends only on the
    # component of h in U, so q_par = R_par / M is the tighter sufficient ratio.
    with np.errstate(invalid="ignore"):
        q_par = geo["R_par"].values / geo["M"].values
    q_par[np.isinf(geo["R"].values)] = np.inf  # overflowed states count as crossed
    out["q_par"] = ("t", q_par)
    t_par, crossed_par = crossing_time(out["q_par"].values, spec.tau, geo["t"].values, spec.persist)
    out["T_cross_par"] = ((), t_par)
    out["crossed_par"] = ((), crossed_par)
    saturation_t = int(geo.attrs.get("saturation_t", 3))
    out["failure_mode_par"] = ((), failure_mode(t_par, crossed_par, saturation_t))

    # Theorem 1: return maps of state-preserving words at the centroids of step t_ref.
    points, layer_c, point_labels = _centroids_at(m, task, spec.n_samples, t_ref, gen, layer)
    basis = symbolic_basis(layer_c, spec.rank_tol)
    words = task.sample_identity_words(gen, spec.n_words, spec.word_length)
    if basis.shape[1] > 0:
        rm = return_map_on_U(m, list(words), points, basis, layer=layer, point_labels=list(point_labels))
        re = rm["return_map_eig_real"].values.reshape(-1)
        im = rm["return_map_eig_imag"].values.reshape(-1)
        eig_max = float(np.median(rm["return_map_eig"].values[..., 0]))
    else:
        re = im = np.full(1, np.nan)
        eig_max = float("nan")
    out["return_map_eig_real"] = ("k", re)
    out["return_map_eig_imag"] = ("k", im)
    out["return_map_eig_max"] = ((), eig_max)
    out["k_U_ref"] = ((), basis.shape[1])

    # Perturbation injected at t_ref, followed for perturb_steps.
    tokens, labels = task.sample(gen, spec.perturb_samples, t_ref + spec.perturb_steps)
    pr = perturbation_response(
        m, tokens, labels, t0=t_ref, eps=spec.perturb_eps, layer=layer, rank_tol=spec.rank_tol,
        rng=np.random.default_rng(spec.seed),
    )
    pr = pr.rename({"t": "t_pert"})
    for name in ("delta_norm", "dist_excess", "q_pert"):
        out[f"perturb_{name}"] = pr[name]
    out["recovery_rate"] = pr["recovery_rate"]

    # Finite-time Lyapunov exponents along fresh trajectories.
    lt, _ = task.sample(gen, spec.lyap_samples, spec.lyap_steps)
    k = min(spec.lyap_k, m.state_size)
    ly = lyapunov_exponents(m, lt, k=k, generator=torch.Generator().manual_seed(spec.seed))
    out["lyapunov"] = ly["lyap_mean"].rename({"k": "k_lyap"})

    # C2: signed error along U (neutral oscillation).
    if task.n_classes == 2:
        with np.errstate(over="ignore", invalid="ignore"):
            be = binary_signed_error(stream_states(m, task, spec.n_samples, horizon, spec.chunk, gen, layer))
        out["sign_flip_frac"] = be["sign_flip_frac"]
        out["e_U_absmax_rel"] = be["e_U_absmax_rel"]
    out.attrs.update(
        analysis_spec=spec.canonical_json(), horizon=horizon, t_ref=t_ref, layer=layer, tau=spec.tau
    )
    return out
