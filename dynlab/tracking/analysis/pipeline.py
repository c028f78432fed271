"""The error-control analysis of one trained tracker, step by step: :func:`analyze_tracker`
and its steps, in the order they draw from the analysis's one generator (what each computes:
:mod:`dynlab.tracking.analysis.spec`, whose :class:`~dynlab.tracking.analysis.spec.AnalysisSpec` sets it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from dynlab.analysis.fixed_points.finder import word_map
from dynlab.tracking.analysis.fixed_points.per_state import generator_power_words, tracker_fixed_points
from dynlab.tracking.analysis.fixed_points.drift import corollary1_crossing, mean_drift
from dynlab.analysis.centroids import class_centroids, class_stats, pair_distances
from dynlab.analysis.fit import line_fit
from dynlab.analysis.geometry import crossing_time, failure_mode, geometry_over_time, symbolic_basis
from dynlab.tracking.analysis.horizon import horizon_forecast, margin_statistics
from dynlab.analysis.jacobian import analysis_copy, lyapunov_exponents, return_map_on_U
from dynlab.analysis.margin import binary_signed_error
from dynlab.analysis.perturbation import perturbation_response
from dynlab.analysis.readability import (
    decoder_ratio,
    fit_probe,
    pairwise_ratio,
    probe_accuracy,
    readout_margins,
)
from dynlab.tracking.analysis.spec import AnalysisSpec, stream_representations, stream_states
from dynlab.tracking.models.streams import tracker_features, tracker_stream
from dynlab.tracking.selection import MAX_ANALYSIS_ORDER
from dynlab.errors import DynlabInputError
from dynlab.results.vocabulary import annotate
from dynlab.tracking.task import WordProblem

__all__ = ["analyze_tracker"]


@dataclass
class _Reference:
    """What the analysis measures once at step t_ref on its own fresh sequences."""

    points: np.ndarray  # [P, S] full-state centroids of the present classes
    layer_centroids: np.ndarray  # [P, S_layer]
    point_labels: np.ndarray  # [P]
    pair_dist: np.ndarray  # [G, G] state centroid distances (NaN where a class is absent)
    dec_margin: np.ndarray  # [G, G] centroid-to-boundary distances m_ag of the readout features
    probe: object  # fitted probe on the layer's states, or None


def _reference(model, task: WordProblem, n: int, t_ref: int, gen: torch.Generator, layer: int, seed: int) -> _Reference:
    """Centroids, separations, readout margins and the probe at step ``t_ref``."""
    tokens, labels = task.sample(gen, n, t_ref)
    features, final = tracker_features(model, tokens)
    h = final.double().cpu().numpy()  # [N, S]
    feats = features[:, -1].double().cpu().numpy()  # [N, F]
    y = labels[:, -1].numpy()  # [N]
    full, counts = class_centroids(h, y, task.n_classes)
    present = counts > 0
    sl = model.layer_slice(layer)
    layer_c = full[:, sl]  # [G, S_layer], NaN rows when absent
    dist = pair_distances(layer_c, present)  # NaN for a pair with an absent class
    w, b = _decoder(model, task.n_classes)
    mu = readout_margins(feats[:, None], y[:, None], w, b)  # [N, 1, G]
    margin = class_stats(mu, y[:, None], task.n_classes)[1][0]  # [G, G] class mean of μ
    margin[~present] = np.nan
    probe = fit_probe(h[:, sl], y, seed=seed)
    return _Reference(full[present], layer_c[present], np.flatnonzero(present), dist, margin, probe)


def _forecast(ratio: np.ndarray, t: np.ndarray, tau: float, t_ref: int, t_cross: float, crossed: bool) -> float:
    """Corollary-1 forecast of the crossing from the steps in [ceil(t_ref/2), t_ref]
    (:mod:`dynlab.tracking.analysis.spec`)."""
    if crossed and t_cross <= t_ref:
        return float(t_cross)
    lo = int(np.ceil(t_ref / 2))
    win = (t >= lo) & (t <= t_ref) & np.isfinite(ratio)
    if win.sum() < 2:
        return float("nan")
    icpt, slope = line_fit(t[win], ratio[win])
    if not slope > 0:
        return float("nan")
    pred = max(float((tau - icpt) / slope), float(t_ref))
    return pred if pred <= float(t[-1]) else float("nan")


def _decoder(model: torch.nn.Module, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The trained decoder's ``(weight [G, F], bias [G])`` in float64 (the class rows of
    ``final_linear``; a zero bias when it has none)."""
    lin = model.final_linear()
    w = lin.weight.detach().double().cpu().numpy()[:n_classes]
    b = lin.bias.detach().double().cpu().numpy()[:n_classes] if lin.bias is not None else np.zeros(w.shape[0])
    return w, b


