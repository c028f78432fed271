"""Study ``length-generalization`` (paper B): recurrent LMs trained short, evaluated long.

Every selected mixer is trained on byte-level Shakespeare (the plays shipped with dynlab) at a short
context T_train with each initial-state intervention (zero baseline, random noise, fitted
noise, state passing, TBTT) and evaluated from the zero state at 16 × T_train. The dataset
holds each quantity on its own positions: ``ppl(run, t)``, ``ppl_binned(run, t_bin)`` (bins
``t_bin_start … t_bin``), ``effrem(run, t_effrem)`` (total variation; also ``effrem_js``,
``effrem_cos``), ``state_mean/state_std/state_norm(run, layer, head, t_state)``, the
training-loss curve ``train_loss_curve(run, loss_point)`` (steps ``train_step``) with
``converged(run)`` (:func:`dynlab.training.converged`),
the Definition 3.2 verdict ``lg_passed(run)``, ``lg_worst_violation(run)`` …, and the
in-range and far PPL ``ppl_in``, ``ppl_far``, ``far_in_ratio`` (run)
(:func:`dynlab.lm.analysis.metrics.ppl_ranges`), with coords ``arch`` (mixer),
``intervention``, ``train_length``, ``n_params`` and ``d_model`` on ``run``. Every
preset's Mamba models have the real Mamba block (no MLP,
:data:`dynlab.lm.spec.ANCHOR_MLP_RATIO`), so each trained run exports to Hugging Face.

Presets:
- ``smoke`` — checks an installation in seconds: one layer of width 16 (``SMOKE_MODEL``),
  T_train = 16, batch 8, 200 steps, the zero baseline and state passing, evaluated at
  256 tokens on 8 windows. Its numbers say nothing about length generalization.
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 32 channels, N = 64, short
  convolution of width 4, initial step sizes log-uniform in [1e-5, 1e-3], i.e.
  near-integrator heads), T_train = 32, batch 16, 1500 steps of AdamW 5e-3, one CPU
  thread; evaluation at 512 tokens (16 × T_train) on 128 windows, state statistics at 48
  log-spaced positions from t = 1.
- ``budget`` — paper B's Fig. 3 at CPU scale: one model per seed trained to 32 × its
  Chinchilla budget (20 tokens per parameter, every parameter counted) and evaluated at
  16 × T_train from checkpoints at 0.5, 1, 2, 4, 8, 16 and 32 × inside the one run
  (``eval.checkpoints``). The dataset gains the dim ``budget`` (coords ``tokens_per_param``
  and ``checkpoint_step``) on every curve and on ``ppl_in``, ``ppl_far`` and
  ``far_in_ratio``, and ``first_rise_budget(run)``. See ``BUDGET_MODEL`` for the size.
- ``context`` — paper B's Fig. 2 at CPU scale: T_train ∈ {16, 32, 64, 128} at two model
  sizes (``CONTEXT_SIZES``), every run trained on the same number of tokens
  (``CONTEXT_TOKENS``), evaluated at 16 × T_train.
- ``size`` — paper B's Figs. 2-3 together: 4 widths (``SIZE_LADDER``) x T_train 32
  and 128 x seeds 0-2, each trained as one stack of its seeds (``train.engine = "stack"``)
  to its largest budget with in-run checkpoints, and trained alone to two budgets
  (coordinate ``annealed``); ``far_over_in`` and ``budget_blocks`` beside the budget.
  ``dynlab report`` prints the map (:func:`dynlab.lm.report.tables.size_tables`).
- ``size-annealed`` — the ``size`` map's rises judged on annealed runs: each width, T_train
  and budget where most seeds rose at an in-run checkpoint and ``size`` trains no annealed
  run (``SIZE_ANNEALED``), trained alone to that budget on seeds 0-2, the recipe
  unchanged (the specs, and so the run ids, are those ``size`` would make).
- ``state`` — where small LMs learn to forget (Stuffed Mamba's forget threshold): one width
  with the recurrent state size varied 64× (``STATE_SIZES``) × T_train 16–512
  (``STATE_SEQ_LENS``) × seeds 0–2, every run trained on the same 8M tokens
  (``STATE_TOKENS``, 2 048 a step) as one annealed run, the seeds of a cell as one
  stack; coords ``d_state`` and ``state_size`` on ``run``, and each run's forgetting
  (``forget_rate``, ``memory_horizon``: :mod:`dynlab.lm.analysis.contraction`); ``dynlab report``
  reads it with :mod:`dynlab.lm.report.forget`.
- ``size-interventions`` — the ``interventions`` protocol, recipe unchanged, on fresh
  seeds (``SIZE_INTERVENTION_SEEDS``) where the size map rises in every seed.
- ``interventions`` — paper B's Fig. 5 protocol where the PPL rises: the baseline (zero
  initial state) is trained as ``quick``, whose PPL rises beyond T_train, on seeds 5–9
  (``INTERVENTION_SEEDS``; ``model={"conv_kernel": 0}`` runs the protocol from the
  quick model without its convolution; see docs/length-generalization.md),
  then post-trained from its trained weights once per intervention for
  ``post.steps`` steps against a zero-state control on the same batches
  (:class:`~dynlab.lm.spec.LMPostSpec`). Rows: the trained model (``phase = "base"``)
  and each arm (``phase = "post"``); the paired contrasts of ``ppl_far`` and ``ppl_in``
  (arm − control, over seeds) are ``far_contrast_*`` and ``in_contrast_*``. Here
  ``interventions`` names the arms (the control is always added), as in the task studies.
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, T_train = 256, batch 32, 20 000
  steps; evaluation at 4096 tokens on 256 windows (a GPU box).
- ``pretrained`` — paper B's Fig. 5 protocol on a pretrained checkpoint (``checkpoint``, the
  command's ``--checkpoint``: a Hugging Face Mamba / Mamba-2 folder or a dynlab LM run),
  read with its own tokenizer (:func:`dynlab.lm.hub.checkpoint.checkpoint_tokenizer`) on
  ``--source`` (a token folder of that tokenizer, or a text): the untouched checkpoint
  (``phase = "base"``) and, from it, one post-training per intervention and a zero-state
  control on the same batches (``phase = "post"``), per seed (a seed is a data order).
  Paper B's recipe (``PRESETS["pretrained"]``): T_train 2048, 100 steps, AdamW β 0.9/0.95,
  clipping 1.0, cosine decay after a 10 % warm-up, a batch of 2^19 tokens (8 sequences a
  micro-batch, 32 micro-batches a step: ``train.accum``), the learning rate the user gives
  (``--lr``, required: paper B uses a tenth of the checkpoint's peak pretraining rate),
  evaluation to 16 × T_train (32K tokens). The dataset and its contrasts are those of
  ``interventions``; the arms' weights are not stored (``dynlab lm post-train`` keeps
  one arm's). A GPU's work at paper B's sizes; on the CPU through the knobs, e.g.
  ``--seq-len 32 --batch-size 4 --steps 20`` on a tiny model.

State statistics (``state_mean/std/norm``) are recorded from t = 1, so positions inside
and beyond T_train can be compared: the baseline's near-integrator heads keep summing
beyond T_train, so its state std grows with t, while state passing trains the model on
states of any age. ``dynlab report`` prints the far/in PPL ratio and the Definition 3.2
verdicts of a dataset; docs/results.md holds the measured ones.

Selections: ``models`` = mixers (``all`` = the preset's, or a subset of mamba2, mamba1, gla);
``seeds``; ``extra`` may hold ``interventions`` (names), ``source`` (a text file), and
``model`` / ``train`` / ``eval`` / ``intervention`` / ``post`` field overrides.

The names in capitals above (the layouts, budgets and seeds) and :data:`PRESETS`, made of
them, are in :mod:`dynlab.studies.length_generalization_presets`; the dataset is assembled in
:func:`dynlab.lm.dataset.assemble_lm_runs`.
"""

