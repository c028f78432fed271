"""The dataset of a word-problem study from its stored tracker runs.

Dim ``run`` (+ ``length``, ``length_dense``, ``t`` …) with the names of dynlab's dataset
vocabulary (:mod:`dynlab.results.vocabulary`): the training and evaluation record of
every run (:class:`~dynlab.tracking.run.TrackerResult`), the per-run analyses where they
exist (``analysis.nc``, :func:`~dynlab.tracking.run.analyze_run`), summaries derived
from them, and the T_cross–mp correlations across runs
(:func:`dynlab.analysis.correlation.study_correlations`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.analysis.correlation import study_correlations
from dynlab.tracking.spec import RunSpec
from dynlab.tracking.groups import get_group
from dynlab.results.assemble import assemble_runs, stack_run_files
from dynlab.results.store import ANALYSIS, RunStore
from dynlab.runner.protocol import read_result
from dynlab.tracking.run import TrackerResult

__all__ = ["assemble_tracking", "run_curves"]

#: Run variables taken from each :class:`TrackerResult`.
RESULT_COLUMNS = ("mp", "mp_censored", "mp_grid", "mp_grid_censored", "status", "reason",
                  "curriculum_length", "train_loss", "train_steps", "train_time")

#: Run coordinates read from each spec.
SPEC_COORDS = {
    "arch": lambda s: s.model.arch,
    "group": lambda s: s.task.group,
    "seed": lambda s: s.seed,
    "hidden": lambda s: s.model.hidden,
    "layers": lambda s: s.model.layers,
    "nonlinearity": lambda s: s.model.nonlinearity or "default",
}


def run_curves(spec: RunSpec, r: TrackerResult) -> xr.Dataset:
    """One run's accuracy on its evaluated lengths (``length``) and at every length 1 …
    max (``length_dense``); NaN on the spec's lengths for a run that was not evaluated."""
    lengths = r.lengths if r.evaluated and r.lengths is not None else list(spec.eval.lengths)
    nan = [np.nan] * len(lengths)
    acc = r.accuracy if r.evaluated else nan
    acc_all = r.accuracy_all if r.evaluated else nan
    dense = np.full(max(lengths), np.nan)
    given = (r.accuracy_dense or []) if r.evaluated else []
    dense[: len(given)] = given
    return xr.Dataset(
        {
            "accuracy": ("length", np.asarray(acc, dtype=float)),
            "accuracy_all": ("length", np.asarray(acc_all, dtype=float)),
            "accuracy_dense": ("length_dense", dense),
        },
        coords={"length": np.asarray(lengths, dtype=np.int64), "length_dense": np.arange(1, dense.size + 1)},
    )


def _with_analyses(ds: xr.Dataset, table: xr.Dataset, specs: list[RunSpec]) -> xr.Dataset:
    """``ds`` with the stacked per-run analyses ``table`` and what is derived from them:
    ``group_order``, ``half_margin_rel`` = median over t of M / (2 · centroid_radius),
    ``q_max`` = max over t of q, and the ``corr_*`` block.

    Legacy rule: an analysis written before the run variable ``horizon`` existed followed
    q(t) to every length, so an analysed run without one gets the largest ``length``."""
    ds = ds.merge(table.drop_vars([c for c in table.coords if c in ("run",)], errors="ignore"), compat="override")
    per_run = ("analysis_seconds", "horizon")  # differ from run to run: the run variable horizon, and each analysis.nc
    ds.attrs.update({f"analysis_{k}": v for k, v in table.attrs.items() if k not in per_run})
    if "R" in ds:
        analysed = np.isfinite(ds["R"]).any("t")
        horizon = ds["horizon"] if "horizon" in ds else xr.full_like(analysed, np.nan, dtype=float)
        ds["horizon"] = horizon.where(~(horizon.isnull() & analysed), float(ds["length"].max()))
    ds["group_order"] = ("run", np.asarray([get_group(s.task.group).order for s in specs]))
    ds["half_margin_rel"] = ("run", (0.5 * ds["M"] / ds["centroid_radius"]).median("t").values)
    ds["q_max"] = ("run", ds["q"].max("t").values)
    corr = study_correlations(ds)
    ds = ds.merge(corr)
    ds.attrs.update(corr.attrs)  # merge keeps only the first dataset's attrs
    return ds


def assemble_tracking(specs: list[RunSpec], store: RunStore) -> xr.Dataset:
    """The study dataset of the tracker runs ``specs`` in ``store`` (module docstring):
    :data:`RESULT_COLUMNS` and the curves of :func:`run_curves` per run, the coordinates
    :data:`SPEC_COORDS`, ``family`` and ``family_measured``; ``mp`` carries the
    ``threshold`` and ``window`` of its evaluation.  With analyses: :func:`_with_analyses`."""
    results = [read_result(TrackerResult, store, s) for s in specs]
    ds = assemble_runs(specs, results, run_curves, columns=RESULT_COLUMNS,
                       result_coords=("family", "family_measured"), coords=SPEC_COORDS)
    ds["mp"].attrs["threshold"] = float(specs[0].eval.threshold) if specs else float("nan")
    ds["mp"].attrs["window"] = float(specs[0].eval.mp_window) if specs else float("nan")
    table = stack_run_files(specs, store, ANALYSIS, [r.evaluated for r in results], positional=("k", "k_fp"))
    return ds if table is None else _with_analyses(ds, table, specs)
