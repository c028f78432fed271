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
(:func:`dynlab.analysis.lm_metrics.ppl_ranges`), with coords ``arch`` (mixer),
``intervention``, ``train_length``, ``n_params`` and ``d_model`` on ``run``. Every
preset's Mamba models have the real Mamba block (no MLP,
:data:`dynlab.lm.spec.ANCHOR_MLP_RATIO`), so each trained run exports to Hugging Face.

Presets:
- ``smoke`` — checks an installation in seconds: one layer of width 16 (:data:`SMOKE_MODEL`),
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
  ``far_in_ratio``, and ``first_rise_budget(run)``. See :data:`BUDGET_MODEL` for the size.
- ``context`` — paper B's Fig. 2 at CPU scale: T_train ∈ {16, 32, 64, 128} at two model
  sizes (:data:`CONTEXT_SIZES`), every run trained on the same number of tokens
  (:data:`CONTEXT_TOKENS`), evaluated at 16 × T_train.
- ``size`` — paper B's Figs. 2-3 together: 4 widths (:data:`SIZE_LADDER`) x T_train 32
  and 128 x seeds 0-2, each trained as one stack of its seeds (``train.engine = "stack"``)
  to its largest budget with in-run checkpoints, and trained alone to two budgets
  (coordinate ``annealed``); ``far_over_in`` and ``budget_blocks`` beside the budget.
  ``dynlab report`` prints the map (:func:`dynlab.lm.report.tables.size_tables`).
- ``size-annealed`` — the ``size`` map's rises judged on annealed runs: each width, T_train
  and budget where most seeds rose at an in-run checkpoint and ``size`` trains no annealed
  run (:data:`SIZE_ANNEALED`), trained alone to that budget on seeds 0-2, the recipe
  unchanged (the specs, and so the run ids, are those ``size`` would make).
- ``state`` — where small LMs learn to forget (Stuffed Mamba's forget threshold): one width
  with the recurrent state size varied 64× (:data:`STATE_SIZES`) × T_train 16–512
  (:data:`STATE_SEQ_LENS`) × seeds 0–2, every run trained on the same 8M tokens
  (:data:`STATE_TOKENS`, 2 048 a step) as one annealed run, the seeds of a cell as one
  stack; coords ``d_state`` and ``state_size`` on ``run``, and each run's forgetting
  (``forget_rate``, ``memory_horizon``: :mod:`dynlab.lm.analysis.contraction`); ``dynlab report``
  reads it with :mod:`dynlab.lm.report.forget`.
- ``size-interventions`` — the ``interventions`` protocol, recipe unchanged, on fresh
  seeds (:data:`SIZE_INTERVENTION_SEEDS`) where the size map rises in every seed.
- ``interventions`` — paper B's Fig. 5 protocol where the PPL rises: the baseline (zero
  initial state) is trained as ``quick``, whose PPL rises beyond T_train, on seeds 5–9
  (:data:`INTERVENTION_SEEDS`; ``model={"conv_kernel": 0}`` runs the protocol from the
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

Long module: the presets are one table (the list above, :data:`PRESETS` and the model
layouts they share) that :func:`make_specs` reads as one; the dataset is assembled in
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
    BUDGET_LM_LAYOUT, CHINCHILLA_TOKENS_PER_PARAM, QUICK_LM_LAYOUT, InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMPostSpec, LMRunSpec,
    LMTrainSpec, anchor_model_fields,
)
from dynlab.results.store import RunStore
from dynlab.studies import CATALOG
from dynlab.runner.protocol import RunOutcome, Study, StudyOptions, override_field, read_result, select_names
from dynlab.studies.long_context import LMOptions, tokenizer_option, vocab_fields
from dynlab.runtime import NullProgress

__all__ = ["BUDGET_MODEL", "CONTEXT_SIZES", "CONTEXT_TOKENS", "INTERVENTION_NAMES", "INTERVENTION_SEEDS", "MIXER_NAMES", "PRESETS", "SMOKE_MODEL", "STUDY",
           "LGOptions", "assemble", "make_specs", "run_one", "steps_for_budget"]


_QUICK_MODEL = QUICK_LM_LAYOUT
_QUICK_EVAL = {"length_multiple": 16, "n_samples": 128, "chunk_len": 64, "bin_width": 16,
               "effrem_points": 10, "effrem_samples": 32, "state_points": 48}