from __future__ import annotations

import math
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

import numpy as np
import torch
import xarray as xr
from pydantic import AfterValidator

from dynlab.errors import DynlabInputError
from dynlab.lm.dataset import assemble_lm_runs
from dynlab.lm.results import LMResult
from dynlab.lm.run.text import (
    build_model, check_source, checkpoint_steps, count_parameters, stack_key, text_needs, train_and_evaluate,
    train_and_evaluate_many,
)
from dynlab.names import INTERVENTION_NAMES, MIXER_NAMES
from dynlab.lm.spec import (
    CHINCHILLA_TOKENS_PER_PARAM, InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMPostSpec, LMRunSpec, LMTrainSpec,
    anchor_model_fields,
)
from dynlab.results.store import RunStore
from dynlab.runner.protocol import RunOutcome, Stacking, Study, StudyOptions, override_field, read_result, select_names
from dynlab.studies.length_generalization_presets import PRESETS, STACK_MAX
from dynlab.studies.long_context import LMOptions, tokenizer_option, vocab_fields
from dynlab.runtime import NullProgress

__all__ = ["INTERVENTION_NAMES", "MIXER_NAMES", "PRESETS", "STUDY", "LGOptions", "assemble", "make_specs", "run_one",
           "steps_for_budget"]


class LGOptions(LMOptions):
    """Options of length-generalization: :class:`~dynlab.studies.long_context.LMOptions`
    (``interventions``, ``source``, ``model``, ``intervention``), overrides of the
    preset's :class:`~dynlab.lm.spec.LMTrainSpec` (``train``),
    :class:`~dynlab.lm.spec.LMEvalSpec` (``eval``) and
    :class:`~dynlab.lm.spec.LMPostSpec` (``post``, presets with post-training arms) fields,
    and ``checkpoint`` (the ``pretrained`` preset's model folder)."""

    option_words: ClassVar[Mapping[str, str]] = {**LMOptions.option_words, "checkpoint": "--checkpoint"}

    checkpoint: str | None = None
    train: Annotated[dict[str, Any], AfterValidator(override_field(LMTrainSpec))] = {}
    eval: Annotated[dict[str, Any], AfterValidator(override_field(LMEvalSpec))] = {}
    post: Annotated[dict[str, Any], AfterValidator(override_field(LMPostSpec))] = {}


