"""Study datasets from per-run results: the stacking every study shares.

A study dataset has one entry per run along dim ``run`` (in the order of the study's
specs).  Its parts, built here:

- :func:`result_columns` — scalar fields of the runs' typed results as ``run`` columns;
- :func:`spec_coords` — ``run``, ``run_id`` and per-run coordinates computed from the specs;
- :func:`stack_runs` — per-run datasets (curves on a length or time axis, analyses)
  concatenated along ``run``, with runs that have none filled with missing values;
- :func:`stack_run_files` — :func:`stack_runs` over a per-run file of the run store
  (``analysis.nc``) for the runs that have it;
- :func:`training_curves` — the runs' subsampled training-loss curves and their
  ``converged`` flags, where the results hold them;
- :func:`assemble_runs` — all of the above for the usual study layout.

What a study adds (which variables, which summaries and correlations) stays in the study.
Missing values: NaN for numbers (integers become floats), ``''`` for strings, ``False``
for booleans, unless a study names another value per variable.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from dynlab.spec import Spec
from dynlab.results.store import RunStore

__all__ = ["assemble_runs", "converged_flags", "missing_like", "result_columns", "spec_coords", "stack_run_files",
           "stack_runs", "training_curves"]

RUN = "run"


def missing_like(var: xr.DataArray, value: Any = None) -> xr.DataArray:
    """``var`` with every entry replaced by ``value``, or by the missing value of its dtype:
    ``''`` for strings, ``False`` for booleans, NaN (as float) for numbers."""
    if value is None:
        kind = var.dtype.kind
        value = "" if kind in "USO" else False if kind == "b" else np.nan
    if isinstance(value, str):
        return xr.full_like(var, value, dtype=f"<U{max(1, len(value))}")
    if isinstance(value, (bool, np.bool_)):
        return xr.full_like(var, value, dtype=bool)
    return xr.full_like(var, value, dtype=float)


def _as_str(ds: xr.Dataset) -> xr.Dataset:
    """Object-dtype variables (strings as netCDF readers may return them) as fixed-width str."""
    for name in list(ds.data_vars):
        if ds[name].dtype.kind == "O":
            ds[name] = ds[name].astype(str)
    return ds


def stack_runs(
    parts: Sequence[xr.Dataset | None], missing: Mapping[str, Any] | None = None
) -> xr.Dataset | None:
    """Concatenate one dataset per run along ``run``.

    A ``None`` part is a run without that dataset: it gets the first present part's
    variables filled by :func:`missing_like` (``missing[name]`` where given).  Other
    axes are joined by union (values off a run's own grid are NaN).  Attributes are the
    first present part's.  Returns None when every part is None.
    """
    present = [_as_str(p) for p in parts if p is not None]
    if not present:
        return None
    missing = dict(missing or {})
    first = present[0]
    template = first.copy()
    for name in first.data_vars:
        template[name] = missing_like(first[name], missing.get(name))
    it = iter(present)
    filled = [next(it) if p is not None else template for p in parts]
    table = xr.concat(filled, dim=RUN, join="outer", data_vars="all", coords="minimal", compat="override",
                      fill_value=np.nan)
    table.attrs = dict(first.attrs)
    return table


def stack_run_files(
    specs: Sequence[Spec],
    store: RunStore,
    name: str,
    use: Sequence[bool],
    positional: Sequence[str] = (),
    missing: Mapping[str, Any] | None = None,
) -> xr.Dataset | None:
    """:func:`stack_runs` over the per-run file ``name`` (e.g. ``analysis.nc``) of the
    runs where ``use`` is True and the file exists (the others are missing).

    ``positional``: axes whose coordinate values are replaced by 0, 1, … in each run, so
    that runs line up by position (e.g. the index of an eigenvalue).
    """
    parts: list[xr.Dataset | None] = []
    for spec, ok in zip(specs, use):
        if not ok or not store.has_file(spec, name):
            parts.append(None)
            continue
        ds = store.read_dataset(spec, name)
        for dim in positional:
            if dim in ds.dims:
                ds = ds.assign_coords({dim: np.arange(ds.sizes[dim])})
        parts.append(ds)
    return stack_runs(parts, missing)


def _kind(results: Sequence[Any], name: str) -> str:
    """dtype kind of a result field: from its declared type (pydantic models) — 'b' for
    bool, 'U' for str, 'f' otherwise — or from the values when undeclared."""
    for r in results:
        fields = getattr(type(r), "model_fields", {})
        if name in fields:
            types = set(typing.get_args(fields[name].annotation)) or {fields[name].annotation}
            types.discard(type(None))
            return "b" if types == {bool} else "U" if types == {str} else "f"
    known = [getattr(r, name) for r in results if getattr(r, name) is not None]
    if known and all(isinstance(v, str) for v in known):
        return "U"
    if known and all(isinstance(v, (bool, np.bool_)) for v in known):
        return "b"
    return "f"


def result_columns(results: Sequence[Any], names: Sequence[str]) -> dict[str, tuple[str, np.ndarray]]:
    """Scalar fields ``names`` of typed results (attributes) as ``run`` variables
    ``{name: ("run", values)}``: strings as str (None -> ''), booleans as bool (None ->
    False), numbers as float (None -> NaN)."""
    out = {}
    for n in names:
        values = [getattr(r, n) for r in results]
        kind = _kind(results, n)
        if kind == "U":
            col = np.array(["" if v is None else v for v in values], dtype=str)
        elif kind == "b":
            col = np.array([bool(v) for v in values], dtype=bool)
        else:
            col = np.array([np.nan if v is None else v for v in values], dtype=float)
        out[n] = (RUN, col)
    return out


def training_curves(results: Sequence[Any]) -> xr.Dataset:
    """The training-loss curves of typed results (fields ``loss_curve_step``,
    ``loss_curve``, ``converged`` of :class:`dynlab.runner.protocol.RunResult`) as variables:
    ``train_loss_curve(run, loss_point)`` with its steps as the coordinate ``train_step(run, loss_point)``
    (each run its own steps, so runs of different lengths share no padded step axis; a
    run with fewer points is NaN after its last one) and ``converged(run)`` (False where
    a run has no curve).  An empty Dataset when no result has a curve."""
    from dynlab.results.vocabulary import attrs_of
    from dynlab.training import CONVERGED_RULE

    curves = [getattr(r, "loss_curve", None) or [] for r in results]
    width = max((len(c) for c in curves), default=0)
    if width == 0:
        return xr.Dataset()
    loss = np.full((len(results), width), np.nan)
    step = np.full((len(results), width), np.nan)
    for i, (r, c) in enumerate(zip(results, curves)):
        loss[i, :len(c)] = c
        step[i, :len(c)] = (getattr(r, "loss_curve_step", None) or [])[:len(c)]
    flags = np.array([bool(getattr(r, "converged", None)) for r in results], dtype=bool)
    return xr.Dataset({"train_loss_curve": ((RUN, "loss_point"), loss, attrs_of("train_loss_curve")),
                       "converged": ((RUN,), flags, attrs_of("converged", rule=CONVERGED_RULE))},
                      coords={"train_step": ((RUN, "loss_point"), step, attrs_of("train_step"))})


def converged_flags(ds: xr.Dataset) -> np.ndarray:
    """``converged(run)`` recomputed from a dataset's ``train_loss_curve`` by
    :func:`dynlab.training.converged`: each run's points up to its last step (``train_step``
    finite), judged as a warm start where the ``phase`` coordinate says ``post`` (a
    post-training arm).  What :func:`training_curves` stores for runs trained now; for a
    dataset whose flags came from an older rule, the flags of the current one."""
    from dynlab.training import converged

    loss, step = ds["train_loss_curve"].values, ds["train_step"].values
    warm = (ds["phase"].values.astype(str) == "post") if "phase" in ds.coords else np.zeros(loss.shape[0], bool)
    return np.array([converged(list(row[np.isfinite(at)]), bool(w)) for row, at, w in zip(loss, step, warm)],
                    dtype=bool)


def spec_coords(specs: Sequence[Spec], **columns: Callable[[Spec], Any]) -> dict[str, Any]:
    """Coordinates on ``run``: ``run`` = 0 … n-1, ``run_id`` = each spec's hash, and one
    coordinate per keyword (a function of the spec; strings stored as str)."""
    coords: dict[str, Any] = {
        RUN: np.arange(len(specs)),
        "run_id": (RUN, np.array([s.spec_hash() for s in specs], dtype=str)),
    }
    for name, fn in columns.items():
        values = [fn(s) for s in specs]
        coords[name] = (RUN, np.array(values, dtype=str) if all(isinstance(v, str) for v in values) else np.array(values))
    return coords


def assemble_runs(
    specs: Sequence[Spec],
    results: Sequence[Any],
    per_run: Callable[[Spec, Any], xr.Dataset | None],
    columns: Sequence[str] = ("status", "reason", "train_loss", "train_time"),
    coords: Mapping[str, Callable[[Spec], Any]] | None = None,
    result_coords: Sequence[str] = (),
    missing: Mapping[str, Any] | None = None,
) -> xr.Dataset:
    """The usual study dataset: ``per_run(spec, result)`` datasets stacked on ``run``
    (:func:`stack_runs`; None for a run without one), the scalar result fields
    ``columns`` as variables and ``result_coords`` as coordinates
    (:func:`result_columns`), the training curves (:func:`training_curves`) and the
    spec coordinates ``coords`` (:func:`spec_coords`).
    """
    stacked = stack_runs([per_run(s, r) for s, r in zip(specs, results)], missing)
    ds = stacked if stacked is not None else xr.Dataset()
    ds = ds.assign(result_columns(results, columns)).merge(training_curves(results))
    ds = ds.assign_coords({k: v for k, v in result_columns(results, result_coords).items()})
    return ds.assign_coords(spec_coords(specs, **dict(coords or {})))