#: The ``budget`` preset's model: the quick preset's layout at width 16 with 2 heads × 16
#: channels and N = 32: 14 460 parameters, so that 32 × its Chinchilla budget (9.3 M
#: tokens) trains in about 7 CPU minutes a seed (one core, about 20 K tokens/s).
BUDGET_MODEL = BUDGET_LM_LAYOUT

#: The ``context`` preset's two model sizes: the budget preset's model (14 460 parameters)
#: and the same layout at width 32 (27 884 parameters).
CONTEXT_SIZES = (BUDGET_MODEL, {**BUDGET_MODEL, "d_model": 32})

#: The ``size`` preset's model sizes: one layout (expand 2: ``n_heads = d_model / 8`` heads
#: of 16 channels, N = 32, no MLP) at widths 8, 16, 32 and 64, whose blocks (embedding and
#: head left out) hold 2 670, 6 268, 18 168 and 60 784 parameters (23x from the first to
#: the last); width 16 is the ``budget`` preset's model. Per size: the largest budget
#: trained (``chinchilla``, in multiples of the Chinchilla budget over every parameter:
#: 32x at every width), the in-run checkpoints up to it, and the budgets also trained as
#: separate, annealed runs at the first training length (``annealed``: 1x and 4x).
SIZE_LADDER = tuple(
    {**BUDGET_MODEL, "d_model": d, "n_heads": d // 8, "head_dim": 16, "d_state": 32, "chinchilla": top,
     "checkpoints": tuple(c for c in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0) if c <= top),
     "annealed": (1.0, 4.0) if top > 4.0 else (1.0, 2.0)}
    for d, top in ((8, 32.0), (16, 32.0), (32, 32.0), (64, 32.0))
)

#: The ``size-annealed`` preset's runs: each (width, T_train, budget) where most seeds of the
#: ``size`` map rose at an in-run checkpoint (far_over_in > 1.05 in 2 or 3 of seeds 0-2) and
#: the ``size`` preset trains no annealed run, trained as its own annealed run on the same
#: seeds with the ``size`` recipe unchanged (the same specs the ``size`` preset would make),
#: so that each rise is judged on a run whose learning rate has decayed at that budget.
SIZE_ANNEALED = (
    {**SIZE_LADDER[0], "inrun": False, "annealed": (), "annealed_at": ((32, (8.0, 16.0)), (128, (8.0,)))},
    {**SIZE_LADDER[1], "inrun": False, "annealed": (), "annealed_at": ((128, (2.0, 4.0)),)},
    {**SIZE_LADDER[3], "inrun": False, "annealed": (), "annealed_at": ((32, (0.5,)), (128, (0.5,)))},
)

#: Tokens per optimiser step of the ``size`` preset (batch = this / T_train).
SIZE_TOKENS_PER_STEP = 2048

#: The ``state`` preset's models: one layout at width 32 (2 layers, 4 heads × 16 channels, no
#: MLP) with the state size N = ``d_state`` at 8, 32, 128 and 512, so the recurrent state
#: (``state_size``: layers × heads × head_dim × N) spans 64× (1 024 to 65 536 entries) while
#: only the B and C projections (and their convolution channels) grow with N; every run
#: stores both ``state_size`` and ``n_params``.
STATE_SIZES = tuple({**BUDGET_MODEL, "d_model": 32, "n_heads": 4, "head_dim": 16, "d_state": n} for n in (8, 32, 128, 512))

#: Training lengths of the ``state`` preset (each run evaluated at 16 × its own).
STATE_SEQ_LENS = (16, 32, 64, 128, 256, 512)

#: Training tokens of every ``state`` run, the same at every length: 4 096 steps of 2 048
#: tokens, 13.5 × the Chinchilla budget (20 tokens per parameter, every parameter counted)
#: of the smallest model (31 000 parameters) and 4.0 × the largest's (105 592). Pilot seed
#: 100 at a quarter of it (1 × the largest's) rose at every T_train in the two largest
#: states, where the size map shows rises that later training removes, so the budget was
#: raised before the rule was fixed (docs/preregistration-forget-threshold.md).
STATE_TOKENS = 8_388_608

#: Seeds of the ``state`` preset (reported); the recipe and the rule that reads the map were
#: fixed on pilot seeds :data:`STATE_PILOT_SEEDS` first
#: (docs/preregistration-forget-threshold.md), none of them reported.
STATE_SEEDS = (0, 1, 2)
STATE_PILOT_SEEDS = (100, 101)