def steps_for_budget(model: LMModelSpec, chinchilla: float, batch_size: int, seq_len: int) -> int:
    """Steps that bring ``model`` to ``chinchilla`` × its Chinchilla budget at ``batch_size × seq_len`` tokens a step."""
    n = count_parameters(build_model(LMRunSpec(model=model)))  # the parameters do not depend on the training
    return max(1, math.ceil(chinchilla * CHINCHILLA_TOKENS_PER_PARAM * n / (batch_size * seq_len)))


def make_specs(options: StudyOptions) -> list[LMRunSpec]:
    """One :class:`LMRunSpec` per (mixer, intervention, size, training length, seed) of the selection."""
    if options.preset not in PRESETS:
        raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(PRESETS)}")
    preset = PRESETS[options.preset]
    extra = LGOptions.parse(options, "length-generalization")
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
    if preset.get("pretrained") or extra.checkpoint is not None:
        return pretrained_specs(options, preset, extra, seeds)
    mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
    interventions = select_names(extra.interventions, preset.get("interventions", INTERVENTION_NAMES),
                                 INTERVENTION_NAMES, "intervention")
    post_kw = dict(preset.get("post", {}))
    if "post" in preset:  # --interventions names the post-training arms (as in the task studies); the base is zero
        if extra.interventions is not None:
            post_kw["interventions"] = interventions
        interventions = ("zero",)
    if extra.post and "post" not in preset:
        raise DynlabInputError(f"preset {options.preset!r} has no post-training arms; allowed: post overrides with "
                               f"the presets {', '.join(n for n, p in PRESETS.items() if 'post' in p)}")
    sizes = preset.get("sizes", ({},))
    # the preset's training lengths, unless the user sets one (train.seq_len)
    seq_lens = (None,) if "seq_len" in extra.train else preset.get("seq_lens", (None,))
    evals = LMEvalSpec(**{**preset["eval"], **extra.eval})
    post = LMPostSpec(**{**post_kw, **extra.post}) if "post" in preset else None
    iv_kw = {**preset["intervention"], **extra.intervention}
    longest = max(extra.train.get("seq_len", preset["train"].get("seq_len", 0)), *(x or 0 for x in seq_lens))
    batch = extra.train.get("batch_size", preset["train"]["batch_size"])
    # the text is loaded (and its length checked) here, so a bad source writes nothing
    data = check_source(extra.source or "shakespeare", LMDataSpec().val_fraction,
                        text_needs(batch, longest, evals.length_multiple), tokenizer_option(extra))
    vocab = vocab_fields(data)
    specs = []
    for m in mixers:
        for size in sizes:
            size = dict(size)
            chinchilla = size.pop("chinchilla", preset.get("chinchilla"))
            checkpoints = size.pop("checkpoints", None)
            annealed = _annealed_runs(size, seq_lens, options.preset, extra)
            inrun = size.pop("inrun", True)
            model = LMModelSpec(**anchor_model_fields(m, **{**preset["model"], **size, **vocab, **extra.model}))
            ev = evals if checkpoints is None or "checkpoints" in extra.eval else evals.model_copy(
                update={"checkpoints": checkpoints})
            runs = [(seq_len, chinchilla, ev) for seq_len in seq_lens] if inrun else []
            # the budgets trained as separate, annealed runs: one checkpoint, at the run's end
            runs += [(length, b, evals.model_copy(update={"checkpoints": (b,)})) for length, b in annealed]
            for seq_len, budget, run_eval in runs:
                train_kw = _train_fields(preset, extra, model, seq_len, budget)
                if len(run_eval.checkpoints) == 1 and "steps" not in extra.train:  # annealed: ends exactly at its budget
                    n = count_parameters(build_model(LMRunSpec(model=model)))
                    train_kw["steps"] = checkpoint_steps(n, run_eval.checkpoints,
                                                         train_kw["batch_size"] * train_kw.get("accum", 1),
                                                         train_kw["seq_len"], 10**9)[0]
                train = LMTrainSpec(**train_kw)
                specs += [LMRunSpec(data=data, model=model, intervention=InterventionSpec(kind=iv, **iv_kw),
                                    train=train, eval=run_eval, seed=s, post=post)
                          for iv in interventions for s in seeds]
    return specs


