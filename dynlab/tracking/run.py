"""One tracker run on a group word problem: train, evaluate, analyse, reload.

The work of a run of the word-problem studies (``group-tracking``, ``nonlinearity``):
:func:`run_one` trains a tracker (:func:`dynlab.tracking.train.train_tracker`) and evaluates it,
:func:`run_many` does the same for an ensemble (:func:`ensemble_group_key` says which
specs share one), the stored result is a :class:`TrackerResult` whose status follows
:func:`run_status`, and :func:`analyze_run` is the error-control analysis of a finished
run with the horizon rule :func:`not_learned_horizon`.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Any

import torch
import xarray as xr

from dynlab.tracking.analysis.spec import AnalysisSpec
from dynlab.tracking.analysis.pipeline import analyze_tracker
from dynlab.tracking.spec import RunSpec
from dynlab.tracking.evaluate import evaluate_lengths, max_pass_length, max_pass_length_dense
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import measure_family
from dynlab.tracking.models.tracker import Tracker, declared_fused_kind
from dynlab.results.store import RunStore
from dynlab.runtime import NullProgress, train_threads
from dynlab.runner.protocol import RunOutcome, RunResult, read_result
from dynlab.tracking.task import WordProblem
from dynlab.tracking.train import TrainResult, build_tracker, train_tracker
from dynlab.tracking.train.ensemble import ensemble_key, train_ensemble

__all__ = [
    "TrackerResult",
    "analyze_run",
    "ensemble_group_key",
    "load_model",
    "not_learned_horizon",
    "run_many",
    "run_one",
    "run_status",
]


class TrackerResult(RunResult):
    """A tracker run's ``result.json`` (the common fields: :class:`~dynlab.runner.protocol.RunResult`).

    Training (every run): ``train_steps``, ``train_loss`` (last batch's cross-entropy,
    nat/token), ``curriculum_length`` (length reached), ``final_train_accuracy`` (last
    batch's per-token accuracy), ``family`` (declared) and ``family_measured``
    (:func:`dynlab.tracking.models.measure_family`), ``ensemble_size`` (members trained together,
    absent for a run trained alone).

    Evaluation (``ok`` and ``not-learned`` runs): ``lengths`` evaluated, ``accuracy`` at the
    final position and ``accuracy_all`` over all positions at each of them,
    ``accuracy_dense`` at every length 1 … max(lengths), ``mp`` (dense max-pass length,
    :func:`dynlab.tracking.evaluate.max_pass_length_dense`) with ``mp_censored``, ``mp_grid`` on the
    evaluated lengths with ``mp_grid_censored``, and the ``threshold`` and ``mp_window``
    they used.
    """

    curriculum_length: int | None = None
    final_train_accuracy: float | None = None
    family: str | None = None
    family_measured: str | None = None
    ensemble_size: int | None = None
    lengths: list[int] | None = None
    accuracy: list[float] | None = None
    accuracy_all: list[float] | None = None
    accuracy_dense: list[float] | None = None
    mp: int | None = None
    mp_censored: bool | None = None
    mp_grid: int | None = None
    mp_grid_censored: bool | None = None
    threshold: float | None = None
    mp_window: float | None = None


def run_status(res: TrainResult, max_length: int) -> tuple[str, str]:
    """Status of a finished training run and its reason.

    - ``diverged`` — the loss or gradient became non-finite (the engine's verdict);
    - ``not-learned`` — training ended with the curriculum below the training length
      ``max_length``: the model never read the task at the length it was meant to learn,
      so its horizon says nothing about error control (reason: the length reached);
    - ``ok`` — the curriculum reached the training length.

    Rule for the analyses: ``ok`` and ``not-learned`` runs are evaluated and analysed alike
    (the measurements of a tracker that did not learn are still measurements, and the
    figures mark them), except that a not-learned run's q(t) stops at
    :func:`not_learned_horizon`; the T_cross–mp correlations use ``ok`` runs only
    (:func:`dynlab.analysis.correlation.study_correlations`).
    """
    if res.status != "ok":
        return res.status, res.reason
    reached = res.lengths[-1] if res.lengths else 0
    if reached < max_length:
        return "not-learned", f"curriculum stopped at length {reached} of {max_length}"
    return "ok", ""


def not_learned_horizon(horizon: int, t_ref: int, mp: int | None) -> int:
    """The step q(t) of a ``not-learned`` run is followed to: ``min(horizon, max(2·t_ref, 2·mp))``.

    Why: such a run is in no T_cross–mp correlation (:func:`run_status`); its accuracy
    fails near the short length its curriculum stopped at (2–6 in the sweep), far below
    2·t_ref (and twice its own mp is kept should it pass longer).  Following it to the
    longest evaluated length (1000) made its analysis cost more than its training, which
    runs at that short length (measured by ``benchmarks/bench_run_phases.py``;
    ``docs/performance.md``).  Its centroids, return map, perturbation and Lyapunov spectrum
    at t_ref are computed as for every run."""
    return int(min(horizon, max(2 * t_ref, 2 * (mp or 0))))


def _finish_run(spec: RunSpec, res: TrainResult, train_time: float, device: torch.device, **extra: Any) -> RunOutcome:
    """From a trained tracker to a stored outcome: training record, status
    (:func:`run_status`), measured family, and (unless diverged) accuracy vs length, dense
    accuracy at every length and mp."""
    status, reason = run_status(res, spec.train.curriculum.max_length)
    result = TrackerResult(
        status=status,
        reason=reason,
        train_steps=len(res.losses),
        train_loss=res.losses[-1] if res.losses else float("nan"),
        curriculum_length=res.lengths[-1] if res.lengths else 0,
        final_train_accuracy=res.final_train_accuracy,
        train_time=train_time,
        family=res.model.family,
        family_measured=measure_family(res.model.cells[0].cpu()),
        **extra,
    )
    res.model.to(device)
    if not result.evaluated:
        return RunOutcome(result, None)
    task = WordProblem(get_group(spec.task.group))
    ev = spec.eval
    with train_threads(device):  # RUN_THREADS, as training: same numbers on every machine
        le = evaluate_lengths(
            res.model, task, ev.lengths, ev.n_samples, ev.batch_size, ev.chunk, spec.seed + ev.seed_offset, device
        )
    mp_grid, grid_censored = max_pass_length(le.lengths, le.acc_final, ev.threshold)
    mp, censored = max_pass_length_dense(le.acc_dense, ev.threshold, ev.mp_window)
    result = result.model_copy(update=dict(
        lengths=le.lengths.tolist(),
        accuracy=le.acc_final.tolist(),
        accuracy_all=le.acc_all.tolist(),
        accuracy_dense=[round(float(a), 6) for a in le.acc_dense],
        mp=mp,
        mp_censored=censored,
        mp_grid=mp_grid,
        mp_grid_censored=grid_censored,
        threshold=ev.threshold,
        mp_window=ev.mp_window,
    ))
    return RunOutcome(result, res.model.state_dict())


def run_one(spec: RunSpec, device: torch.device, progress: NullProgress) -> RunOutcome:
    """Train one tracker, measure its family, evaluate accuracy vs length and mp."""
    t0 = time.perf_counter()
    res = train_tracker(spec, device, progress)
    return _finish_run(spec, res, time.perf_counter() - t0, device)


def run_many(specs: list[RunSpec], device: torch.device, progress: NullProgress) -> list[RunOutcome]:
    """Train ``specs`` (equal model, batch size and group order) as one ensemble
    (:func:`dynlab.tracking.train.ensemble.train_ensemble`), then finish each run as :func:`run_one`
    does (family, evaluation, mp).  ``train_time`` is the ensemble's training wall time
    divided by the number of members; ``ensemble_size`` records the number of members."""
    t0 = time.perf_counter()
    trained = train_ensemble(specs, device, progress)
    train_time = (time.perf_counter() - t0) / len(specs)
    return [_finish_run(spec, res, train_time, device, ensemble_size=len(specs)) for spec, res in zip(specs, trained)]


def ensemble_group_key(spec: RunSpec) -> Hashable:
    """Specs with equal keys share an ensemble: same model, batch size and group order
    (what :func:`dynlab.tracking.train.ensemble.check_ensemble` needs); other specs get a unique key
    (the spec hash).

    Stacked are the models a fused training kernel computes, decided from the spec
    (:func:`dynlab.tracking.models.tracker.declared_fused_kind`: one layer, a linear readout, a cell
    class that declares a kernel and a nonlinearity that kernel implements): the dense
    RNNs, whose per-step GEMMs batch into one bmm for all members on every device, and the
    Mamba family (mamba, negative-mamba, mamba3, aussm), whose diagonal kernel runs the
    members one after another on the CPU (as fast per model as solo training, and
    bit-identical to it) and as one stack on a GPU.  Other models (a Mamba cell with
    φ ≠ identity in the nonlinearity study, a user's cell that overrides a method) run alone.
    """
    model = spec.model
    if declared_fused_kind(model.arch, layers=model.layers, nonlinearity=model.nonlinearity,
                           readout=model.readout) is None:
        return spec.spec_hash()
    return ensemble_key(spec)  # the one rule of what may share an ensemble


def load_model(spec: RunSpec, store: RunStore, device: torch.device) -> Tracker:
    """Rebuild a finished run's tracker from its stored weights."""
    task = WordProblem(get_group(spec.task.group))
    model = build_tracker(spec.model, task.n_tokens, task.n_classes, spec.seed)
    model.load_state_dict(store.load_state_dict(spec))
    return model.to(device).eval()


def analyze_run(spec: RunSpec, store: RunStore, aspec: AnalysisSpec, preset: str) -> xr.Dataset:
    """Error-control analysis of a finished run (:func:`dynlab.tracking.analysis.pipeline.analyze_tracker`)
    with the settings ``aspec`` of the analysis preset named ``preset``.

    q(t) is followed to the longest evaluated length (``aspec.horizon`` when it sets one);
    U, the return map and the perturbation use step t_ref = the curriculum's max_length
    (the training length; ``aspec.t_ref`` when it sets one).  A ``not-learned`` run's q(t)
    stops at :func:`not_learned_horizon`.  Adds the run variable ``horizon`` (the step q(t)
    is followed to) and the attrs ``analysis_preset`` (the runner redoes an analysis made
    with another preset) and ``analysis_seconds`` (wall time of this analysis, s).
    """
    t0 = time.perf_counter()
    model = load_model(spec, store, torch.device("cpu"))
    task = WordProblem(get_group(spec.task.group))
    horizon = aspec.horizon or max(spec.eval.lengths)
    t_ref = aspec.t_ref or spec.train.curriculum.max_length
    result = read_result(TrackerResult, store, spec)
    if result.status == "not-learned":
        horizon = not_learned_horizon(horizon, t_ref, result.mp)
    ds = analyze_tracker(model, task, aspec, horizon=horizon, t_ref=min(t_ref, horizon))
    ds["horizon"] = ((), int(horizon))  # per run: a not-learned run's is shorter
    ds.attrs["analysis_preset"] = preset
    ds.attrs["analysis_seconds"] = time.perf_counter() - t0
    return ds
