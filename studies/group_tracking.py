"""Study ``group-tracking`` (paper A): trackers on group word problems, length extrapolation.

Every selected architecture is trained on every selected group with a curriculum to
length 60 and evaluated at lengths up to 1000; the dataset holds ``accuracy(run,
length)``, ``accuracy_all``, ``mp(run)`` and the training record.

Presets:
- ``smoke`` — width 16, 20 steps, lengths to 60: seconds; checks an installation.
- ``quick`` — 8 architectures × {C2, C6, S3} × 1 seed, width 64, ≤ 600 steps of batch 128,
  evaluation on 256 sequences to length 1000.  Minutes on a laptop CPU.
- ``groups`` — quick's recipe on :data:`GROUPS_PRESET` (C2xC2, C4, C2xC4, D4, C12, A4, D6,
  C2xS3: abelian and not, orders 4–12) × 8 architectures × seeds 0–2 = 192 models.

``quick``, ``sweep`` and ``groups`` scale the budget by the group
(:func:`dynlab.train.budget.group_budget`): for order n > 6, width 64·m (m the least power
of two with m² ≥ n/6), a cap of ceil(600·2n/6) steps, and a stop 300 steps after the
curriculum first reaches length 60.  Groups of order ≤ 6 (C2, C6, S3, C2xC2, C4) keep
width 64 and 600 steps, and their run ids.  Without it tanh-rnn and state-gated-rnn stall
at length 3–5 on A4 in every seed.

- ``paper`` — 8 architectures × {C2, C6, S3} × 5 seeds = 120 models (paper A: 113), width
  128, 3000 steps of batch 256 (AdamW 1e-3, warm-up + cosine, clip 1.0), curriculum to 60,
  evaluation on 1024 sequences at lengths 10 … 1000, analyses with 512 sequences to 1000.
  ``--groups`` adds more (A4, D4, S4, A5, S5, C2xS3, …): 40 models per group.

  Hours on a CPU: ``benchmarks/bench_run_phases.py --preset paper`` measures the cost per
  architecture (``docs/performance.md`` has the recorded tables).  Runs whose curriculum
  never grows (cells that cannot represent the group stay at length ≤ 6) train at that
  length and are analysed only to :func:`not_learned_horizon`.  For many more models use
  a GPU machine or a cluster (``--executor dask``).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Annotated, Any, Literal

import numpy as np
import torch
import xarray as xr
from pydantic import AfterValidator, model_validator

from dynlab.analysis.correlation import (
    CROSSING_VARIANTS,
    FORECAST_VARIANTS,
    correlation_table,
    heldout_choice,
    tcross_mp_correlation,
)
from dynlab.analysis.tracking import AnalysisSpec, analyze_tracker
from dynlab.config import EvalSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.errors import DynlabInputError
from dynlab.evaluate import evaluate_lengths, max_pass_length, max_pass_length_dense
from dynlab.groups import get_group
from dynlab.models import BUILTIN_ARCHS, available_cells, get_cell, measure_family
from dynlab.results.assemble import assemble_runs, stack_run_files
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, RunResult, Study, StudyExtra, StudyOptions, override_field, read_result, select_names
from dynlab.tasks import WordProblem
from dynlab.train import NullProgress, TrainResult, build_tracker, train_tracker
from dynlab.runtime import train_threads
from dynlab.train.budget import group_budget
from dynlab.train.ensemble import train_ensemble

__all__ = [
    "ANALYSIS_PRESETS",
    "PRESETS",
    "STUDY",
    "TrackerResult",
    "TrackingOptions",
    "analyze_one",
    "assemble",
    "ensemble_group_key",
    "load_model",
    "make_specs",
    "not_learned_horizon",
    "run_many",
    "run_one",
]

DEFAULT_GROUPS = ("C2", "C6", "S3")
#: The ``groups`` preset's groups beyond C2, C6, S3: abelian (C2xC2, C4, C2xC4, C12) and
#: not (D4, A4, D6, C2xS3), orders 4–12.
GROUPS_PRESET = ("C2xC2", "C4", "C2xC4", "D4", "C12", "A4", "D6", "C2xS3")

PRESETS: dict[str, dict] = {
    "smoke": {
        "seeds": (0,),
        "model": {"hidden": 16},
        "train": {"steps": 20, "batch_size": 32, "lr": 3e-3, "warmup_steps": 2},
        "eval": {"n_samples": 32, "batch_size": 32, "lengths": (5, 20, 60), "chunk": 25},
        "analysis": "smoke",
    },
    "quick": {
        "seeds": (0,),
        "model": {"hidden": 64},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3},
        "eval": {"n_samples": 256, "batch_size": 256},
        "analysis": "quick",
        "group_budget": True,
    },
    "sweep": {
        "seeds": (0, 1, 2, 3, 4),
        "model": {"hidden": 64},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3},
        "eval": {"n_samples": 256, "batch_size": 256},
        "analysis": "quick",
        "group_budget": True,
    },
    "groups": {
        "seeds": (0, 1, 2),
        "groups": GROUPS_PRESET,
        "model": {"hidden": 64},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3},
        "eval": {"n_samples": 256, "batch_size": 256},
        "analysis": "quick",
        "group_budget": True,
    },
    "paper": {
        "seeds": (0, 1, 2, 3, 4),
        "model": {"hidden": 128},
        "train": {"steps": 3000, "batch_size": 256, "lr": 1e-3, "warmup_steps": 100},
        "eval": {"n_samples": 1024, "batch_size": 512, "lengths": (10, 20, 40, 60, 100, 200, 300, 500, 700, 1000)},
        "analysis": "paper",
    },
}


#: Settings of the per-run analyses (:func:`dynlab.analysis.tracking.analyze_tracker`) by
#: analysis preset; a study preset names its analysis preset (``PRESETS[p]["analysis"]``)
#: and ``extra={"analysis": ...}`` picks another.
ANALYSIS_PRESETS: dict[str, AnalysisSpec] = {
    "smoke": AnalysisSpec(n_samples=32, perturb_samples=16, perturb_steps=10, lyap_samples=2, lyap_steps=10, n_words=2),
    "quick": AnalysisSpec(n_samples=128, perturb_samples=128, lyap_samples=8),
    "paper": AnalysisSpec(),
}


class TrackingOptions(StudyExtra):
    """Options of group-tracking beyond the common selections (``StudyOptions.extra``).

    Attributes:
        model: overrides of the preset's :class:`~dynlab.config.ModelSpec` fields (not ``arch``).
        train: overrides of the preset's :class:`~dynlab.config.TrainSpec` fields.
        eval: overrides of the preset's :class:`~dynlab.config.EvalSpec` fields.
        analysis: analysis preset of the per-run analyses (a key of :data:`ANALYSIS_PRESETS`);
            default: the study preset's (``smoke`` for smoke, ``quick`` for quick and sweep,
            ``paper`` for paper), written into the manifest.
    """

    model: Annotated[dict[str, Any], AfterValidator(override_field(ModelSpec, "arch"))] = {}
    train: Annotated[dict[str, Any], AfterValidator(override_field(TrainSpec))] = {}
    eval: Annotated[dict[str, Any], AfterValidator(override_field(EvalSpec))] = {}
    analysis: Literal["smoke", "quick", "paper"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _preset_analysis(cls, data: Any, info: Any) -> Any:
        preset = PRESETS.get((info.context or {}).get("preset", ""))
        if isinstance(data, dict) and data.get("analysis") is None and preset is not None:
            data = {**data, "analysis": preset["analysis"]}
        return data


def make_specs(options: StudyOptions) -> list[RunSpec]:
    """One :class:`RunSpec` per (architecture, group, seed) of the selection."""
    if options.preset not in PRESETS:
        raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(PRESETS)}")
    extra = TrackingOptions.parse(options, "group-tracking")
    preset = PRESETS[options.preset]
    archs = select_names(options.models, BUILTIN_ARCHS, available_cells(), "model")
    groups = tuple(get_group(g).name for g in (options.groups or preset.get("groups", DEFAULT_GROUPS)))
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be ≥ 0, got {list(seeds)}")
    evals = EvalSpec(**{**preset["eval"], **extra.eval})
    budgets = {g: group_budget(g, preset["model"], preset["train"]) if preset.get("group_budget") else
               (preset["model"], preset["train"]) for g in groups}  # the preset's budget scaled by group (dynlab.train.budget)
    return [
        RunSpec(task=TaskSpec(group=g), model=ModelSpec(arch=a, **{**budgets[g][0], **extra.model}),
                train=TrainSpec(**{**budgets[g][1], **extra.train}), eval=evals, seed=s)
        for g in groups
        for a in archs
        for s in seeds
    ]


class TrackerResult(RunResult):
    """A tracker run's ``result.json`` (the common fields: :class:`~dynlab.study.RunResult`).

    Training (every run): ``train_steps``, ``train_loss`` (last batch's cross-entropy,
    nat/token), ``curriculum_length`` (length reached), ``final_train_accuracy`` (last
    batch's per-token accuracy), ``family`` (declared) and ``family_measured``
    (:func:`dynlab.models.measure_family`), ``ensemble_size`` (members trained together,
    absent for a run trained alone).

    Evaluation (``ok`` and ``not-learned`` runs): ``lengths`` evaluated, ``accuracy`` at the
    final position and ``accuracy_all`` over all positions at each of them,
    ``accuracy_dense`` at every length 1 … max(lengths), ``mp`` (dense max-pass length,
    :func:`dynlab.evaluate.max_pass_length_dense`) with ``mp_censored``, ``mp_grid`` on the
    evaluated lengths with ``mp_grid_censored``, and the ``threshold`` and ``mp_window``
    they used.  Results stored before ``mp_grid_censored`` existed take ``mp_censored``.
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

    @model_validator(mode="after")
    def _legacy_grid_censoring(self) -> TrackerResult:
        if self.mp_grid_censored is None and self.mp_censored is not None:
            self.mp_grid_censored = self.mp_censored
        return self


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
    :func:`not_learned_horizon`; the T_cross–mp correlations use ``ok`` runs only.
    """
    if res.status != "ok":
        return res.status, res.reason
    reached = res.lengths[-1] if res.lengths else 0
    if reached < max_length:
        return "not-learned", f"curriculum stopped at length {reached} of {max_length}"
    return "ok", ""


def _finish_run(spec: RunSpec, res: TrainResult, train_time: float, device: torch.device, **extra) -> RunOutcome:
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


def load_model(spec: RunSpec, store: RunStore, device: torch.device):
    """Rebuild a finished run's tracker from its stored weights."""
    task = WordProblem(get_group(spec.task.group))
    model = build_tracker(spec.model, task.n_tokens, task.n_classes, spec.seed)
    model.load_state_dict(store.load_state_dict(spec))
    return model.to(device).eval()


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


def analyze_one(
    spec: RunSpec, store: RunStore, device: torch.device, progress: NullProgress, extra: TrackingOptions
) -> xr.Dataset:
    """Error-control analysis of a finished run (:func:`dynlab.analysis.tracking.analyze_tracker`)
    with the settings of the analysis preset ``extra.analysis`` (:data:`ANALYSIS_PRESETS`).

    q(t) is followed to the longest evaluated length (the preset's ``horizon`` when it
    sets one); U, the return map and the perturbation use step t_ref = the curriculum's
    max_length (the training length).  The step q(t) is followed to is the run variable
    ``horizon``.

    Rule for ``not-learned`` runs (:func:`not_learned_horizon`): q(t) is followed to
    ``max(2·t_ref, 2·mp)`` steps at most, not to the longest evaluated length.
    """
    if extra.analysis is None:
        raise DynlabInputError(f"no analysis preset given; allowed: {', '.join(ANALYSIS_PRESETS)}")
    t0 = time.perf_counter()
    model = load_model(spec, store, torch.device("cpu"))
    task = WordProblem(get_group(spec.task.group))
    aspec = ANALYSIS_PRESETS[extra.analysis]
    horizon = aspec.horizon or max(spec.eval.lengths)
    t_ref = aspec.t_ref or spec.train.curriculum.max_length
    result = read_result(TrackerResult, store, spec)
    if result.status == "not-learned":
        horizon = not_learned_horizon(horizon, t_ref, result.mp)
    ds = analyze_tracker(model, task, aspec, horizon=horizon, t_ref=min(t_ref, horizon))
    ds["horizon"] = ((), int(horizon))  # per run: a not-learned run's is shorter
    ds.attrs["analysis_preset"] = extra.analysis  # the runner redoes an analysis made with another preset
    ds.attrs["analysis_seconds"] = time.perf_counter() - t0  # wall time of this analysis (compare train_time)
    return ds


def _correlations(ds: xr.Dataset) -> xr.Dataset:
    """T_cross–mp correlations over the ``ok`` runs, for every crossing-time variant and
    both censoring rules (:func:`dynlab.analysis.correlation.correlation_table`), the
    held-out choice of the default variant (:func:`~dynlab.analysis.correlation.heldout_choice`)
    and, as scalars ``corr_pearson_r`` … , the default variant's statistics on all runs.

    Rule: ``not-learned`` and ``diverged`` runs are left out (a horizon of a model that
    never learned its task says nothing about error control); each censored crossing is
    replaced by its own run's horizon ('replace') or the run is dropped ('drop').
    """
    ok = (ds["status"] == "ok") & np.isfinite(ds["mp"])
    variants = {**CROSSING_VARIANTS, **FORECAST_VARIANTS}
    present = {name: var for name, (var, _) in variants.items() if var in ds}
    if not present or int(ok.sum()) < 3:
        return xr.Dataset()
    sub = ds.sel(run=ok)
    horizon = sub["horizon"].values if "horizon" in sub else float(ds["length"].max())
    t_cross = {name: sub[var].values for name, var in present.items()}
    common = dict(horizon=horizon, mp_censored=sub["mp_censored"].values.astype(bool))
    table = correlation_table(t_cross, sub["mp"].values, **common)
    table["variant_description"] = ("variant", np.asarray([variants[n][1] for n in table["variant"].values], dtype=str))
    choice = heldout_choice(
        {n: v for n, v in t_cross.items() if n in CROSSING_VARIANTS}, sub["mp"].values, sub["seed"].values, **common
    )
    default = choice["variant"]
    out = table
    desc = f"default variant {default!r} chosen on seeds {choice['selection_seeds']}"
    for key in ("pearson_r", "pearson_r_lo", "pearson_r_hi"):
        out[f"corr_heldout_{key}"] = (
            (),
            float(choice[key]),
            {"variant": default, "heldout_seeds": str(choice["heldout_seeds"]), "choice": desc},
        )
    out["corr_heldout_n_used"] = ((), int(choice["n_used"]))  # labels: dynlab.results.vocabulary
    res = tcross_mp_correlation(
        t_cross[default], sub["mp"].values, rng=np.random.default_rng(0), **common
    )
    cds = res.to_dataset()
    for v in cds.data_vars:
        cds[v].attrs["variant"] = default
    out = out.merge(cds.rename({v: f"corr_{v}" for v in cds.data_vars}))
    out.attrs.update(
        corr_default_variant=default,
        corr_default_tcross=variants[default][0],
        corr_selection_seeds=str(choice["selection_seeds"]),
        corr_heldout_seeds=str(choice["heldout_seeds"]),
        corr_selection_r=json.dumps({k: round(float(v), 4) for k, v in choice["selection_r"].items()}),
        corr_censoring=res.censoring,
        corr_n_boot=res.n_boot,
    )
    return out


def _run_curves(spec: RunSpec, r: TrackerResult) -> xr.Dataset:
    """One run's accuracy on its evaluated lengths (``length``) and at every length 1 …
    max (``length_dense``); NaN on the spec's lengths for a run that was not evaluated."""
    lengths = r.lengths if r.evaluated and r.lengths is not None else list(spec.eval.lengths)
    nan = [np.nan] * len(lengths)
    acc = r.accuracy if r.evaluated else nan
    acc_all = r.accuracy_all if r.evaluated else nan
    dense = np.full(max(lengths), np.nan)
    given = (r.accuracy_dense or []) if r.evaluated else []
    dense[: len(given)] = given
    return xr.Dataset(
        {
            "accuracy": ("length", np.asarray(acc, dtype=float)),
            "accuracy_all": ("length", np.asarray(acc_all, dtype=float)),
            "accuracy_dense": ("length_dense", dense),
        },
        coords={"length": np.asarray(lengths, dtype=np.int64), "length_dense": np.arange(1, dense.size + 1)},
    )


def assemble(specs: list[RunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset: dim ``run`` (+ ``length``, ``t`` …) with the names of dynlab's dataset vocabulary (:mod:`dynlab.results.vocabulary`).

    Holds the training/evaluation record of every run, the per-run analyses where they
    exist (:func:`analyze_one`), the margin summary per run and the T_cross–mp
    correlations across runs (``corr_*`` variables).
    """
    results = [read_result(TrackerResult, store, s) for s in specs]
    ds = assemble_runs(
        specs, results, _run_curves,
        columns=("mp", "mp_censored", "mp_grid", "mp_grid_censored", "status", "reason",
                 "curriculum_length", "train_loss", "train_steps", "train_time"),
        result_coords=("family", "family_measured"),
        coords={
            "arch": lambda s: s.model.arch,
            "group": lambda s: s.task.group,
            "seed": lambda s: s.seed,
            "hidden": lambda s: s.model.hidden,
            "layers": lambda s: s.model.layers,
            "nonlinearity": lambda s: s.model.nonlinearity or "default",
        },
    )
    ds["mp"].attrs["threshold"] = float(specs[0].eval.threshold) if specs else float("nan")
    ds["mp"].attrs["window"] = float(specs[0].eval.mp_window) if specs else float("nan")
    table = stack_run_files(specs, store, "analysis.nc", [r.evaluated for r in results], positional=("k",))
    if table is not None:
        ds = ds.merge(table.drop_vars([c for c in table.coords if c in ("run",)], errors="ignore"), compat="override")
        per_run = ("analysis_seconds", "horizon")  # differ from run to run: the run variable horizon, and each analysis.nc
        ds.attrs.update({f"analysis_{k}": v for k, v in table.attrs.items() if k not in per_run})
        if "R" in ds:  # analyses written before the run variable existed followed q(t) to every length
            analysed = np.isfinite(ds["R"]).any("t")
            horizon = ds["horizon"] if "horizon" in ds else xr.full_like(analysed, np.nan, dtype=float)
            ds["horizon"] = horizon.where(~(horizon.isnull() & analysed), float(ds["length"].max()))
        orders = [get_group(s.task.group).order for s in specs]
        ds["group_order"] = ("run", np.asarray(orders))
        ds["half_margin_rel"] = ("run", (0.5 * ds["M"] / ds["centroid_radius"]).median("t").values)
        ds["q_max"] = ("run", ds["q"].max("t").values)
        corr = _correlations(ds)
        ds = ds.merge(corr)
        ds.attrs.update(corr.attrs)  # merge keeps only the first dataset's attrs
    return ds


STUDY = Study(
    name="group-tracking",
    analyze_one=analyze_one,
    description="Trackers on group word problems (C2, C6, S3, …): accuracy vs length to 1000, max-pass length.",
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    assemble=assemble,
    spec_type=RunSpec,
    result_type=TrackerResult,
    options_type=TrackingOptions,
    run_many=lambda specs, device, progress: run_many(specs, device, progress),
    group_key=lambda spec: ensemble_group_key(spec),
    max_group=64,
    panels=lambda ds: _panels(ds),
)


def _panels(ds: xr.Dataset) -> dict:
    """The study's figures (:func:`dynlab.figures.group_tracking_panels`; matplotlib is loaded on first use)."""
    from dynlab.figures import group_tracking_panels

    return group_tracking_panels(ds)


def run_many(specs: list[RunSpec], device: torch.device, progress: NullProgress) -> list[RunOutcome]:
    """Train ``specs`` (equal model, batch size and group order) as one ensemble
    (:func:`dynlab.train.ensemble.train_ensemble`), then finish each run as :func:`run_one`
    does (family, evaluation, mp).  ``train_time`` is the ensemble's training wall time
    divided by the number of members; ``ensemble_size`` records the number of members."""
    t0 = time.perf_counter()
    trained = train_ensemble(specs, device, progress)
    train_time = (time.perf_counter() - t0) / len(specs)
    return [_finish_run(spec, res, train_time, device, ensemble_size=len(specs)) for spec, res in zip(specs, trained)]


def ensemble_group_key(spec: RunSpec):
    """Specs with equal keys share an ensemble: same model, batch size and group order
    (what :func:`dynlab.train.ensemble.check_ensemble` needs); other specs get a unique key.

    Stacked are the models a fused training kernel computes (:func:`dynlab.train.engine.fused_kind`
    of the spec's tracker: the cell class declares one and the nonlinearity is one it
    implements): the dense RNNs, whose per-step GEMMs batch into one bmm for all members
    on every device, and the Mamba family (mamba, negative-mamba, mamba3, aussm), whose
    diagonal kernel runs the members one after another on the CPU (as fast per model as
    solo training, and bit-identical to it) and as one stack on a GPU.  Other models (a
    Mamba cell with φ ≠ identity in the nonlinearity study, a user's cell) run alone.
    """
    if _fused_kind_of(spec.model, get_group(spec.task.group).order) is None:
        return spec.spec_hash()
    return (spec.model, spec.train.batch_size, get_group(spec.task.group).order)


@functools.lru_cache(maxsize=256)
def _fused_kind_of(model: ModelSpec, order: int) -> str | None:
    """The fused kernel of a tracker built from ``model`` for a group of ``order`` (structure only)."""
    return build_tracker(model, order, order, seed=0).fused_kind()
