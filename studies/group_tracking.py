"""Study ``group-tracking`` (paper A): trackers on group word problems, length extrapolation.

Every selected architecture is trained on every selected group with a curriculum to
length 60 and evaluated at lengths up to 1000; the dataset holds ``accuracy(run,
length)``, ``accuracy_all``, ``mp(run)`` and the training record.

Presets:
- ``smoke`` — width 16, 20 steps, lengths to 60: seconds; checks an installation.
- ``quick`` — 8 architectures × {C2, C6, S3} × 1 seed, width 64, ≤ 600 steps of batch 128,
  evaluation on 256 sequences to length 1000.  Minutes on a 2-core CPU.
- ``paper`` — 8 architectures × {C2, C6, S3} × 5 seeds = 120 models (paper A: 113), width
  128, 3000 steps of batch 256 (AdamW 1e-3, warm-up + cosine, clip 1.0), curriculum to 60,
  evaluation on 1024 sequences at lengths 10 … 1000, analyses with 512 sequences to 1000.
  ``--groups`` adds more (A4, D4, S4, A5, S5, C2xS3, …): 40 models per group.

  Cost per training step at length 60 on the 2-core development box (idle, torch 2.13
  CPU, ``dynlab bench train`` at the paper's H=128, B=256): tanh-rnn and linear-rnn
  about 20–26 ms alone and 15 ms per member in an ensemble; state-gated-rnn about 50 ms
  alone and 36 ms per member (the fused kernels); mamba about 0.07–0.08 s.  Early
  curriculum steps are shorter and cheaper.  So at most about 1–3 min of training per
  dense run and 4 min per mamba run; evaluation and the analyses take about 1 min each
  per run.  A rough total for the 120 runs on such a box: 8–12 hours, most of it the
  diagonal (Mamba family) cells and the evaluations.  (Before the fused kernels, on the
  same box at load average 8–11, a tanh-rnn step took 1.4–1.5 s and a mamba step 2.1 s.)  On one modern GPU the
  recurrence is launch-bound; there the 5 seeds of a configuration train as one batched
  ensemble (an estimate, not measured here).  For many more models use a GPU box or
  a cluster (``--executor dask``).
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch
import xarray as xr

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
from dynlab.results.store import RunStore
from dynlab.study import EVALUATED_STATUSES, RunOutcome, Study, StudyOptions
from dynlab.tasks import WordProblem
from dynlab.train import NullProgress, TrainResult, build_tracker, train_tracker
from dynlab.train.engine import train_threads
from dynlab.train.ensemble import train_ensemble

__all__ = [
    "ANALYSIS_PRESETS",
    "PRESETS",
    "STUDY",
    "analyze_one",
    "assemble",
    "ensemble_group_key",
    "load_model",
    "make_specs",
    "run_many",
    "run_one",
]

DEFAULT_GROUPS = ("C2", "C6", "S3")

PRESETS: dict[str, dict] = {
    "smoke": {
        "seeds": (0,),
        "model": {"hidden": 16},
        "train": {"steps": 20, "batch_size": 32, "lr": 3e-3, "warmup_steps": 2},
        "eval": {"n_samples": 32, "batch_size": 32, "lengths": (5, 20, 60), "chunk": 25},
    },
    "quick": {
        "seeds": (0,),
        "model": {"hidden": 64},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3},
        "eval": {"n_samples": 256, "batch_size": 256},
    },
    "sweep": {
        "seeds": (0, 1, 2, 3, 4),
        "model": {"hidden": 64},
        "train": {"steps": 600, "batch_size": 128, "lr": 3e-3},
        "eval": {"n_samples": 256, "batch_size": 256},
    },
    "paper": {
        "seeds": (0, 1, 2, 3, 4),
        "model": {"hidden": 128},
        "train": {"steps": 3000, "batch_size": 256, "lr": 1e-3, "warmup_steps": 100},
        "eval": {"n_samples": 1024, "batch_size": 512, "lengths": (10, 20, 40, 60, 100, 200, 300, 500, 700, 1000)},
    },
}


def _select_models(models: tuple[str, ...] | None) -> tuple[str, ...]:
    if models is None or models == ("all",):
        return BUILTIN_ARCHS
    allowed = available_cells()
    for m in models:
        if m not in allowed:
            raise DynlabInputError(f"unknown model {m!r}; allowed: all, {', '.join(allowed)}")
    return tuple(dict.fromkeys(models))


def make_specs(options: StudyOptions) -> list[RunSpec]:
    """One :class:`RunSpec` per (architecture, group, seed) of the selection."""
    if options.preset not in PRESETS:
        raise DynlabInputError(f"unknown preset {options.preset!r}; allowed: {', '.join(PRESETS)}")
    preset = PRESETS[options.preset]
    archs = _select_models(options.models)
    groups = tuple(get_group(g).name for g in (options.groups or DEFAULT_GROUPS))
    seeds = options.seeds if options.seeds is not None else preset["seeds"]
    if any(s < 0 for s in seeds):
        raise DynlabInputError(f"seeds must be ≥ 0, got {list(seeds)}")
    extra = dict(options.extra)
    model_kw = {**preset["model"], **extra.get("model", {})}
    train_kw = {**preset["train"], **extra.get("train", {})}
    eval_kw = {**preset["eval"], **extra.get("eval", {})}
    train = TrainSpec(**train_kw)
    evals = EvalSpec(**eval_kw)
    return [
        RunSpec(task=TaskSpec(group=g), model=ModelSpec(arch=a, **model_kw), train=train, eval=evals, seed=s)
        for g in groups
        for a in archs
        for s in seeds
    ]


def run_status(res: TrainResult, max_length: int) -> tuple[str, str]:
    """Status of a finished training run and its reason.

    - ``diverged`` — the loss or gradient became non-finite (the engine's verdict);
    - ``not-learned`` — training ended with the curriculum below the training length
      ``max_length``: the model never read the task at the length it was meant to learn,
      so its horizon says nothing about error control (reason: the length reached);
    - ``ok`` — the curriculum reached the training length.

    Rule for the analyses: ``ok`` and ``not-learned`` runs are evaluated and analysed alike
    (the measurements of a tracker that did not learn are still measurements, and the
    figures mark them); the T_cross–mp correlations use ``ok`` runs only.
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
    result: dict = {
        "status": status,
        "reason": reason,
        "train_steps": len(res.losses),
        "train_loss": res.losses[-1] if res.losses else float("nan"),
        "curriculum_length": res.lengths[-1] if res.lengths else 0,
        "final_train_accuracy": res.final_train_accuracy,
        "train_time": train_time,
        "family": res.model.family,
        "family_measured": measure_family(res.model.cells[0].cpu()),
        **extra,
    }
    res.model.to(device)
    if status not in EVALUATED_STATUSES:
        return RunOutcome(result, None)
    task = WordProblem(get_group(spec.task.group))
    ev = spec.eval
    with train_threads(device):  # RUN_THREADS, as training: same numbers on every machine
        le = evaluate_lengths(
            res.model, task, ev.lengths, ev.n_samples, ev.batch_size, ev.chunk, spec.seed + ev.seed_offset, device
        )
    mp_grid, grid_censored = max_pass_length(le.lengths, le.acc_final, ev.threshold)
    mp, censored = max_pass_length_dense(le.acc_dense, ev.threshold, ev.mp_window)
    result.update(
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
    )
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


ANALYSIS_PRESETS: dict[str, AnalysisSpec] = {
    "smoke": AnalysisSpec(n_samples=32, perturb_samples=16, perturb_steps=10, lyap_samples=2, lyap_steps=10, n_words=2),
    "quick": AnalysisSpec(n_samples=128, perturb_samples=128, lyap_samples=8),
    "paper": AnalysisSpec(),
}


def analysis_spec_for(spec: RunSpec) -> AnalysisSpec:
    """Analysis settings by evaluation size: paper (≥ 1024 samples), quick (≥ 128), smoke."""
    n = spec.eval.n_samples
    return ANALYSIS_PRESETS["paper" if n >= 1024 else "quick" if n >= 128 else "smoke"]


def analyze_one(spec: RunSpec, store: RunStore, device: torch.device, progress: NullProgress) -> xr.Dataset:
    """Error-control analysis of a finished run (:func:`dynlab.analysis.tracking.analyze_tracker`).

    q(t) is followed to the longest evaluated length; U, the return map and the
    perturbation use step t_ref = the curriculum's max_length (the training length).
    """
    model = load_model(spec, store, torch.device("cpu"))
    task = WordProblem(get_group(spec.task.group))
    aspec = analysis_spec_for(spec)
    horizon = aspec.horizon or max(spec.eval.lengths)
    t_ref = aspec.t_ref or spec.train.curriculum.max_length
    return analyze_tracker(model, task, aspec, horizon=horizon, t_ref=min(t_ref, horizon))


def _analysis_table(specs: list[RunSpec], store: RunStore, status: list[str]) -> xr.Dataset | None:
    """Stack the per-run analyses along ``run`` (NaN / '' / False where a run has none)."""
    parts = []
    for spec, st in zip(specs, status):
        if st in EVALUATED_STATUSES and store.has_file(spec, "analysis.nc"):
            ds = store.read_dataset(spec, "analysis.nc")
            ds = ds.assign_coords(k=np.arange(ds.sizes["k"]))
            for name in ds.data_vars:
                if name.startswith("failure_mode"):
                    ds[name] = ds[name].astype(str)
            parts.append(ds)
        else:
            parts.append(None)
    present = [p for p in parts if p is not None]
    if not present:
        return None
    template = xr.zeros_like(present[0]).where(False)
    for name in template.data_vars:
        if name.startswith("failure_mode"):
            template[name] = ((), "")
        elif name.startswith("crossed"):
            template[name] = ((), False)
    filled = [p if p is not None else template for p in parts]
    table = xr.concat(filled, dim="run", join="outer", data_vars="all", coords="minimal", compat="override")
    table.attrs = present[0].attrs
    return table


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
            {"long_name": f"held-out {key.replace('_', ' ')} of T_cross ({default}) vs mp", "units": "1",
             "variant": default, "heldout_seeds": str(choice["heldout_seeds"]), "description": desc},
        )
    out["corr_heldout_n_used"] = ((), int(choice["n_used"]), {"long_name": "held-out runs used", "units": "1"})
    res = tcross_mp_correlation(
        t_cross[default], sub["mp"].values, rng=np.random.default_rng(0), **common
    )
    cds = res.to_dataset()
    for v in cds.data_vars:
        cds[v].attrs["long_name"] = cds[v].attrs.get("long_name", v).replace("T_cross", f"T_cross ({default})")
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


