"""The dataset layout of a language-model run: each quantity on its own positions.

:func:`result_to_dataset` turns one run's ``result.json`` (:class:`dynlab.lm.results.LMResult`)
into a Dataset whose curves are each on their own position axis (``t``, ``t_bin``,
``t_effrem``, ``t_state``), so that no quantity is padded with NaN onto another's grid and
``ds.ppl_binned.plot()`` draws a curve.  :func:`split_positions` converts a dataset written
with every curve on one shared ``t`` into that layout.  Torch-free.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import xarray as xr

from dynlab.results.vocabulary import annotate

__all__ = ["POSITION_AXES", "result_to_dataset", "split_positions"]

#: The position axis of each LM curve (the rest of its name's family shares it).
POSITION_AXES = {"ppl": "t", "ppl_binned": "t_bin", "effrem": "t_effrem", "effrem_js": "t_effrem",
                 "effrem_cos": "t_effrem", "state_mean": "t_state", "state_std": "t_state", "state_norm": "t_state"}


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
              "t_bin_start": ("t_bin", np.concatenate([[1], ends[:-1] + 1]) if ends.size else ends),
              "t_effrem": np.asarray(result["effrem_t"], dtype=np.int64),
              "t_state": np.asarray(result["state_t"], dtype=np.int64),
              "layer": np.arange(n_layers), "head": np.arange(n_heads)}
    return annotate(xr.Dataset(data, coords=coords))


def _bin_starts(ends: np.ndarray) -> np.ndarray:
    return np.concatenate([[1], ends[:-1] + 1]) if ends.size else ends


def split_positions(ds: xr.Dataset) -> xr.Dataset:
    """A length-generalization dataset with every curve on one shared ``t`` (NaN off each
    quantity's own grid), relaid out as :func:`result_to_dataset` writes it: each curve of
    :data:`POSITION_AXES` on its own positions, those where any of its values is finite.
    The values are unchanged; a dataset already split is returned as it is."""
    if "t" not in ds.dims or not any(v in ds and "t" in ds[v].dims and axis != "t" for v, axis in POSITION_AXES.items()):
        return ds
    out = ds.copy()
    for axis in ("t_bin", "t_effrem", "t_state"):
        names = [v for v, a in POSITION_AXES.items() if a == axis and v in ds and "t" in ds[v].dims]
        if not names:
            continue
        finite = np.zeros(ds.sizes["t"], dtype=bool)
        for v in names:
            finite |= ds[v].notnull().any([d for d in ds[v].dims if d != "t"]).values
        keep = ds["t"].values[finite]
        for v in names:
            out[v] = ds[v].sel(t=keep).rename(t=axis).drop_vars("t", errors="ignore").assign_coords({axis: keep})
        if axis == "t_bin":
            out = out.assign_coords(t_bin_start=("t_bin", _bin_starts(np.asarray(keep, dtype=np.int64))))
    if "ppl" in ds and "t" in ds["ppl"].dims:
        ppl_t = ds["t"].values[ds["ppl"].notnull().any([d for d in ds["ppl"].dims if d != "t"]).values]
        out = out.sel(t=ppl_t)
    return annotate(out)
