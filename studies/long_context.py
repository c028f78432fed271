"""Shared machinery of the long-context task studies ``copying``, ``passkey`` and ``babilong`` (paper B).

Each study follows paper B's protocol with byte-level recurrent LMs (the mixers,
interventions, engine and run store of ``length-generalization``): a model trains on one
task of :mod:`dynlab.lm.data.tasks` at short lengths from the zero state; if it learned (its
in-range accuracy reaches ``eval.learned_at``, see :mod:`dynlab.lm.run.task`), it is
post-trained once per intervention from those weights, ``zero`` being the
compute-matched control; every model is tested from the zero state at longer lengths.
One stored run is one (mixer, seed): the trained model and all its arms.

The dataset has one row on ``run`` per tested model: the trained model (``phase`` =
``"base"``, ``intervention`` = its training intervention) and each arm (``phase`` =
``"post"``). It holds

- ``accuracy(run, length[, depth | kind])`` — the task's headline accuracy (per-character
  for copying, whole key for passkey, whole answer for babi; see :mod:`dynlab.lm.run.task`),
- ``token_accuracy`` and ``exact_match`` on the same dims,
- ``train_loss_curve(run, loss_point)`` (steps ``train_step``) and ``converged(run)``
  (:func:`dynlab.training.converged`), where the results hold them;
- ``train_loss(run)``, ``train_time(run)``, ``status(run)``, and ``in_range_accuracy(run)``
  and ``train_attempts(run)`` (of the trained model, on every row of its run; the latter
  NaN without ``train.attempts``),
- ``arm_in_range_accuracy(run)``, every tested model's own in-range accuracy, and
  ``damaged(run)``: 1 for a post-training arm whose in-range accuracy fell below
  ``learned_at`` (the arm's far accuracy then says little about length), 0 otherwise,
- babi: ``chance(kind)``, the score of always giving the kind's most common answer,
- the paired contrasts of each arm against the control over seeds
  (:func:`dynlab.analysis.contrasts.paired_contrasts`): ``contrast_mean``,
  ``contrast_lo``, ``contrast_hi``, ``contrast_p`` on ``(mixer, contrast, length[, depth |
  kind])`` and ``contrast_n`` (``mixer``: the runs' ``arch``),

with coords ``arch`` (mixer), ``intervention``, ``phase``, ``seed``, ``run_id`` (the
stored run), ``train_min``, ``train_max`` on ``run``.  A row whose status is not ``ok``
is in no contrast; a ``diverged`` row has NaN accuracies, a ``not-learned`` trained
model keeps its measured ones. Attribute ``learned_at``: the in-range accuracy a trained
model needed to count as learned.

Selections: ``models`` = mixers (``all`` = the preset's; or any of mamba2, mamba1, gla);
``seeds``; ``extra`` may hold ``interventions`` (the post-training arms: zero,
random-noise, fitted-noise, state-passing; ``zero`` is always added as the control; TBTT
needs one long document and does not apply to independent samples), ``source`` (filler
text: ``shakespeare`` or a UTF-8 file; passkey and babilong only) and ``model`` /
``train`` / ``eval`` / ``intervention`` / ``task`` / ``post`` field overrides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import torch
import xarray as xr
from pydantic import AfterValidator

import numpy as np

from dynlab.analysis.contrasts import paired_contrasts
from dynlab.errors import DynlabInputError
from dynlab.lm.results import TaskResult
from dynlab.lm.run.text import check_source
from dynlab.lm.spec import (
    InterventionSpec, LMDataSpec, LMModelSpec, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec, TaskPostSpec, TaskTrainSpec,
    WarmStartSpec, anchor_model_fields,
)
from dynlab.lm.run.task import POST_PREFIX, in_range_accuracy, task_result_to_dataset, train_and_evaluate_task
from dynlab.lm.data.babi import babi_chance
from dynlab.names import MIXER_NAMES, TASK_INTERVENTION_NAMES
from dynlab.results.assemble import result_columns, stack_runs, training_curves
from dynlab.results.store import RunStore
from dynlab.results.vocabulary import annotate
from dynlab.runner.protocol import RunOutcome, Study, StudyExtra, StudyOptions, override_field, read_result, select_names
from dynlab.runtime import NullProgress

__all__ = ["MIXER_NAMES", "TASK_INTERVENTIONS", "LMOptions", "TaskOptions", "assemble_task_runs", "make_task_study"]

TASK_INTERVENTIONS = TASK_INTERVENTION_NAMES


class LMOptions(StudyExtra):
    """Options every LM study takes (``StudyOptions.extra``).

    Attributes:
        interventions: initial-state interventions to train (default: the study's).
        source: the text: ``shakespeare`` (default), a UTF-8 file or a token folder.
        tokenizer: ``byte`` or a Hugging Face tokenizer for a text source (a token folder
            brings its own): the models' vocabulary holds its ids, the task samples are
            built through it (:mod:`dynlab.lm.data.tasks`).
        model: overrides of the preset's :class:`~dynlab.lm.spec.LMModelSpec` fields (not ``mixer``).
        intervention: overrides of the preset's :class:`~dynlab.lm.spec.InterventionSpec` fields (not ``kind``).
    """

    #: the study commands' options (the task's fields, ``extra["task"]``, among them)
    option_words: ClassVar[Mapping[str, str]] = {"interventions": "--interventions", "source": "--source",
                                                 "eval_lengths": "--lengths", "depths": "--depths",
                                                 "babi_kinds": "--kinds", "tokenizer": "--tokenizer"}

    interventions: tuple[str, ...] | None = None
    source: str | None = None
    tokenizer: str | None = None
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
    post: Annotated[dict[str, Any], AfterValidator(override_field(TaskPostSpec, "interventions"))] = {}


def _with_enough_facts(task: dict[str, Any], chosen: Mapping[str, Any]) -> dict[str, Any]:
    """``task`` with ``n_facts`` raised to what the chosen ``babi_kinds`` need
    (:data:`dynlab.lm.data.babi.MIN_FACTS`: a qa3 story needs 4 facts) when the kinds were
    chosen (``--kinds``) and the number of facts was not: a preset with 3 facts runs qa3
    with 4."""
    if "babi_kinds" not in chosen or "n_facts" in chosen:
        return task
    from dynlab.lm.data.babi import MIN_FACTS

    need = max((MIN_FACTS.get(k, 1) for k in task["babi_kinds"]), default=1)
    return {**task, "n_facts": max(int(task.get("n_facts", LMTaskSpec.model_fields["n_facts"].default)), need)}


def tokenizer_option(extra: LMOptions) -> Any:
    """The :class:`~dynlab.lm.data.tokenizer.TokenizerSpec` of ``--tokenizer`` (None when not given)."""
    from dynlab.lm.data.tokenizer import load_tokenizer

    return None if extra.tokenizer is None else load_tokenizer(extra.tokenizer).spec()


def as_text(task: LMTaskSpec) -> LMTaskSpec:
    """``task`` read as text through a subword tokenizer: bAbI's word ids
    (``babi_tokens = "words"``) stand in for a subword tokenizer, so with a real one the
    facts and questions are its tokens (``"bytes"``: the text through the tokenizer)."""
    return task.model_copy(update={"babi_tokens": "bytes"}) if task.babi_tokens == "words" else task


def vocab_fields(data: LMDataSpec) -> dict[str, Any]:
    """``LMModelSpec`` fields for the data's tokenizer: its ids as the vocabulary (none for bytes)."""
    return {} if data.tokenizer.kind == "byte" else {"vocab_size": data.tokenizer.n_ids}


def make_task_study(name: str, kind: str, presets: Mapping[str, Mapping[str, Any]],
                    default_interventions: tuple[str, ...]) -> Study:
    """A :class:`Study` for task ``kind`` with ``presets`` (keys: mixers, seeds, model, task, train, eval,
    intervention, post) whose post-training arms default to ``default_interventions`` (plus the ``zero`` control)."""

    def make_specs(options: StudyOptions) -> list[LMTaskRunSpec]:
        if options.preset not in presets:
            raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(presets)}")
        preset = presets[options.preset]
        extra = TaskOptions.parse(options, name)
        mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
        ivs = select_names(extra.interventions, default_interventions, TASK_INTERVENTIONS, "intervention")
        seeds = options.seeds if options.seeds is not None else preset["seeds"]
        if any(s < 0 for s in seeds):
            raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
        tokenizer = tokenizer_option(extra)
        task = LMTaskSpec(kind=kind, **_with_enough_facts({**preset["task"], **extra.task}, extra.task))
        if kind == "copying":
            if extra.source not in (None, "shakespeare"):
                raise DynlabInputError(f"study {name} uses no filler text; allowed: no --source")
            data = LMDataSpec() if tokenizer is None else LMDataSpec(tokenizer=tokenizer)
        else:
            need = {f"the longest test sequence, {max(task.eval_lengths)} tokens (--lengths),":
                    (max(task.eval_lengths) + 1, "shorter --lengths"),
                    f"the longest training sequence, {task.train_max} tokens (task.train_max in --config),":
                    (task.train_max + 1, "a smaller task.train_max")}
            data = check_source(extra.source or "shakespeare", LMDataSpec().val_fraction, need, tokenizer)
        subword = data.tokenizer.kind != "byte"
        if subword and "babi_tokens" not in extra.task:
            task = as_text(task)
        train = TaskTrainSpec(**{**preset["train"], **extra.train})
        evals = TaskEvalSpec(**{**preset["eval"], **extra.eval})
        post = TaskPostSpec(interventions=("zero", *ivs), **{**preset["post"], **extra.post})
        warm = preset.get("warm_start")
        warm_task = None if warm is None else LMTaskSpec(**warm["task"])
        warm_start = None if warm is None else WarmStartSpec(task=as_text(warm_task) if subword else warm_task,
                                                              train=TaskTrainSpec(**warm["train"]))
        base_iv = InterventionSpec(kind="zero", **{**preset["intervention"], **extra.intervention})
        return [
            LMTaskRunSpec(data=data, model=LMModelSpec(**anchor_model_fields(m, **{**preset["model"], **vocab_fields(data),
                                                                                   **extra.model})),
                          intervention=base_iv, task=task, train=train, eval=evals, post=post, warm_start=warm_start,
                          seed=s)
            for m in mixers
            for s in seeds
        ]

    def run_one(spec: LMTaskRunSpec, device: torch.device, progress: NullProgress) -> RunOutcome:
        arms = len(spec.post.interventions) if spec.post is not None else 0
        total = spec.train.steps * spec.train.attempts + arms * (spec.post.steps if spec.post is not None else 0)
        total += spec.warm_start.train.steps if spec.warm_start is not None else 0
        bar = progress.add(f"{spec.model.mixer}/seed {spec.seed}", total)

        def step(i: int, loss: float) -> None:
            progress.update(bar, 1, loss=loss)

        result, weights = train_and_evaluate_task(spec, device, step)
        progress.remove(bar)
        return RunOutcome(TaskResult.model_validate(result), weights)

    def assemble(specs: list[LMTaskRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
        return assemble_task_runs(kind, specs, store)

    def analyze_one(spec: LMTaskRunSpec, store: RunStore, device: torch.device, progress: NullProgress,
                    extra: StudyExtra) -> xr.Dataset:
        return analyze_task_run(kind, spec, store)

    return Study(name=name, presets=tuple(presets), make_specs=make_specs,
                 run_one=run_one, assemble=assemble, spec_type=LMTaskRunSpec, result_type=TaskResult,
                 options_type=TaskOptions, panels=_task_panels(kind),
                 analyze_one=analyze_one if kind in GEOMETRY_KINDS else None)


#: Task kinds whose models' state geometry ``dynlab analyze`` measures (:mod:`dynlab.lm.analysis.state_geometry`).
GEOMETRY_KINDS = ("passkey", "copying", "babi")


def _tested_weights(spec: LMTaskRunSpec, store: RunStore) -> list[tuple[str, dict[str, torch.Tensor] | None]]:
    """``("iv:phase", weights or None)`` of every model a stored run tested, in :func:`_tested_models` order."""
    r = read_result(TaskResult, store, spec)
    weights = store.load_state_dict(spec) if r.evaluated else {}
    out = []
    for iv, phase, res in _tested_models(spec, r):
        prefix = "" if phase == "base" else f"{POST_PREFIX}{iv}."
        w = {k[len(prefix):]: v for k, v in weights.items()
             if (k.startswith(prefix) if prefix else not k.startswith(POST_PREFIX))}
        out.append((f"{iv}:{phase}", w if w and res.evaluated and res.status != "diverged" else None))
    return out


def analyze_task_run(kind: str, spec: LMTaskRunSpec, store: RunStore) -> xr.Dataset:
    """The state geometry of every model a run tested (:func:`dynlab.lm.analysis.state_geometry.geometry_row`,
    on the CPU in float32 for the states, float64 for Jacobians and fixed points): dims
    ``tested`` (attr ``tested``: ``intervention:phase`` of each, in the dataset's row
    order) and ``distance``; a model without usable weights is a NaN row."""
    from dynlab.lm.analysis.state_geometry import geometry_row
    from dynlab.lm.run.text import build_model
    from dynlab.lm.run.task import task_for

    rows, names = [], []
    for name, weights in _tested_weights(spec, store):
        names.append(name)
        if weights is None:
            rows.append(None)
            continue
        model = build_model(spec)
        model.load_state_dict(weights)
        rows.append(geometry_row(model, kind, task_for(spec, "val"), spec.seed))
    template = next((r for r in rows if r is not None), None)
    if template is None:
        return xr.Dataset(attrs={"tested": json.dumps(names)})
    filled = [r if r is not None else xr.full_like(template, np.nan) for r in rows]
    ds = xr.concat(filled, dim="tested")
    ds.attrs = {**template.attrs, "tested": json.dumps(names)}
    return ds


def _geometry_rows(tested: list[tuple[LMTaskRunSpec, str, str, TaskResult]], store: RunStore) -> xr.Dataset | None:
    """The runs' ``analysis.nc`` geometry (:func:`analyze_task_run`) on the dataset's ``run`` rows; None without any."""
    parts, cache = [], {}
    for spec, iv, phase, _ in tested:
        key = spec.run_id
        if key not in cache:
            cache[key] = store.read_dataset(spec, "analysis.nc") if store.has_file(spec, "analysis.nc") else None
        a = cache[key]
        names = json.loads(a.attrs.get("tested", "[]")) if a is not None else []
        hit = f"{iv}:{phase}"
        parts.append(a.isel(tested=names.index(hit)).drop_vars("tested", errors="ignore")
                     if a is not None and hit in names and "tested" in a.dims else None)
    template = next((p for p in parts if p is not None), None)
    if template is None:
        return None
    out = xr.concat([p if p is not None else xr.full_like(template, np.nan) for p in parts], dim="run")
    out.attrs = {"geo_tau": template.attrs.get("geo_tau"), "geo_accuracy_level": template.attrs.get("geo_accuracy_level")}
    return annotate(out)


def _tested_models(spec: LMTaskRunSpec, r: TaskResult) -> list[tuple[str, str, TaskResult]]:
    """``(intervention, phase, result)`` of each model a stored run tested: the trained model,
    then each post-training arm (its result on the trained model's test grid)."""
    out = [(spec.intervention.kind, "base", r)]
    grid = {"lengths": r.lengths, "depths": r.depths, "kinds": r.kinds, "in_range_accuracy": r.in_range_accuracy,
            "train_attempts": r.train_attempts}
    for iv in spec.post.interventions if spec.post is not None else ():
        if iv in (r.post or {}):
            out.append((iv, "post", TaskResult.model_validate({**grid, **r.post[iv]})))
    return out


def assemble_task_runs(kind: str, specs: list[LMTaskRunSpec], store: RunStore) -> xr.Dataset:
    """The dataset of a task study: one row per tested model (module docstring), then the paired contrasts."""
    tested = [(spec, iv, phase, res) for spec in specs
              for iv, phase, res in _tested_models(spec, read_result(TaskResult, store, spec))]
    results = [t[3] for t in tested]
    rows = [task_result_to_dataset(res.to_json(), kind) if res.evaluated and res.accuracy is not None else None
            for res in results]
    ds = stack_runs(rows)
    if ds is None:  # nothing evaluated: the run record only
        ds = xr.Dataset()
    ds = ds.assign_coords(run=np.arange(len(tested)))
    ds = ds.assign(result_columns(results, ("status", "reason", "train_loss", "train_time", "in_range_accuracy",
                                            "train_attempts")))
    ds = ds.merge(training_curves(results))
    ds = ds.assign_coords({
        "run_id": ("run", [t[0].run_id for t in tested]), "arch": ("run", [t[0].model.mixer for t in tested]),
        "intervention": ("run", [t[1] for t in tested]), "phase": ("run", [t[2] for t in tested]),
        "seed": ("run", [t[0].seed for t in tested]), "train_min": ("run", [t[0].task.train_min for t in tested]),
        "train_max": ("run", [t[0].task.train_max for t in tested]),
    })
    ds = ds.assign(_in_range_rows(tested))
    geo = _geometry_rows(tested, store)
    if geo is not None:
        ds = ds.merge(geo.assign_coords(run=ds["run"].values), combine_attrs="drop_conflicts")
        ds.attrs.update(geo.attrs)
    if kind == "babi" and "kind" in ds.coords and specs:
        ds = ds.assign(chance=babi_chance_levels(ds["kind"].values, specs[0].task.n_facts))
    if "accuracy" in ds and (ds["phase"] == "post").any():
        ds = ds.merge(paired_contrasts(ds, "accuracy"))
    ds.attrs["learned_at"] = float(specs[0].eval.learned_at) if specs else float("nan")
    if specs and "length" in ds.coords:  # what one token of the length axis is
        tokenizer = specs[0].data.tokenizer
        token = "one byte (UTF-8)" if tokenizer.kind == "byte" else f"one token of the tokenizer {tokenizer.label}"
        if kind == "babi" and specs[0].task.babi_tokens == "words":
            token = "one bAbI word (ids 128 + its index in dynlab.lm.data.babi.BABI_WORDS) or one filler byte"
        ds.attrs["tokenizer"] = tokenizer.label
        ds["length"].attrs["token"] = ("copying: a length counts the string's letters; the sample's tokens are "
                                       f"{token}" if kind == "copying" else token)
    return ds


def _in_range_rows(tested: list[tuple[LMTaskRunSpec, str, str, TaskResult]]) -> dict[str, xr.DataArray]:
    """``arm_in_range_accuracy(run)``: each tested model's own in-range accuracy
    (:func:`dynlab.lm.run.task.in_range_accuracy`; for the trained model its
    ``in_range_accuracy``), and ``damaged(run)``: 1 for a post-training arm of a learned
    model whose in-range accuracy fell below ``eval.learned_at``, 0 for one that kept it,
    NaN for trained models and untested arms."""
    own, damaged = [], []
    for spec, _, phase, res in tested:
        score = (in_range_accuracy({"accuracy": res.accuracy, "lengths": res.lengths, "kinds": res.kinds}, spec)
                 if res.accuracy is not None and res.lengths else np.nan)
        own.append(score)
        damaged.append(float(score < spec.eval.learned_at) if phase == "post" and np.isfinite(score) else np.nan)
    return annotate(xr.Dataset({"arm_in_range_accuracy": ("run", np.array(own, dtype=float)),
                                "damaged": ("run", np.array(damaged, dtype=float))})).data_vars


def babi_chance_levels(kinds: Any, n_facts: int) -> xr.DataArray:
    """``chance(kind)``: the score of always giving a kind's most common answer in stories of
    ``n_facts`` facts (:func:`dynlab.lm.data.babi.babi_chance`), annotated."""
    kinds = [str(k) for k in kinds]
    da = xr.DataArray(np.array([babi_chance(k, n_facts) for k in kinds]), dims=("kind",), coords={"kind": kinds})
    return annotate(xr.Dataset({"chance": da}))["chance"]


def _task_panels(kind: str):
    """The figures of the study of task ``kind`` (:mod:`dynlab.lm.figures.tasks`; matplotlib loads on first use)."""

    def panels(ds: xr.Dataset) -> dict:
        from dynlab.lm.figures import tasks

        return {"copying": tasks.copying_panels, "passkey": tasks.passkey_panels, "babi": tasks.babilong_panels}[kind](ds)

    return panels
