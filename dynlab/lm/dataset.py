"""The dataset layout of a language-model run: each quantity on its own positions.

:func:`result_to_dataset` turns one run's ``result.json`` (:class:`dynlab.lm.results.LMResult`)
into a Dataset whose curves are each on their own position axis (``t``, ``t_bin``,
``t_effrem``, ``t_state``), so that no quantity is padded with NaN onto another's grid and
the run's ``ds.ppl_binned.plot()`` draws a curve (:data:`dynlab.results.positions.POSITION_AXES`).
:func:`assemble_lm_runs` stacks the runs of the length-generalization study
(:mod:`dynlab.studies.length_generalization`) into its dataset, the runs sharing each
position axis (a run's curve is NaN beyond its own evaluation length and off its own grid;
:func:`dynlab.results.positions.curves` gives each run's curve back unpadded): each run's
curves with its in-range and far PPL (:func:`evaluation_curves`), a checkpointed run's on
the dim ``budget`` (:func:`run_curves`), and the post-training arms with their paired
contrasts (:func:`assemble_arms`).  Torch-free (a checkpointed run reads
two constants of the torch-importing model and spec modules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import xarray as xr

from dynlab.analysis.contrasts import paired_contrasts
from dynlab.lm.analysis.metrics import ppl_ranges
from dynlab.lm.results import LMResult
from dynlab.results.assemble import assemble_runs, result_columns, stack_runs, training_curves
from dynlab.results.positions import bin_starts
from dynlab.results.vocabulary import annotate

if TYPE_CHECKING:
    from dynlab.lm.spec import LMRunSpec

__all__ = ["SPEC_COORDS", "assemble_arms", "assemble_lm_runs", "evaluation_curves", "result_to_dataset", "run_curves"]

def result_to_dataset(result: dict[str, Any]) -> xr.Dataset:
    """One run's result as a Dataset, each quantity on its own positions (none padded onto another's):

    - ``ppl`` on ``t`` = 1 … eval length;
    - ``ppl_binned`` on ``t_bin`` (the bin ends), with ``t_bin_start`` (each bin's first position);
    - ``effrem*`` on ``t_effrem`` (the starts of the truncated contexts, t = 0 included);
    - ``state_*`` on (``layer``, ``head``, ``t_state``), the recorded positions (:func:`state_positions`);
    - the verdict ``lg_*`` as scalars.
    """
    ends = np.asarray(result["ppl_binned_t"], dtype=np.int64)
    data: dict[str, Any] = {
        "ppl": ("t", np.asarray(result["ppl"], dtype=float)),
        "ppl_binned": ("t_bin", np.asarray(result["ppl_binned"], dtype=float)),
    }
    for d, values in result["effrem"].items():
        data["effrem" if d == "tv" else f"effrem_{d}"] = ("t_effrem", np.asarray(values, dtype=float))
    for name in ("state_mean", "state_std", "state_norm"):
        data[name] = (("layer", "head", "t_state"), np.asarray(result[name], dtype=float))
    for key, value in result["verdict"].items():
        data[f"lg_{key}"] = ((), value)
    n_layers, n_heads = np.asarray(result["state_std"]).shape[:2]
    coords = {"t": np.arange(1, len(result["ppl"]) + 1), "t_bin": ends,
              "t_bin_start": ("t_bin", bin_starts(ends)),
              "t_effrem": np.asarray(result["effrem_t"], dtype=np.int64),
              "t_state": np.asarray(result["state_t"], dtype=np.int64),
              "layer": np.arange(n_layers), "head": np.arange(n_heads)}
    return annotate(xr.Dataset(data, coords=coords))


def evaluation_curves(result: dict[str, Any], train_length: int) -> xr.Dataset:
    """One evaluation's curves, each on its own positions (:func:`result_to_dataset`), with
    ``lg_passed`` as 1.0/0.0 (runs without one are NaN) and its in-range and far PPL."""
    ds = result_to_dataset(result)
    ds = ds.assign(lg_passed=ds["lg_passed"].astype(float)) if "lg_passed" in ds else ds
    return ds.merge(ppl_ranges(ds["ppl_binned"], ds["lg_p_star"], train_length))


def run_curves(spec: LMRunSpec, r: LMResult) -> xr.Dataset | None:
    """An ``ok`` run's curves; with checkpoints, each checkpoint's on the dim ``budget``."""
    if r.status != "ok":
        return None
    if not r.checkpoints:
        return evaluation_curves(r.to_json(), spec.train.seq_len)
    parts = [evaluation_curves(c, spec.train.seq_len) for c in r.checkpoints]
    budgets = [float(c["budget"]) for c in r.checkpoints]
    ds = xr.concat(parts, dim="budget", join="outer", data_vars="all", coords="minimal", compat="override")
    ds = ds.assign_coords(budget=budgets)
    from dynlab.lm.spec import CHINCHILLA_TOKENS_PER_PARAM

    ratio = ds["far_in_ratio"].values
    rise = np.flatnonzero(ratio > 1.0)
    blocks = r.n_params - 2 * spec.model.vocab_size * spec.model.d_model  # the embedding and the (untied) head left out
    return annotate(ds.assign(
        checkpoint_step=("budget", [int(c["step"]) for c in r.checkpoints]),
        tokens_per_param=("budget", [c["tokens"] / r.n_params for c in r.checkpoints]),
        budget_blocks=("budget", [c["tokens"] / (CHINCHILLA_TOKENS_PER_PARAM * blocks) for c in r.checkpoints]),
        first_rise_budget=((), budgets[rise[0]] if rise.size else np.nan),
    ))


SPEC_COORDS = {
    "arch": lambda s: s.model.mixer,
    "intervention": lambda s: s.intervention.kind,
    "seed": lambda s: s.seed,
    "train_length": lambda s: s.train.seq_len,
    "eval_length": lambda s: s.eval_length,
    "d_model": lambda s: s.model.d_model,
    "d_state": lambda s: s.model.d_state,
    "state_size": lambda s: s.model.n_layers * s.model.n_heads * s.model.head_dim * s.model.d_state,
    "annealed": lambda s: len(s.eval.checkpoints) == 1,
}


def assemble_arms(specs: list[LMRunSpec], results: list[LMResult]) -> xr.Dataset:
    """One row per tested model: each run's trained model (``phase = "base"``) and its arms
    (``phase = "post"``), then the paired contrasts of ``ppl_far`` and ``ppl_in``."""
    rows: list[tuple[LMRunSpec, str, str, LMResult]] = []
    for spec, r in zip(specs, results):
        rows.append((spec, spec.intervention.kind, "base", r))
        for arm in spec.post.interventions if spec.post is not None else ():
            if arm in (r.post or {}):
                rows.append((spec, arm, "post", LMResult.model_validate({"n_params": r.n_params, **r.post[arm]})))
    ds = stack_runs([evaluation_curves(res.to_json(), spec.train.seq_len) if res.status == "ok" and res.ppl else None
                     for spec, _, _, res in rows])
    ds = (ds if ds is not None else xr.Dataset()).assign_coords(run=np.arange(len(rows)))
    ds = ds.assign(result_columns([row[3] for row in rows], ("status", "reason", "train_loss", "train_time")))
    ds = ds.merge(training_curves([row[3] for row in rows]))
    ds = ds.assign_coords({
        "run_id": ("run", [row[0].run_id for row in rows]), "arch": ("run", [row[0].model.mixer for row in rows]),
        "intervention": ("run", [row[1] for row in rows]), "phase": ("run", [row[2] for row in rows]),
        "seed": ("run", [row[0].seed for row in rows]), "train_length": ("run", [row[0].train.seq_len for row in rows]),
        "eval_length": ("run", [row[0].eval_length for row in rows]),
        "d_model": ("run", [row[0].model.d_model for row in rows]),
        "n_params": ("run", [np.nan if row[3].n_params is None else row[3].n_params for row in rows]),
    })
    if "ppl_far" in ds and (ds["phase"] == "post").any():
        for name, prefix in (("ppl_far", "far_"), ("ppl_in", "in_")):
            c = paired_contrasts(ds, name)
            ds = ds.merge(c.rename({k: f"{prefix}{k}" for k in c.data_vars}))
    return ds


def assemble_lm_runs(specs: list[LMRunSpec], results: list[LMResult]) -> xr.Dataset:
    """The length-generalization dataset of ``results`` (one per spec): per-run Datasets stacked
    on ``run`` (outer join on each position axis), with coords :data:`SPEC_COORDS`,
    ``n_params`` (and ``engine``, ``ensemble_size`` when a run was not trained alone); with
    post-training arms, one row per tested model and the paired contrasts (:func:`assemble_arms`).
    The attribute ``precision`` names the training precisions of the runs (``fp32``, ``bf16``)."""
    if any(s.post is not None for s in specs):
        return _with_precision(assemble_arms(specs, results), specs)
    return _with_precision(_assemble_lm(specs, results), specs)


def _with_precision(ds: xr.Dataset, specs: list[LMRunSpec]) -> xr.Dataset:
    ds.attrs["precision"] = ",".join(sorted({s.train.precision for s in specs})) or "fp32"
    return ds


def _assemble_lm(specs: list[LMRunSpec], results: list[LMResult]) -> xr.Dataset:
    ds = assemble_runs(specs, results, run_curves, coords=SPEC_COORDS)
    ds = ds.assign_coords(n_params=("run", [np.nan if r.n_params is None else r.n_params for r in results]))
    if any(s.train.engine != "loop" for s in specs):
        ds = ds.assign_coords(engine=("run", np.array([s.train.engine for s in specs], dtype=str)),
                              ensemble_size=("run", [np.nan if r.ensemble_size is None else r.ensemble_size
                                                     for r in results]))
    return annotate(ds)
