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
from typing import Any

import numpy as np
import torch
import xarray as xr

from dynlab.errors import DynlabInputError
from dynlab.lm.run import corpus_for
from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMModelSpec, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec, TaskTrainSpec
from dynlab.lm.task_run import task_result_to_dataset, train_and_evaluate_task
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, Study, StudyOptions, select_names
from dynlab.train.progress import NullProgress

__all__ = ["MIXER_NAMES", "TASK_INTERVENTIONS", "make_task_study", "check_source"]

MIXER_NAMES = ("mamba2", "mamba1", "gla")
TASK_INTERVENTIONS = ("zero", "random-noise", "fitted-noise", "state-passing")


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
        extra = dict(options.extra)
        allowed_extra = {"interventions", "source", "model", "train", "eval", "intervention", "task"}
        unknown = set(extra) - allowed_extra
        if unknown:
            raise ValueError(f"unknown extra option(s) {sorted(unknown)}; allowed: {', '.join(sorted(allowed_extra))}")
        mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
        ivs = select_names(tuple(extra["interventions"]) if "interventions" in extra else None,
                      default_interventions, TASK_INTERVENTIONS, "intervention")
        seeds = options.seeds if options.seeds is not None else preset["seeds"]
        if any(s < 0 for s in seeds):
            raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
        task = LMTaskSpec(kind=kind, **{**preset["task"], **extra.get("task", {})})
        if kind == "copying":
            if extra.get("source") not in (None, "shakespeare"):
                raise DynlabInputError(f"study {name} uses no filler text; allowed: no --source")
            data = LMDataSpec()
        else:
            need = max(task.train_max, *task.eval_lengths) + 1
            data = check_source(str(extra.get("source", "shakespeare")), LMDataSpec().val_fraction, need)
        train = TaskTrainSpec(**{**preset["train"], **extra.get("train", {})})
        evals = TaskEvalSpec(**{**preset["eval"], **extra.get("eval", {})})
        iv_kw = {**preset["intervention"], **extra.get("intervention", {})}
        return [
            LMTaskRunSpec(data=data, model=LMModelSpec(mixer=m, **{**preset["model"], **extra.get("model", {})}),
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
        return RunOutcome(result, weights)

    def assemble(specs: list[LMTaskRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
        parts, status, reason, loss, wall = [], [], [], [], []
        for spec in specs:
            r = store.load_result(spec)
            status.append(r["status"])
            reason.append(r.get("reason", ""))
            loss.append(r.get("train_loss", np.nan))
            wall.append(r.get("train_time", np.nan))
            if r["status"] == "ok":
                parts.append(task_result_to_dataset(r, kind))
            else:
                nan = {k: np.full(len(spec.task.eval_lengths), np.nan) for k in ("accuracy", "token_accuracy", "exact_match")}
                parts.append(xr.Dataset({k: ("length", v) for k, v in nan.items()},
                                        coords={"length": list(spec.task.eval_lengths)}))
        ds = xr.concat(parts, dim="run", join="outer", fill_value=np.nan)
        ds["status"] = ("run", np.array(status, dtype=str))
        ds["reason"] = ("run", np.array(reason, dtype=str))
        ds["train_loss"] = ("run", np.asarray(loss, dtype=float))
        ds["train_time"] = ("run", np.asarray(wall, dtype=float))
        ds = ds.assign_coords(
            run=np.arange(len(specs)),
            run_id=("run", np.array([s.spec_hash() for s in specs], dtype=str)),
            arch=("run", np.array([s.model.mixer for s in specs], dtype=str)),
            intervention=("run", np.array([s.intervention.kind for s in specs], dtype=str)),
            seed=("run", np.array([s.seed for s in specs])),
            train_min=("run", np.array([s.task.train_min for s in specs])),
            train_max=("run", np.array([s.task.train_max for s in specs])),
        )
        return ds

    return Study(name=name, description=description, presets=tuple(presets), make_specs=make_specs,
                 run_one=run_one, assemble=assemble, spec_type=LMTaskRunSpec)
