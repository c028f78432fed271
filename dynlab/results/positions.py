"""The position axes of a language model's curves, and each run's curve on its own positions.

Each curve of :data:`POSITION_AXES` has its own position axis
(:func:`dynlab.lm.dataset.result_to_dataset`), so that no quantity is padded with NaN onto
another's grid.  A study's runs share each position axis, though: it is the union of the
runs' positions (a run evaluated on 256 tokens and one on 2048 are stacked on one
``t_bin``), so a run's curve is NaN beyond its own evaluation length and off its own grid.
:func:`curves` gives each run's curve back on its own positions, with no NaN padding, and
its positions relative to the run's training length (``t_rel`` = t / T_train).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.results.vocabulary import annotate

__all__ = ["POSITION_AXES", "POSITION_DIMS", "bin_starts", "curves"]

#: The position axis of each LM curve (the rest of its name's family shares it).
POSITION_AXES = {"ppl": "t", "ppl_binned": "t_bin", "effrem": "t_effrem", "effrem_js": "t_effrem",
                 "effrem_cos": "t_effrem", "state_mean": "t_state", "state_std": "t_state", "state_norm": "t_state"}

#: The position axes of the LM curves (the values of :data:`POSITION_AXES`).
POSITION_DIMS = tuple(dict.fromkeys(POSITION_AXES.values()))


def bin_starts(ends: np.ndarray) -> np.ndarray:
    """The first position of each perplexity bin, from the bin ends (bins are (end_prev, end])."""
    return np.concatenate([[1], ends[:-1] + 1]) if ends.size else ends


def curves(obj: xr.Dataset | xr.DataArray, name: str | None = None) -> list[xr.DataArray]:
    """Each run's curve ``obj[name]`` (or the DataArray ``obj``) on its own positions, none
    padded with NaN: one DataArray per run (in ``run`` order; a run with no finite value is
    left out), ``run`` dropped to a scalar coordinate beside the run's others (``run_id``,
    ``train_length``, ...).  Along every dim, the labels where the run has no finite value are
    dropped: on the position axis (one of :data:`POSITION_DIMS`) those beyond the run's
    evaluation length or off its grid, on ``budget`` the checkpoints it did not make; no
    stored value changes.  With a ``train_length`` coordinate each curve gets ``t_rel`` =
    position / train_length on its position axis, so runs of different training lengths
    line up: ``for c in curves(ds, "ppl_binned"): c.plot(x="t_rel")`` draws a line per run."""
    if isinstance(obj, xr.Dataset):
        if name is None:
            raise TypeError("curves(ds, name) needs the name of a curve of the dataset, e.g. 'ppl_binned'")
        obj = obj[name]
    pos = [d for d in obj.dims if d in POSITION_DIMS]
    if len(pos) != 1:
        raise ValueError(f"{obj.name or 'the curve'} needs exactly one position dim of {', '.join(POSITION_DIMS)}; "
                         f"its dims are {', '.join(map(str, obj.dims)) or 'none'}")
    runs = [obj.isel(run=i) for i in range(obj.sizes["run"])] if "run" in obj.dims else [obj]
    out = []
    for c in runs:
        for d in c.dims:
            c = c.dropna(d, how="all")
        if not c.notnull().any():
            continue
        if "train_length" in c.coords and c["train_length"].ndim == 0:
            c = c.assign_coords(t_rel=(pos[0], c[pos[0]].values / float(c["train_length"])))
        out.append(annotate(c))
    return out