def pretrained_specs(options: StudyOptions, preset: dict, extra: LGOptions, seeds: tuple[int, ...]) -> list[LMRunSpec]:
    """The ``pretrained`` preset's runs: one per seed, each starting from the checkpoint
    (:class:`~dynlab.lm.spec.LMInitSpec`), evaluated as it is and post-trained per
    intervention against the zero-state control (``post``).

    The checkpoint is not trained again, so the training fields that would schedule that
    training set the post-training's instead: ``--steps`` (``train.steps``) its steps,
    ``--lr`` (``train.lr``, required) its rate, ``train.warmup_frac`` its warm-up; each
    wins over the same field under ``post``, and the spec's ``train`` records the rate and
    warm-up the arms used. ``batch_size``, ``accum``, ``seq_len``, ``weight_decay`` and
    ``clip`` are the arms' batches and optimiser; the stack engine is refused (a stack
    trains a base model)."""
    from dynlab.lm.hub.checkpoint import (
        checkpoint_config, checkpoint_digest, checkpoint_model_fields, checkpoint_tokenizer, load_checkpoint,
    )
    from dynlab.lm.spec import LMInitSpec

    _refuse_pretrained_options(options, preset, extra)
    path = Path(str(extra.checkpoint)).expanduser()
    model, meta = load_checkpoint(path)  # one line when it is not a model
    tokenizer = checkpoint_tokenizer(meta, model, tokenizer_option(extra), path)
    arms = select_names(extra.interventions, preset["post"]["interventions"], INTERVENTION_NAMES, "intervention")
    schedule = {k: extra.train.get(k, extra.post.get(k, preset["post"].get(k))) for k in ("steps", "lr", "warmup_frac")}
    post = LMPostSpec(**{**preset["post"], **extra.post, **schedule, "interventions": arms})
    train_kw = {**preset["train"], **extra.train, "steps": 1, "lr": post.lr, "warmup_frac": post.warmup_frac}
    evals = LMEvalSpec(**{**preset["eval"], **{"chunk_len": min(preset["eval"]["chunk_len"], train_kw["seq_len"]),
                                               "bin_width": min(preset["eval"]["bin_width"], train_kw["seq_len"])},
                          **extra.eval})
    need = text_needs(train_kw["batch_size"], train_kw["seq_len"], evals.length_multiple)
    data = check_source(extra.source or "shakespeare", LMDataSpec().val_fraction, need, tokenizer)
    init = LMInitSpec(checkpoint=str(path.resolve()), sha256=checkpoint_digest(path), config=checkpoint_config(meta))
    iv_kw = {**preset["intervention"], **extra.intervention}
    return [LMRunSpec(data=data, model=LMModelSpec(**checkpoint_model_fields(model, meta)),
                      intervention=InterventionSpec(kind="zero", **iv_kw), train=LMTrainSpec(**train_kw), eval=evals,
                      seed=s, post=post, init=init) for s in seeds]