def _linear_readout_of_state(model: torch.nn.Module, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(W [C, S], b [C])`` when the logits are a linear map of the tracked layer's state.

    True for a :class:`~dynlab.tracking.models.Tracker` whose linear readout reads the last cell
    and whose last cell outputs its state (the dense RNN cells); None otherwise (Mamba-style
    cells read out C_t·h_t, an input-dependent map, so no fixed margin exists).
    """
    from dynlab.tracking.models.cell_base import Cell

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


def _ratio_crossing(out: xr.Dataset, name: str, ratio: np.ndarray, tau: float, persist: int, saturation_t: int) -> None:
    """Store ``ratio`` as ``name(t)`` with ``T_cross_<suffix>``, ``crossed_<suffix>`` and
    ``failure_mode_<suffix>`` (suffix = name without its leading ``q_``)."""
    suffix = name[2:]
    t = out["t"].values
    out[name] = ("t", ratio)
    t_c, crossed = crossing_time(ratio, tau, t, persist)
    out[f"T_cross_{suffix}"] = ((), t_c)
    out[f"crossed_{suffix}"] = ((), crossed)
    out[f"failure_mode_{suffix}"] = ((), failure_mode(t_c, crossed, saturation_t))


def _check_state_preserving(task: WordProblem, words: torch.Tensor) -> None:
    """Theorem 1 needs words that multiply to the identity; refuse any other."""
    prods = task.labels(words)[:, -1]
    if (prods != task.group.identity).any():
        raise ValueError("return-map words must multiply to the identity; got a word that does not")


def _stream_geometry(m, task: WordProblem, spec: AnalysisSpec, n: int, horizon: int, gen: torch.Generator, layer: int,
                     ref: _Reference) -> tuple[xr.Dataset, dict[str, np.ndarray]]:
    """One pass over fresh sequences to ``horizon``: the geometry of the state
    (:func:`~dynlab.analysis.geometry.geometry_over_time`) and every per-step readability
    ratio (name -> ``[T]``), fed from the same chunks."""
    g = task.n_classes
    readout = _linear_readout_of_state(m, layer)
    w_dec, b_dec = _decoder(m, g)
    extra: dict[str, list[np.ndarray]] = {}
    features_are_state = readout is not None  # dense cells: the readout reads the state itself

    def tee() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for h, f, y in stream_representations(m, task, n, horizon, spec.chunk, gen, layer):
            pair = pairwise_ratio(h, y, g, ref_dist=ref.pair_dist)
            parts = {
                **pair,
                "q_pair_out": pair["q_pair"] if features_are_state else pairwise_ratio(f, y, g)["q_pair"],
                **decoder_ratio(f, y, w_dec, b_dec, ref_margin=ref.dec_margin),
                "probe_accuracy": probe_accuracy(ref.probe, h, y),
            }
            for k, v in parts.items():
                extra.setdefault(k, []).append(v)
            yield h, y

    with np.errstate(over="ignore", invalid="ignore"):  # exploding trackers get q = inf in geometry
        geo = geometry_over_time(
            tee(), n_classes=g, tau=spec.tau, persist=spec.persist, rank_tol=spec.rank_tol,
            readout_weight=None if readout is None else readout[0],
            readout_bias=None if readout is None else readout[1],
        )
    return geo, {k: np.concatenate(v) for k, v in extra.items()}


def _add_crossings(out: xr.Dataset, geo: xr.Dataset, cols: dict[str, np.ndarray], spec: AnalysisSpec, t_ref: int) -> None:
    """Into ``out``: blow-up step, readout crossing, q_par and every readability ratio with
    its crossing, the Corollary-1 forecasts, the probe and the class counts
    (:mod:`dynlab.tracking.analysis.spec`)."""
    blown = np.isinf(geo["R"].values)
    out["blowup_t"] = ((), _blowup_step(geo))
    if "tau_readout" in out:
        t_read, _ = crossing_time(out["q"].values, out["tau_readout"].values, out["t"].values, spec.persist)
        out["T_cross_readout"] = ((), t_read)
    saturation_t = int(geo.attrs.get("saturation_t", 3))
    # q_par = R_par / M: a nearest-centroid decision depends only on the component in U.
    with np.errstate(invalid="ignore", divide="ignore"):
        q_par = geo["R_par"].values / geo["M"].values
    q_par[blown | ((geo["M"].values == 0) & (geo["n_present"].values >= 2))] = np.inf
    _ratio_crossing(out, "q_par", q_par, spec.tau, spec.persist, saturation_t)
    steps = out["t"].values
    for name in ("q_pair", "q_pair_out", "q_dec", "q_pair_ref", "q_dec_ref"):
        ratio = cols[name].copy()
        ratio[blown] = np.inf  # overflowed states count as crossed
        _ratio_crossing(out, name, ratio, spec.tau, spec.persist, saturation_t)
    for name in ("q_pair", "q_pair_out", "q_dec"):
        suffix = name[2:]
        out[f"T_forecast_{suffix}"] = (
            (),
            _forecast(out[name].values, steps, spec.tau, t_ref, float(out[f"T_cross_{suffix}"]), bool(out[f"crossed_{suffix}"])),
        )
    acc = cols["probe_accuracy"]
    acc[blown] = 0.0
    out["probe_accuracy"] = ("t", acc)
    after = steps >= t_ref  # the probe is fitted at t_ref: its crossing is searched from there on
    t_probe, _ = crossing_time(1.0 - acc[after], 1.0 - spec.probe_threshold + 1e-12, steps[after], spec.persist)
    out["T_probe"] = ((), t_probe)
    out["min_class_count"] = ("t", cols["min_count"])
    out["dec_margin"] = ("t", cols["dec_margin"])
    out["thin_classes"] = ((), int((cols["min_count"] < 4).sum()))
    for name in ("q", "q_par", "q_pair", "q_pair_ref", "probe_accuracy"):
        out[name].attrs["representation"] = "state"
    for name in ("q_pair_out", "q_dec", "q_dec_ref", "dec_margin"):
        out[name].attrs["representation"] = "readout features"


def _add_return_map(out: xr.Dataset, m, task: WordProblem, spec: AnalysisSpec, gen: torch.Generator, layer: int,
                    ref: _Reference) -> np.ndarray:
    """Into ``out``: Theorem 1's return maps of state-preserving words at the class centroids
    of t_ref, restricted to U(t_ref) (NaN when U is empty).  Returns the basis of U(t_ref)."""
    basis = symbolic_basis(ref.layer_centroids, spec.rank_tol)
    words = task.sample_identity_words(gen, spec.n_words, spec.word_length)
    _check_state_preserving(task, words)
    if basis.shape[1] > 0:
        rm = return_map_on_U(m, list(words), ref.points, basis, layer=layer, point_labels=list(ref.point_labels))
        re = rm["return_map_eig_real"].values.reshape(-1)
        im = rm["return_map_eig_imag"].values.reshape(-1)
        eig_max = float(np.median(rm["return_map_eig"].values[..., 0]))
        df_u = rm["DF_U"].values  # [W, P, k, k]
        dist_id = float(np.median(np.linalg.norm(df_u - np.eye(df_u.shape[-1]), ord=2, axis=(-2, -1))))
    else:
        re = im = np.full(1, np.nan)
        eig_max = dist_id = float("nan")
    out["return_map_eig_real"] = ("k", re)
    out["return_map_eig_imag"] = ("k", im)
    out["return_map_eig_max"] = ((), eig_max)
    out["return_map_dist_identity"] = ((), dist_id)
    out["k_U_ref"] = ((), basis.shape[1])
    return basis


def _add_perturbation(out: xr.Dataset, m, task: WordProblem, spec: AnalysisSpec, gen: torch.Generator, layer: int,
                      t_ref: int, k_u: int) -> None:
    """Into ``out``: the perturbation injected at t_ref and followed for ``perturb_steps``
    (undefined when U is empty there, ``k_u`` = 0: all classes merged, a collapsed tracker; then NaN)."""
    tokens, labels = task.sample(gen, spec.perturb_samples, t_ref + spec.perturb_steps)
    if k_u > 0:
        pr = perturbation_response(
            m, tokens, labels, t0=t_ref, eps=spec.perturb_eps, layer=layer, rank_tol=spec.rank_tol,
            rng=np.random.default_rng(spec.seed),
        )
        pr = pr.rename({"t": "t_pert"})
        for name in ("delta_norm", "dist_excess", "q_pert"):
            out[f"perturb_{name}"] = pr[name]
        out["recovery_rate"] = pr["recovery_rate"]
        return
    steps_pert = np.arange(t_ref, t_ref + spec.perturb_steps + 1)
    nan2 = np.full((2, steps_pert.size), np.nan)
    coords = {"direction": ["U", "U_perp"], "t_pert": steps_pert}
    for name in ("delta_norm", "dist_excess", "q_pert"):
        out[f"perturb_{name}"] = xr.DataArray(nan2, dims=("direction", "t_pert"), coords=coords)
    out["recovery_rate"] = xr.DataArray(np.full(2, np.nan), dims="direction", coords={"direction": ["U", "U_perp"]})


def _add_lyapunov_and_sign(out: xr.Dataset, m, task: WordProblem, spec: AnalysisSpec, gen: torch.Generator,
                           horizon: int, layer: int) -> None:
    """Into ``out``: finite-time Lyapunov exponents along fresh trajectories and, for
    two-class groups (C2), the signed error along U (neutral oscillation)."""
    lt, _ = task.sample(gen, spec.lyap_samples, spec.lyap_steps)
    k = min(spec.lyap_k, m.state_size)
    ly = lyapunov_exponents(m, lt, k=k, generator=torch.Generator().manual_seed(spec.seed))
    out["lyapunov"] = ly["lyap_mean"]
    if task.n_classes == 2:
        with np.errstate(over="ignore", invalid="ignore"):
            be = binary_signed_error(stream_states(m, task, spec.n_samples, horizon, spec.chunk, gen, layer))
        out["sign_flip_frac"] = be["sign_flip_frac"]
        out["e_U_absmax_rel"] = be["e_U_absmax_rel"]


def _add_horizon(out: xr.Dataset, m, task: WordProblem, spec: AnalysisSpec, t_ref: int, horizon: int) -> None:
    """Into ``out``: ``T_horizon`` (:func:`dynlab.tracking.analysis.horizon.horizon_forecast`) from
    ``horizon_samples`` fresh sequences of length t_ref, drawn from their own generator
    (seed ``spec.seed + 1``) so that every other analysis reads the sequences it read before."""
    g = task.n_classes
    tokens, labels = task.sample(torch.Generator().manual_seed(spec.seed + 1), spec.horizon_samples, t_ref)
    with np.errstate(over="ignore", invalid="ignore"):
        feats = tracker_features(m, tokens)[0].double().numpy()  # [N, t_ref, F]
    w, b = _decoder(m, g)
    stats = margin_statistics(feats, labels.numpy(), w, b)
    out["T_horizon"] = ((), horizon_forecast(stats, t_ref, max(horizon, t_ref), threshold=spec.horizon_threshold,
                                             persist=spec.persist))


def _fp_inputs(m, task: WordProblem, spec: AnalysisSpec, t_ref: int) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """The starts of the fixed-point analysis: the states ``[N, S]`` after t_ref tokens of
    ``samples_for(G)`` fresh sequences drawn from their own generator (seed ``spec.seed + 2``,
    so every other analysis reads the sequences it read before), their classes ``[N]``
    (overflowed states left out), and the state-preserving words (each generator's power,
    then ``fp_random_words`` random ones from the same generator), checked."""
    gen = torch.Generator().manual_seed(spec.seed + 2)
    tokens, labels = task.sample(gen, spec.samples_for(task.n_classes), t_ref)
    h = tracker_stream(m, tokens)[1].double().cpu().numpy()  # [N, S]
    y = labels[:, -1].numpy()
    words = generator_power_words(task.group)
    if spec.fp_random_words:
        words += [list(map(int, w)) for w in task.sample_identity_words(gen, spec.fp_random_words, spec.word_length)]
    for w in words:
        _check_state_preserving(task, torch.tensor([w]))
    finite = np.isfinite(h).all(axis=1)  # an overflowed state is no start
    return h[finite], y[finite], words


def _add_fp_drift(out: xr.Dataset, m, spec: AnalysisSpec, t_ref: int, layer: int, basis: np.ndarray, ref: _Reference,
                  horizon: int, words: list[list[int]]) -> None:
    """Into ``out``: Corollary 1 from the return maps of ``words``
    (:mod:`dynlab.tracking.analysis.fixed_points.drift`): ``fp_drift`` η̄, the mean over the class centroids of
    t_ref and the words of the per-token drift along U(t_ref), and ``T_cross_fp``, the
    crossing of q∥ it predicts from R∥ and M at t_ref (both NaN when U is empty)."""
    eta = t_fp = float("nan")
    if basis.shape[1] > 0:
        b_full = np.zeros((int(m.state_size), basis.shape[1]))
        b_full[m.layer_slice(layer)] = basis
        eta = mean_drift([word_map(m, w) for w in words], [len(w) for w in words], ref.points, b_full)
        t_fp = corollary1_crossing(float(out["R_par"].sel(t=t_ref)), eta, spec.tau * float(out["M"].sel(t=t_ref)),
                                   t_ref, horizon)
    out["fp_drift"] = ((), eta)
    out["T_cross_fp"] = ((), t_fp)


def _add_fixed_points(out: xr.Dataset, m, task: WordProblem, spec: AnalysisSpec, t_ref: int, layer: int,
                      basis: np.ndarray, ref: _Reference, horizon: int) -> None:
    """Into ``out``: the ``fp_*`` variables of
    :func:`~dynlab.tracking.analysis.fixed_points.per_state.tracker_fixed_points`
    (:mod:`dynlab.tracking.analysis.spec`, item 6) from the starts and words of :func:`_fp_inputs`; ρ∥ and ρ⊥ are NaN when U(t_ref) is empty.
    Then ``fp_drift`` and ``T_cross_fp`` from the same words (:func:`_add_fp_drift`)."""
    h, y, words = _fp_inputs(m, task, spec, t_ref)
    fp = tracker_fixed_points(m, words, h, y, n_classes=task.n_classes,
                              basis=basis if basis.shape[1] > 0 else None, layer=layer, starts=spec.fp_starts,
                              tol=spec.fp_tol, max_states=spec.fp_max_states)
    for name in fp.data_vars:
        out[name] = fp[name]
    out["fp_residual"].attrs["fp_words"] = fp.attrs["fp_words"]
    _add_fp_drift(out, m, spec, t_ref, layer, basis, ref, horizon, words)


def analyze_tracker(
    model: torch.nn.Module,
    task: WordProblem,
    spec: AnalysisSpec,
    horizon: int,
    t_ref: int,
    layer: int = -1,
) -> xr.Dataset:
    """Run every analysis of :mod:`dynlab.tracking.analysis.spec`'s docstring on ``model`` (a tracker, any device).

    Args:
        model: a tracker (:class:`dynlab.tracking.models.Tracker` or the same protocol, with
            ``final_linear`` and ``return_features``).
        task: its word problem.
        spec: analysis settings.
        horizon: number of steps followed for q(t) (e.g. the longest evaluated length).
        t_ref: reference step for U, the separations held fixed, the probe, the return map
            and the perturbation (e.g. the training length).
        layer: tracked layer.

    A group of order above :data:`~dynlab.tracking.selection.MAX_ANALYSIS_ORDER` is refused at once
    (one-line :class:`~dynlab.errors.DynlabInputError`): the work per step grows as
    samples × order² and the chunks as samples × steps × order.
    """
    if task.n_classes > MAX_ANALYSIS_ORDER:
        raise DynlabInputError(
            f"group {task.group.name} (order {task.n_classes}) is too large for the error-control analysis; "
            f"allowed: order at most {MAX_ANALYSIS_ORDER} (dynlab.tracking.selection.MAX_ANALYSIS_ORDER)"
        )
    m = analysis_copy(model, torch.float64).cpu()
    gen = torch.Generator().manual_seed(spec.seed)  # one generator, drawn from in this order
    n = spec.samples_for(task.n_classes)
    ref = _reference(m, task, n, t_ref, gen, layer, spec.seed)
    geo, cols = _stream_geometry(m, task, spec, n, horizon, gen, layer, ref)
    out = geo.copy()
    _add_crossings(out, geo, cols, spec, t_ref)
    basis = _add_return_map(out, m, task, spec, gen, layer, ref)
    _add_perturbation(out, m, task, spec, gen, layer, t_ref, basis.shape[1])
    _add_lyapunov_and_sign(out, m, task, spec, gen, horizon, layer)
    _add_horizon(out, m, task, spec, t_ref, horizon)
    _add_fixed_points(out, m, task, spec, t_ref, layer, basis, ref, horizon)
    out.attrs.update(
        analysis_spec=spec.canonical_json(), horizon=horizon, t_ref=t_ref, layer=layer, tau=spec.tau, n_samples=n
    )
    return annotate(out)