def assemble(specs: list[RunSpec], store: RunStore, options: StudyOptions) -> xr.Dataset:
    """The study dataset: dim ``run`` (+ ``length``, ``t`` …) with the names of dynlab's dataset vocabulary (:mod:`dynlab.results`).

    Holds the training/evaluation record of every run, the per-run analyses where they
    exist (:func:`analyze_one`), the margin summary per run and the T_cross–mp
    correlations across runs (``corr_*`` variables).
    """
    lengths = sorted({int(L) for s in specs for L in s.eval.lengths})
    n, nl = len(specs), len(lengths)
    acc = np.full((n, nl), np.nan)
    acc_all = np.full((n, nl), np.nan)
    acc_dense = np.full((n, lengths[-1] if lengths else 0), np.nan)
    keys = ("mp", "mp_grid", "curriculum_length", "train_loss", "train_steps", "train_time")
    scalars = {k: np.full(n, np.nan) for k in keys}
    status, reason, fam_meas, fam = [], [], [], []
    censored = np.zeros(n, dtype=bool)
    grid_censored = np.zeros(n, dtype=bool)
    for i, spec in enumerate(specs):
        r = store.load_result(spec)
        status.append(r["status"])
        reason.append(r.get("reason", ""))
        fam.append(r.get("family", ""))
        fam_meas.append(r.get("family_measured", ""))
        for k in scalars:
            if r.get(k) is not None:
                scalars[k][i] = r[k]
        if r["status"] in EVALUATED_STATUSES:
            idx = [lengths.index(int(L)) for L in r["lengths"]]
            acc[i, idx] = r["accuracy"]
            acc_all[i, idx] = r["accuracy_all"]
            censored[i] = bool(r["mp_censored"])
            grid_censored[i] = bool(r.get("mp_grid_censored", r["mp_censored"]))
            dense = r.get("accuracy_dense") or []
            acc_dense[i, : len(dense)] = dense
    run = np.arange(n)
    ds = xr.Dataset(
        {
            "accuracy": (("run", "length"), acc),
            "accuracy_all": (("run", "length"), acc_all),
            "accuracy_dense": (("run", "length_dense"), acc_dense),
            "mp": ("run", scalars["mp"]),
            "mp_censored": ("run", censored),
            "mp_grid": ("run", scalars["mp_grid"]),
            "mp_grid_censored": ("run", grid_censored),
            "status": ("run", np.array(status, dtype=str)),
            "reason": ("run", np.array(reason, dtype=str)),
            "curriculum_length": ("run", scalars["curriculum_length"]),
            "train_loss": ("run", scalars["train_loss"]),
            "train_steps": ("run", scalars["train_steps"]),
            "train_time": ("run", scalars["train_time"]),
        },
        coords={
            "run": run,
            "length": np.asarray(lengths),
            "length_dense": np.arange(1, acc_dense.shape[1] + 1),
            "run_id": ("run", np.array([s.spec_hash() for s in specs], dtype=str)),
            "arch": ("run", np.array([s.model.arch for s in specs], dtype=str)),
            "family": ("run", np.array(fam, dtype=str)),
            "family_measured": ("run", np.array(fam_meas, dtype=str)),
            "group": ("run", np.array([s.task.group for s in specs], dtype=str)),
            "seed": ("run", np.array([s.seed for s in specs])),
            "hidden": ("run", np.array([s.model.hidden for s in specs])),
            "layers": ("run", np.array([s.model.layers for s in specs])),
            "nonlinearity": ("run", np.array([s.model.nonlinearity or "default" for s in specs], dtype=str)),
        },
    )
    ds["mp"].attrs["threshold"] = float(specs[0].eval.threshold) if specs else float("nan")
    ds["mp"].attrs["window"] = float(specs[0].eval.mp_window) if specs else float("nan")
    table = _analysis_table(specs, store, status)
    if table is not None:
        ds = ds.merge(table.drop_vars([c for c in table.coords if c in ("run",)], errors="ignore"), compat="override")
        ds.attrs.update({f"analysis_{k}": v for k, v in table.attrs.items()})
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
    run_many=lambda specs, device, progress: run_many(specs, device, progress),
    group_key=lambda spec: ensemble_group_key(spec),
    max_group=64,
)


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
    (what :func:`dynlab.train.ensemble.check_ensemble` needs); other archs get a unique key.

    Stacked are the architectures whose cell class declares a fused training kernel
    (``Cell.fused``: the dense RNNs, whose per-step GEMMs batch into one bmm for all
    members, on every device).  The diagonal cells are memory-bound on the CPU and measured
    slower stacked (mamba, H=128, B=256: a stack of 16 reached 61 K model-tokens/s, one
    model alone 145 K), so they run alone.
    """
    if get_cell(spec.model.arch).fused is None:
        return spec.spec_hash()
    return (spec.model, spec.train.batch_size, get_group(spec.task.group).order)