def _refuse_pretrained_options(options: StudyOptions, preset: dict, extra: LGOptions) -> None:
    """One line for what the ``pretrained`` preset cannot take: a checkpoint with another
    preset, no checkpoint, no ``--lr``, model overrides or ``--models`` (the checkpoint is
    the model), the stack engine."""
    if not preset.get("pretrained"):
        raise DynlabInputError(f"--checkpoint is an option of the preset 'pretrained', not {options.preset!r}; "
                               "allowed: --preset pretrained --checkpoint DIR")
    if extra.checkpoint is None:
        raise DynlabInputError("preset 'pretrained' needs --checkpoint DIR (a Hugging Face Mamba/Mamba2 folder or a "
                               "dynlab LM run folder)")
    if "lr" not in extra.train and "lr" not in extra.post:
        raise DynlabInputError("preset 'pretrained' needs --lr, the post-training's peak learning rate; allowed: a "
                               "number above 0 (paper B uses a tenth of the checkpoint's peak pretraining rate)")
    if extra.model:
        raise DynlabInputError(f"preset 'pretrained' takes its model from --checkpoint; allowed: no model overrides "
                               f"(got {', '.join(sorted(extra.model))})")
    if options.models and tuple(options.models) != ("all",):
        raise DynlabInputError(f"preset 'pretrained' takes its model from --checkpoint; allowed: no --models (got "
                               f"{','.join(options.models)})")
    if extra.train.get("engine", "loop") != "loop":
        raise DynlabInputError("preset 'pretrained' post-trains one checkpoint at a time; allowed: train.engine = "
                               "'loop' (a stack trains base models)")


def _annealed_runs(size: dict, seq_lens: tuple, preset: str, extra: LGOptions) -> list[tuple[int | None, float]]:
    """``(T_train, budget)`` of the separate, annealed runs a size of a preset asks for (and
    removes its keys from ``size``): ``annealed`` budgets at the first training length, and
    ``annealed_at``, ``((T_train, budgets), ...)``, at the lengths it names.  None under an
    ``eval.checkpoints`` override (its runs are the in-run ones); a preset made only of
    annealed runs (``inrun: False``) refuses that override, and ``train.seq_len`` when it
    names its lengths, in one line."""
    runs = [(seq_lens[0], float(b)) for b in size.pop("annealed", ())]
    at = size.pop("annealed_at", ())
    runs += [(int(length), float(b)) for length, budgets in at for b in budgets]
    only = size.get("inrun", True) is False
    for key, field, given in (("eval.checkpoints", "checkpoints", extra.eval), ("train.seq_len", "seq_len", extra.train)):
        if field in given and only and (field == "checkpoints" or at):
            raise DynlabInputError(f"preset {preset!r} trains each run alone to the budget and T_train it names, so "
                                   f"{key} cannot be set; allowed: leave {key} out, or preset 'size'")
    return [] if "checkpoints" in extra.eval else runs


