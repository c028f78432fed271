"""Study ``group-tracking`` (paper A): trackers on group word problems, length extrapolation.

Every selected architecture is trained on every selected group with a curriculum to
length 60 and evaluated at lengths up to 1000; the dataset holds ``accuracy(run,
length)``, ``accuracy_all``, ``mp(run)`` and the training record.

Presets:
- ``smoke`` — width 16, 20 steps, lengths to 60; checks an installation (about half a minute
  on a 2-core CPU, analyses included).
- ``quick`` — 8 architectures × {C2, C6, S3} × 1 seed, width 64, ≤ 600 steps of batch 128,
  evaluation on 256 sequences to length 1000.  Minutes on a laptop CPU.
- ``groups`` — quick's recipe on :data:`GROUPS_PRESET` (C2xC2, C4, C2xC4, D4, C12, A4, D6,
  C2xS3: abelian and not, orders 4–12) × 8 architectures × seeds 0–2 = 192 models.

``quick``, ``sweep`` and ``groups`` scale the budget by the group
(:func:`dynlab.tracking.train.budget.group_budget`): for order n > 6, width 64·m (m the least power
of two with m² ≥ n/6), a cap of ceil(600·2n/6) steps, and a stop 300 steps after the
curriculum first reaches length 60; above order 12 (S4, A5) twice that width, batch 512
and a learning rate times 10/L above curriculum length L = 10 (``TrainSpec.lr_length``).
Groups of order ≤ 6 (C2, C6, S3, C2xC2, C4) keep width 64 and 600 steps, and their run
ids.  Without it tanh-rnn and state-gated-rnn stall at length 3–5 on A4 in every seed.

- ``paper`` — 8 architectures × {C2, C6, S3} × 5 seeds = 120 models (paper A: 113), width
  128, 3000 steps of batch 256 (AdamW 1e-3, warm-up + cosine, clip 1.0), curriculum to 60,
  evaluation on 1024 sequences at lengths 10 … 1000, analyses with 512 sequences to 1000.
  ``--groups`` adds more (A4, D4, S4, A5, S5, C2xS3, …): 40 models per group.

  Hours on a CPU: ``benchmarks/bench_run_phases.py --preset paper`` measures the cost per
  architecture (``docs/performance.md`` has the recorded tables).  Runs whose curriculum
  never grows (cells that cannot represent the group stay at length ≤ 6) train at that
  length and are analysed only to :func:`not_learned_horizon`.  For many more models use
  a GPU machine or a cluster (``--executor dask``).

This module is the recipe (presets, specs, analysis settings, figures); the work of a
run is :mod:`dynlab.tracking.run` and the dataset :mod:`dynlab.tracking.dataset`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

import torch
import xarray as xr
from pydantic import AfterValidator, model_validator

from dynlab.tracking.analysis.spec import AnalysisSpec
from dynlab.tracking.spec import EvalSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.errors import DynlabInputError
from dynlab.tracking.groups import get_group
from dynlab.tracking.selection import canonical_groups, canonical_options, check_specs_analysable
from dynlab.tracking.models import BUILTIN_ARCHS, available_cells
from dynlab.results.store import RunStore
from dynlab.runtime import NullProgress
from dynlab.runner.protocol import Stacking, Study, StudyExtra, StudyOptions, override_field, select_names
from dynlab.tracking.dataset import assemble_tracking
from dynlab.tracking.run import (
    TrackerResult,
    analyze_run,
    ensemble_group_key,
    load_model,
    not_learned_horizon,
    run_many,
    run_one,
    run_status,
)
from dynlab.tracking.train.budget import group_budget

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
    "run_status",
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


#: Settings of the per-run analyses (:func:`dynlab.tracking.analysis.pipeline.analyze_tracker`) by
#: analysis preset; a study preset names its analysis preset (``PRESETS[p]["analysis"]``)
#: and ``extra={"analysis": ...}`` picks another.
ANALYSIS_PRESETS: dict[str, AnalysisSpec] = {
    "smoke": AnalysisSpec(n_samples=32, perturb_samples=16, perturb_steps=10, lyap_samples=2, lyap_steps=10, n_words=2,
                          fp_starts=2),
    "quick": AnalysisSpec(n_samples=128, perturb_samples=128, lyap_samples=8),
    "paper": AnalysisSpec(),
}


class TrackingOptions(StudyExtra):
    """Options of group-tracking beyond the common selections (``StudyOptions.extra``).

    Attributes:
        groups: the groups to train on (names :func:`dynlab.tracking.groups.get_group`
            reads; the command's ``--groups``); default: the preset's.
        model: overrides of the preset's :class:`~dynlab.tracking.spec.ModelSpec` fields (not ``arch``).
        train: overrides of the preset's :class:`~dynlab.tracking.spec.TrainSpec` fields.
        eval: overrides of the preset's :class:`~dynlab.tracking.spec.EvalSpec` fields.
        analysis: analysis preset of the per-run analyses (a key of :data:`ANALYSIS_PRESETS`);
            default: the study preset's (``smoke`` for smoke, ``quick`` for quick and sweep,
            ``paper`` for paper), written into the manifest.
    """

    option_words: ClassVar[Mapping[str, str]] = {"groups": "--groups", "analysis": "the analysis preset"}
    #: manifests written before the groups were a study option kept them beside ``extra``
    manifest_top_level: ClassVar[tuple[str, ...]] = ("groups",)

    groups: tuple[str, ...] | None = None
    model: Annotated[dict[str, Any], AfterValidator(override_field(ModelSpec, "arch"))] = {}
    train: Annotated[dict[str, Any], AfterValidator(override_field(TrainSpec))] = {}
    eval: Annotated[dict[str, Any], AfterValidator(override_field(EvalSpec))] = {}
    analysis: Literal[tuple(ANALYSIS_PRESETS)] | None = None  # type: ignore[valid-type]  (its keys)

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
    groups = tuple(get_group(g).name for g in canonical_groups(extra.groups or preset.get("groups", DEFAULT_GROUPS)))
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be ≥ 0, got {list(seeds)}")
    evals = EvalSpec(**{**preset["eval"], **extra.eval})
    budgets = {g: group_budget(g, preset["model"], preset["train"]) if preset.get("group_budget") else
               (preset["model"], preset["train"]) for g in groups}  # the preset's budget scaled by group (dynlab.tracking.train.budget)
    return [
        RunSpec(task=TaskSpec(group=g), model=ModelSpec(arch=a, **{**budgets[g][0], **extra.model}),
                train=TrainSpec(**{**budgets[g][1], **extra.train}), eval=evals, seed=s)
        for g in groups
        for a in archs
        for s in seeds
    ]


def analyze_one(
    spec: RunSpec, store: RunStore, device: torch.device, progress: NullProgress, extra: TrackingOptions
) -> xr.Dataset:
    """Error-control analysis of a finished run (:func:`dynlab.tracking.run.analyze_run`:
    q(t) to the longest evaluated length, ``max(2·t_ref, 2·mp)`` at most for a
    ``not-learned`` run, t_ref = the training length) with the settings of the analysis
    preset ``extra.analysis`` (:data:`ANALYSIS_PRESETS`); always on the CPU."""
    if extra.analysis is None:
        raise DynlabInputError(f"no analysis preset given; allowed: {', '.join(ANALYSIS_PRESETS)}")
    return analyze_run(spec, store, ANALYSIS_PRESETS[extra.analysis], extra.analysis)


def assemble(specs: list[RunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset (:func:`dynlab.tracking.dataset.assemble_tracking`): the training
    and evaluation record of every run, its analyses where they exist, the margin summary
    per run and the T_cross–mp correlations across runs (``corr_*`` variables)."""
    return assemble_tracking(specs, store)


def _panels(ds: xr.Dataset) -> dict:
    """The study's figures (:func:`dynlab.tracking.figures.sets.group_tracking_panels`; matplotlib is loaded on first use)."""
    from dynlab.tracking.figures.sets import group_tracking_panels

    return group_tracking_panels(ds)


STUDY = Study(
    name="group-tracking",
    analyze_one=analyze_one,
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    assemble=assemble,
    spec_type=RunSpec,
    result_type=TrackerResult,
    options_type=TrackingOptions,
    stacking=Stacking(key=ensemble_group_key, run=run_many, max_size=64),
    panels=_panels,
    prepare_options=canonical_options,
    check_analyses=check_specs_analysable,
)
