"""Shared machinery of the long-context task studies ``copying``, ``passkey`` and ``babilong`` (paper B).

Each study trains byte-level recurrent LMs (the mixers, interventions, engine and run store
of ``length-generalization``) on one task of :mod:`dynlab.lm.tasks` at short lengths and
tests them from the zero state at longer ones. The dataset holds

- ``accuracy(run, length[, depth | kind])`` — the task's headline accuracy (per-character
  for copying, whole key for passkey, whole answer for babi; see :mod:`dynlab.lm.task_run`),
- ``token_accuracy`` and ``exact_match`` on the same dims,
- ``train_loss(run)``, ``train_time(run)``, ``status(run)``,

with coords ``arch`` (mixer), ``intervention``, ``seed``, ``train_min``, ``train_max`` on
``run``.

Selections: ``models`` = mixers (``all`` = the preset's; or any of mamba2, mamba1, gla);
``seeds``; ``extra`` may hold ``interventions`` (zero, random-noise, fitted-noise,
state-passing; TBTT needs one long document and does not apply to independent samples),
``source`` (filler text: ``shakespeare`` or a UTF-8 file; passkey and babilong only) and
``model`` / ``train`` / ``eval`` / ``intervention`` / ``task`` field overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import torch
import xarray as xr
from pydantic import AfterValidator

from dynlab.errors import DynlabInputError
from dynlab.lm.run import corpus_for
from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMModelSpec, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec, TaskTrainSpec
from dynlab.lm.task_run import task_result_to_dataset, train_and_evaluate_task
from dynlab.results.assemble import assemble_runs
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, RunResult, Study, StudyExtra, StudyOptions, override_field, read_result, select_names
from dynlab.train.progress import NullProgress

__all__ = ["MIXER_NAMES", "TASK_INTERVENTIONS", "LMOptions", "TaskOptions", "TaskResult", "make_task_study",
           "check_source"]

MIXER_NAMES = ("mamba2", "mamba1", "gla")
TASK_INTERVENTIONS = ("zero", "random-noise", "fitted-noise", "state-passing")


class LMOptions(StudyExtra):
    """Options every LM study takes (``StudyOptions.extra``).

    Attributes:
        interventions: initial-state interventions to train (default: the study's).
        source: the text: ``shakespeare`` (default) or a UTF-8 file.
        model: overrides of the preset's :class:`~dynlab.lm.spec.LMModelSpec` fields (not ``mixer``).
        intervention: overrides of the preset's :class:`~dynlab.lm.spec.InterventionSpec` fields (not ``kind``).
    """

    interventions: tuple[str, ...] | None = None
    source: str | None = None
    model: Annotated[dict[str, Any], AfterValidator(override_field(LMModelSpec, "mixer"))] = {}
    intervention: Annotated[dict[str, Any], AfterValidator(override_field(InterventionSpec, "kind"))] = {}


class TaskOptions(LMOptions):
    """Options of the task studies: :class:`LMOptions` and overrides of the preset's
    :class:`~dynlab.lm.spec.LMTaskSpec` (``task``, not ``kind``),
    :class:`~dynlab.lm.spec.TaskTrainSpec` (``train``) and
    :class:`~dynlab.lm.spec.TaskEvalSpec` (``eval``) fields."""

    task: Annotated[dict[str, Any], AfterValidator(override_field(LMTaskSpec, "kind"))] = {}
    train: Annotated[dict[str, Any], AfterValidator(override_field(TaskTrainSpec))] = {}
    eval: Annotated[dict[str, Any], AfterValidator(override_field(TaskEvalSpec))] = {}


class TaskResult(RunResult):
    """A task run's ``result.json`` (:func:`dynlab.lm.task_run.train_and_evaluate_task`);
    the evaluation fields are absent for a diverged run.

    ``accuracy``, ``token_accuracy``, ``exact_match``: fractions in [0, 1] per test length
    in ``lengths`` (× ``depths`` for passkey, × ``kinds`` for babi); see the module
    docstring.  ``train_loss``: mean masked cross-entropy over the last 5 % of the steps.
    """

    lengths: list[int] | None = None
    depths: list[float] | None = None
    kinds: list[str] | None = None
    accuracy: list[float] | list[list[float]] | None = None
    token_accuracy: list[float] | list[list[float]] | None = None
    exact_match: list[float] | list[list[float]] | None = None


def check_source(source: str, val_fraction: float, need: int) -> LMDataSpec:
    """Validate a filler/text source before anything is written: it must load and its validation part hold ``need`` bytes."""
    data = LMDataSpec(source=source, val_fraction=val_fraction)
    corpus = corpus_for(data.source, data.val_fraction)
    if len(corpus.val) < need or len(corpus.train) < need:
        raise DynlabInputError(f"source {source!r} is too short: its train and validation parts need >= {need} bytes, "
                         f"have {len(corpus.train)} and {len(corpus.val)}; allowed: a longer text")
    return data


def make_task_study(name: str, kind: str, description: str, presets: Mapping[str, Mapping[str, Any]],
                    default_interventions: tuple[str, ...]) -> Study:
    """A :class:`Study` for task ``kind`` with ``presets`` (keys: mixers, seeds, model, task, train, eval, intervention)."""

    def make_specs(options: StudyOptions) -> list[LMTaskRunSpec]:
        if options.preset not in presets:
            raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(presets)}")
        if options.groups:
            raise DynlabInputError(f"study {name} takes no groups; allowed: none (drop --groups)")
        preset = presets[options.preset]
        extra = TaskOptions.parse(options, name)
        mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
        ivs = select_names(extra.interventions, default_interventions, TASK_INTERVENTIONS, "intervention")
        seeds = options.seeds if options.seeds is not None else preset["seeds"]
        if any(s < 0 for s in seeds):
            raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
        task = LMTaskSpec(kind=kind, **{**preset["task"], **extra.task})
        if kind == "copying":
            if extra.source not in (None, "shakespeare"):
                raise DynlabInputError(f"study {name} uses no filler text; allowed: no --source")
            data = LMDataSpec()
        else:
            need = max(task.train_max, *task.eval_lengths) + 1
            data = check_source(extra.source or "shakespeare", LMDataSpec().val_fraction, need)
        train = TaskTrainSpec(**{**preset["train"], **extra.train})
        evals = TaskEvalSpec(**{**preset["eval"], **extra.eval})
        iv_kw = {**preset["intervention"], **extra.intervention}
        return [
            LMTaskRunSpec(data=data, model=LMModelSpec(mixer=m, **{**preset["model"], **extra.model}),
                          intervention=InterventionSpec(kind=iv, **iv_kw), task=task, train=train, eval=evals, seed=s)
            for m in mixers
            for iv in ivs
            for s in seeds
        ]

    def run_one(spec: LMTaskRunSpec, device: torch.device, progress: NullProgress) -> RunOutcome:
        bar = progress.add(f"{spec.model.mixer}/{spec.intervention.kind}/seed {spec.seed}", spec.train.steps)

        def step(i: int, loss: float) -> None:
            progress.update(bar, 1, loss=loss)

        result, weights = train_and_evaluate_task(spec, device, step)
        progress.remove(bar)
        return RunOutcome(TaskResult.model_validate(result), weights)

    def per_run(spec: LMTaskRunSpec, r: TaskResult) -> xr.Dataset | None:
        return task_result_to_dataset(r.to_json(), kind) if r.status == "ok" else None

    def assemble(specs: list[LMTaskRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
        """Accuracies of the ``ok`` runs stacked on ``run`` (NaN for the others), the run
        record (status, reason, train_loss, train_time) and the spec coordinates."""
        results = [read_result(TaskResult, store, s) for s in specs]
        return assemble_runs(specs, results, per_run, coords={
            "arch": lambda s: s.model.mixer,
            "intervention": lambda s: s.intervention.kind,
            "seed": lambda s: s.seed,
            "train_min": lambda s: s.task.train_min,
            "train_max": lambda s: s.task.train_max,
        })

    return Study(name=name, description=description, presets=tuple(presets), make_specs=make_specs,
                 run_one=run_one, assemble=assemble, spec_type=LMTaskRunSpec, result_type=TaskResult,
                 options_type=TaskOptions, panels=_task_panels(kind))


def _task_panels(kind: str):
    """The figures of the study of task ``kind`` (:mod:`dynlab.figures.tasks`; matplotlib loads on first use)."""

    def panels(ds: xr.Dataset) -> dict:
        from dynlab.figures import tasks

        return {"copying": tasks.copying_panels, "passkey": tasks.passkey_panels, "babi": tasks.babilong_panels}[kind](ds)

    return panels