def _train_fields(preset: dict, extra: LGOptions, model: LMModelSpec, seq_len: int | None,
                  chinchilla: float | None) -> dict[str, Any]:
    """A run's training fields: the preset's, its training length, the batch of the
    preset's tokens per step, the steps of its budget (``chinchilla`` multiples, or the
    preset's ``tokens``), then the user's overrides."""
    kw = {**preset["train"], **({"seq_len": seq_len} if seq_len is not None else {})}
    if "tokens_per_step" in preset and seq_len is not None:
        kw["batch_size"] = max(1, preset["tokens_per_step"] // seq_len)
    kw.update(extra.train)
    if "steps" not in kw:
        sequences = kw["batch_size"] * kw.get("accum", 1)  # a step's sequences: accum micro-batches
        if chinchilla is not None:
            kw["steps"] = steps_for_budget(model, chinchilla, sequences, kw["seq_len"])
        else:
            kw["steps"] = max(1, preset["tokens"] // (sequences * kw["seq_len"]))
    return kw


def run_one(spec: LMRunSpec, device: torch.device, progress: NullProgress,
            resume_dir: Path | None = None) -> RunOutcome:
    """Train one LM with its intervention (and its post-training arms) and evaluate it from the zero state;
    a ``stack`` run as a stack of one (:func:`run_many`, resumable from ``resume_dir``)."""
    total = spec.train.steps + (spec.post.steps * len(spec.post.interventions) if spec.post is not None else 0)
    bar = progress.add(f"{spec.model.mixer}/{spec.intervention.kind}", total)

    def step(i: int, loss: float) -> None:
        progress.update(bar, 1, loss=loss)

    if spec.train.engine == "stack":  # a stack of one: the same numbers as in any stack
        progress.remove(bar)
        return run_many([spec], device, progress, resume_dir=resume_dir)[0]
    result, weights = train_and_evaluate(spec, device, step)
    progress.remove(bar)
    return RunOutcome(LMResult.model_validate(result), weights)


def run_many(specs: list[LMRunSpec], device: torch.device, progress: NullProgress,
             resume_dir: Path | None = None) -> list[RunOutcome]:
    """Train specs of one :func:`group_key` in one stack (:func:`dynlab.lm.run.text.train_and_evaluate_many`;
    a stack cut off resumes from its state in ``resume_dir``) and evaluate each;
    ``ensemble_size`` records the number of runs in the stack. A ``loop`` run is trained alone."""
    first = specs[0]
    if first.train.engine == "loop":
        return [run_one(s, device, progress) for s in specs]
    bar = progress.add(f"{first.model.mixer} x{len(specs)} (stack)", first.train.steps)
    seen = [0]

    def step(done: int, losses: list[float]) -> None:
        progress.update(bar, done - seen[0], loss=float(np.nanmean(losses)))
        seen[0] = done

    outcomes = train_and_evaluate_many(specs, device, step, resume_dir=resume_dir)
    progress.remove(bar)
    return [RunOutcome(LMResult.model_validate({**result, "ensemble_size": len(specs)}), weights)
            for result, weights in outcomes]


def group_key(spec: LMRunSpec) -> str:
    """Runs with ``train.engine = "stack"`` that differ only in seed and intervention share
    a work item (:func:`dynlab.lm.run.text.stack_key`); every other run is its own."""
    return stack_key(spec) if spec.train.engine == "stack" else spec.spec_hash()


def assemble(specs: list[LMRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset (:func:`dynlab.lm.dataset.assemble_lm_runs`): per-run Datasets stacked on ``run``
    (outer join on each position axis); with post-training arms, one row per tested model and the
    paired contrasts (module docstring). The ``state`` preset adds each run's forgetting,
    ``forget_rate`` and ``memory_horizon`` (:func:`dynlab.lm.analysis.contraction.runs_forgetting`)."""
    ds = assemble_lm_runs(specs, [read_result(LMResult, store, s) for s in specs])
    if options.preset == "state":
        from dynlab.lm.analysis.contraction import runs_forgetting
        from dynlab.results.vocabulary import annotate

        ds = annotate(ds.assign(runs_forgetting(specs, [store.path(s) for s in specs])))
    return ds


STUDY = Study(
    name="length-generalization",
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    stacking=Stacking(key=group_key, run=run_many, max_size=STACK_MAX),
    resumable=True,
    assemble=assemble,
    spec_type=LMRunSpec,
    result_type=LMResult,
    options_type=LGOptions,
    panels=lambda ds: _panels(ds),
)


def _panels(ds: xr.Dataset) -> dict:
    """The study's figures (:func:`dynlab.lm.figures.panels.length_generalization_panels`; matplotlib loads on first use)."""
    from dynlab.lm.figures.panels import length_generalization_panels

    return length_generalization_panels(ds)