#: At most this many runs share one stack (``train.engine = "stack"``): ensemble-16 of the
#: quick model stays well under 1 GB (``dynlab bench lm`` measures the peak).
STACK_MAX = 16

#: Training tokens of every ``context`` run.
CONTEXT_TOKENS = 1_048_576

INTERVENTION_SEEDS = (5, 6, 7, 8, 9)

#: Fresh seeds of the ``size-interventions`` preset: the interventions protocol, its recipe
#: unchanged (300 post-training steps at lr 1e-3, chosen on the quick preset's seeds 0-2),
#: where the size map rises in every seed: width 16 (the budget model) trained alone to 4x
#: its Chinchilla budget at T_train 32. No seed of the size map is among them.
SIZE_INTERVENTION_SEEDS = (40, 41, 42, 43, 44)
"""Seeds of the ``interventions`` preset: the quick preset's seeds 0–2 showed that its model
(with the short convolution) rises beyond T_train, so the protocol is reported on seeds
that played no part in choosing the baseline; the post-training recipe (300 steps, lr 1e-3)
was fixed on pilot seed 100."""

#: The ``smoke`` preset's model: one layer of the quick layout at width 16 (2 heads × 16
#: channels, N = 16, chunks of 16).
SMOKE_MODEL = {**_QUICK_MODEL, "d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 16, "d_state": 16,
               "chunk_size": 16}

