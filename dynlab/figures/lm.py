"""Figure panels for the length-generalization study: pure ``(ds, ax) -> ax`` functions.

Each panel draws one line per run of a study dataset (dims ``run``, ``t``; coords
``intervention``, ``arch``, ``train_length``), labels itself from the variables'
``long_name``/``units`` and marks the training length with a dotted vertical line.
No torch, no file I/O.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

from dynlab.figures.panel import Panel, needs
from dynlab.figures.style import axis_label

__all__ = ["EFFREM_NAMES", "PANELS", "effrem_panel", "length_generalization_panels", "ppl_panel", "state_std_panel"]

#: Dataset variable of EffRem under each distance.
EFFREM_NAMES = {"tv": "effrem", "js": "effrem_js", "cos": "effrem_cos"}


def _label(ds: xr.Dataset, run: int) -> str:
    r = ds.sel(run=run)
    parts = []
    if "arch" in ds.coords and len(np.unique(ds["arch"].values)) > 1:
        parts.append(str(r["arch"].values))
    if "intervention" in ds.coords:
        parts.append(str(r["intervention"].values))
    if "seed" in ds.coords and len(np.unique(ds["seed"].values)) > 1:
        parts.append(f"seed {int(r['seed'])}")
    return " / ".join(parts) or f"run {run}"


def _mark_training_length(ds: xr.Dataset, ax: Axes) -> None:
    if "train_length" in ds.coords:
        for length in np.unique(ds["train_length"].values):
            ax.axvline(float(length), color="0.5", linestyle=":", linewidth=1)


def _log2_positions(ax: Axes, t: np.ndarray) -> None:
    """Log-scaled position axis with plain-number ticks at powers of two."""
    t = t[np.isfinite(t) & (t > 0)]
    ax.set_xscale("log")
    if t.size:
        ticks = 2.0 ** np.arange(np.floor(np.log2(t.min())), np.ceil(np.log2(t.max())) + 1)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())


def _lines(ds: xr.Dataset, da: xr.DataArray, ax: Axes, mark_training: bool = True) -> Axes:
    for run in ds["run"].values:
        line = da.sel(run=run).dropna("t")
        if line.size:
            ax.plot(line["t"].values, line.values, label=_label(ds, int(run)))
    ax.set_xlabel("position t [tokens]")
    if mark_training:
        _mark_training_length(ds, ax)
    ax.legend(fontsize="small")
    return ax


@needs(lambda ds, o: "ppl_binned" if o["binned"] and "ppl_binned" in ds else "ppl", "t", what="PPL(t)")
def ppl_panel(ds: xr.Dataset, ax: Axes, binned: bool = True) -> Axes:
    """PPL(t) per run (binned by default), log-scaled position axis."""
    name = "ppl_binned" if binned and "ppl_binned" in ds else "ppl"
    _lines(ds, ds[name], ax)
    _log2_positions(ax, ds[name].dropna("t", how="all")["t"].values.astype(float))
    ax.set_ylabel(axis_label(ds[name], "perplexity"))
    ax.set_title("PPL(t) from the zero state")
    return ax


def _effrem_name(ds: xr.Dataset, options: dict) -> str:
    distance = options["distance"]
    if distance not in EFFREM_NAMES:
        raise ValueError(f"distance must be one of {', '.join(EFFREM_NAMES)}, got {distance!r}")
    return EFFREM_NAMES[distance]


@needs(_effrem_name, "t", what="EffRem")
def effrem_panel(ds: xr.Dataset, ax: Axes, distance: str = "tv") -> Axes:
    """EffRem_T(t) per run for ``distance`` in tv, js, cos, against the truncation start t (T = evaluation length)."""
    name = EFFREM_NAMES[distance]
    _lines(ds, ds[name], ax, mark_training=False)
    ax.set_xlabel("truncation start t [tokens]")
    ax.set_ylabel(axis_label(ds[name], "EffRem"))
    ax.set_title("EffRem_T(t), T = evaluation length")
    return ax


@needs("state_std", "t", what="state std")
def state_std_panel(ds: xr.Dataset, ax: Axes, layer: int | None = None) -> Axes:
    """State std per run over position (log scale), averaged over heads (and layers unless ``layer`` is given)."""
    da = ds["state_std"]
    da = da.sel(layer=layer).mean("head") if layer is not None else da.mean(("layer", "head"))
    da.attrs = ds["state_std"].attrs
    _lines(ds, da, ax)
    _log2_positions(ax, da.dropna("t", how="all")["t"].values.astype(float))
    ax.set_yscale("log")
    ax.set_ylabel(axis_label(ds["state_std"], "state std"))
    ax.set_title("State std vs position" + (f" (layer {layer})" if layer is not None else ""))
    return ax


PANELS = {"ppl": ppl_panel, "effrem": effrem_panel, "state_std": state_std_panel}


def length_generalization_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """The panels of a length-generalization dataset: PPL(t), EffRem (TV) and the state std."""
    return {name: Panel(fn) for name, fn in PANELS.items()}