#: The ``size`` preset (the ``size-annealed`` preset is it with other runs).
_SIZE_PRESET = {
    "mixers": ("mamba2",),
    "seeds": (0, 1, 2),
    "interventions": ("zero",),
    "sizes": SIZE_LADDER,
    "seq_lens": (32, 128),
    "tokens_per_step": SIZE_TOKENS_PER_STEP,
    "model": {},
    "train": {"batch_size": 64, "lr": 5e-3, "threads": 1, "engine": "stack"},
    "eval": {**_QUICK_EVAL, "n_samples": 64, "chunk_len": 128, "effrem_samples": 16},
    "intervention": {"sigma": 0.1},
}

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "interventions": ("zero", "state-passing"),
        "model": SMOKE_MODEL,
        "train": {"steps": 200, "batch_size": 8, "seq_len": 16, "lr": 5e-3, "threads": 1},
        "eval": {"length_multiple": 16, "n_samples": 8, "chunk_len": 64, "bin_width": 16,
                 "effrem_points": 4, "effrem_samples": 4, "state_points": 8},
        "intervention": {"sigma": 0.1},
    },
    "quick": {
        "mixers": ("mamba2",),
        "seeds": (0,),
        "model": _QUICK_MODEL,
        "train": {"steps": 1500, "batch_size": 16, "seq_len": 32, "lr": 5e-3, "threads": 1},
        "eval": _QUICK_EVAL,
        "intervention": {"sigma": 0.1},
    },
    "budget": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "interventions": ("zero",),
        "model": BUDGET_MODEL,
        "chinchilla": 32.0,
        "train": {"batch_size": 64, "seq_len": 32, "lr": 5e-3, "threads": 1},
        "eval": {**_QUICK_EVAL, "n_samples": 64, "effrem_samples": 16,
                 "checkpoints": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)},
        "intervention": {"sigma": 0.1},
    },
    "context": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "interventions": ("zero",),
        "sizes": CONTEXT_SIZES,
        "seq_lens": (16, 32, 64, 128),
        "tokens": CONTEXT_TOKENS,
        "model": {},
        "train": {"batch_size": 16, "lr": 5e-3, "threads": 1},
        "eval": {**_QUICK_EVAL, "n_samples": 64, "chunk_len": 128, "bin_width": 16, "effrem_samples": 16},
        "intervention": {"sigma": 0.1},
    },
    "size": _SIZE_PRESET,
    "size-annealed": {**_SIZE_PRESET, "sizes": SIZE_ANNEALED},  # the same recipe: only its runs differ
    "state": {
        "mixers": ("mamba2",),
        "seeds": STATE_SEEDS,
        "interventions": ("zero",),
        "sizes": STATE_SIZES,
        "seq_lens": STATE_SEQ_LENS,
        "tokens": STATE_TOKENS,
        "tokens_per_step": SIZE_TOKENS_PER_STEP,
        "model": {},
        "train": {"batch_size": 64, "lr": 5e-3, "threads": 1, "engine": "stack"},
        "eval": {**_QUICK_EVAL, "n_samples": 64, "chunk_len": 128, "effrem_samples": 16},
        "intervention": {"sigma": 0.1},
    },
    "interventions": {
        "mixers": ("mamba2",),
        "seeds": INTERVENTION_SEEDS,
        "interventions": ("zero",),
        "model": _QUICK_MODEL,
        "train": {"steps": 1500, "batch_size": 16, "seq_len": 32, "lr": 5e-3, "threads": 1},
        "eval": _QUICK_EVAL,
        "intervention": {"sigma": 0.1},
        "post": {"interventions": INTERVENTION_NAMES, "steps": 300, "lr": 1e-3},
    },
    "size-interventions": {
        "mixers": ("mamba2",),
        "seeds": SIZE_INTERVENTION_SEEDS,
        "interventions": ("zero",),
        "model": BUDGET_MODEL,
        "chinchilla": 4.0,
        "train": {"batch_size": 64, "seq_len": 32, "lr": 5e-3, "threads": 1},
        "eval": {**_QUICK_EVAL, "n_samples": 64, "effrem_samples": 16},
        "intervention": {"sigma": 0.1},
        "post": {"interventions": INTERVENTION_NAMES, "steps": 300, "lr": 1e-3},
    },
    "pretrained": {
        "mixers": ("mamba2",),
        "seeds": (0, 1, 2),
        "interventions": ("zero",),
        "pretrained": True,
        "model": {},
        "train": {"steps": 1, "batch_size": 8, "accum": 32, "seq_len": 2048, "lr": 1e-4, "clip": 1.0,
                  "weight_decay": 0.1},
        "eval": {"length_multiple": 16, "n_samples": 16, "chunk_len": 512, "bin_width": 64,
                 "effrem_points": 8, "effrem_samples": 4, "state_points": 32},
        "intervention": {"sigma": 0.1},
        "post": {"interventions": INTERVENTION_NAMES, "steps": 100, "warmup_frac": 0.1},
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
    from dynlab.lm.hub.checkpoint import checkpoint_digest, checkpoint_tokenizer, load_checkpoint
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
    init = LMInitSpec(checkpoint=str(path.resolve()), sha256=checkpoint_digest(path), config=_checkpoint_config(meta))
    iv_kw = {**preset["intervention"], **extra.intervention}
    return [LMRunSpec(data=data, model=LMModelSpec(**_checkpoint_layout(model, meta)),
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


def _checkpoint_config(meta: dict) -> dict[str, Any]:
    """What the run records of its checkpoint's own layout: a Hugging Face config's summary
    (:func:`dynlab.lm.hub.hf.hf_config_summary`) or a dynlab run's model fields."""
    return dict(meta.get("config") or meta.get("spec", {}).get("model") or {})


def _checkpoint_layout(model: torch.nn.Module, meta: dict) -> dict[str, Any]:
    """:class:`LMModelSpec` fields that describe a loaded checkpoint for the dataset's
    coordinates: its mixer, width, layers and vocabulary (its other sizes stay in its own
    config; the run's ``n_params`` counts the loaded model)."""
    if meta.get("kind") == "dynlab":
        m = meta["spec"]["model"]
        return {"mixer": m.get("mixer", "mamba2"), "d_model": m["d_model"], "n_layers": m["n_layers"], "mlp_ratio": 0,
                "vocab_size": int(model.vocab_size)}
    c = meta["config"]
    return {"mixer": "mamba2" if c.get("model_type") == "mamba2" else "mamba1", "d_model": c["hidden_size"],
            "n_layers": c["num_hidden_layers"], "mlp_ratio": 0, "vocab_size": int(model.vocab_size)}


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


def run_one(spec: LMRunSpec, device: torch.device, progress: NullProgress) -> RunOutcome:
    """Train one LM with its intervention (and its post-training arms) and evaluate it from the zero state."""
    total = spec.train.steps + (spec.post.steps * len(spec.post.interventions) if spec.post is not None else 0)
    bar = progress.add(f"{spec.model.mixer}/{spec.intervention.kind}", total)

    def step(i: int, loss: float) -> None:
        progress.update(bar, 1, loss=loss)

    if spec.train.engine == "stack":  # a stack of one: the same numbers as in any stack
        progress.remove(bar)
        return run_many([spec], device, progress)[0]
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
    description=CATALOG["length-generalization"].description,
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    run_many=run_many,
    group_key=group_key,
    max_group=STACK_MAX,
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
