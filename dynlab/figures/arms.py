"""The arms of a language-model study and how the LM panels draw them.

An *arm* is the set of runs that share every run coord but the seed (:func:`run_arms`,
named by the coords that differ between arms, :data:`ARM_COORDS`).  This module holds
what the position panels (:mod:`dynlab.lm.figures.panels`), the summary panels and the
training-loss panel (:mod:`dynlab.figures.training`) share about them: the colours and
line styles per arm (one colour per arm, or per model size with a line style per
training length, :func:`arm_styles`), the legends (:func:`factored_legend`,
:func:`arm_legend`), a run's last checkpoint on a budget dataset (:func:`final_checkpoint`)
and the powers-of-two axes (:func:`log2_axis`).  No torch, no file I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator, ScalarFormatter

from dynlab.figures.legends import legend

__all__ = ["ARM_COORDS", "BAND", "LINESTYLES", "PALETTE", "SHORT_NAMES", "arm_legend", "arm_styles", "factored_legend", "final_checkpoint", "log2_axis", "run_arms", "run_value", "size_colors", "varying_coords"]

#: Run coords that tell arms apart, in the order a label names them (the seed never does).
ARM_COORDS = ("arch", "intervention", "phase", "d_model", "train_length")


SHORT_NAMES = {"d_model": "d_model", "train_length": "T_train"}


#: One colour per arm (colour-blind-safe, Okabe–Ito order), and a ramp for model sizes.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")


LINESTYLES = ("-", "--", ":", "-.")


BAND = "band: min–max over seeds"


def varying_coords(ds: xr.Dataset, runs: np.ndarray, keys: Sequence[str] = ARM_COORDS) -> list[str]:
    return [k for k in keys if k in ds.coords and ds[k].dims == ("run",)
            and len(np.unique(ds[k].values[runs].astype(str))) > 1]


def run_value(ds: xr.Dataset, key: str, i: int):
    v = ds[key].values[i]
    return v.item() if hasattr(v, "item") else v


def run_arms(ds: xr.Dataset, runs: np.ndarray | None = None) -> list[tuple[str, dict, np.ndarray]]:
    """The arms among ``runs`` (default: all): ``(label, {coord: value}, run positions)`` per
    distinct combination of the varying :data:`ARM_COORDS`, in order of first appearance."""
    runs = np.arange(ds.sizes["run"]) if runs is None else np.asarray(runs)
    keys = varying_coords(ds, runs)
    arms: dict[tuple, list[int]] = {}
    for i in runs:
        arms.setdefault(tuple(run_value(ds, k, int(i)) for k in keys), []).append(int(i))
    out = []
    for combo, idx in arms.items():
        values = dict(zip(keys, combo))
        parts = []
        for k, v in values.items():
            if k == "phase" and "intervention" in values:
                continue
            if k == "intervention" and "phase" in values:
                parts.append(f"{v} ({values['phase']})")
            elif k in SHORT_NAMES:
                parts.append(f"{SHORT_NAMES[k]} {v}")
            else:
                parts.append(str(v))
        fallback = str(run_value(ds, "arch", int(idx[0]))) if "arch" in ds.coords else "all runs"
        out.append((", ".join(parts) or fallback, values, np.array(idx)))
    return out


def size_colors(n: int) -> list[str]:
    """``n`` colours from small to large on the viridis ramp (light yellow-green left out)."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    return [to_hex(colormaps["viridis"](x)) for x in np.linspace(0.05, 0.8, n)] if n > 1 else [PALETTE[0]]


def arm_styles(ds: xr.Dataset, arms: list[tuple[str, dict, np.ndarray]]) -> list[dict]:
    """Colour (and line style) per arm: per size and T_train when those vary, else one colour per arm."""
    values = [a[1] for a in arms]
    if any("d_model" in v for v in values):
        sizes = sorted({v["d_model"] for v in values if "d_model" in v})
        lengths = sorted({v.get("train_length") for v in values}, key=lambda x: (x is None, x))
        ramp = size_colors(len(sizes))
        return [{"color": ramp[sizes.index(v["d_model"])],
                 "linestyle": LINESTYLES[lengths.index(v.get("train_length")) % len(LINESTYLES)]} for v in values]
    return [{"color": PALETTE[i % len(PALETTE)], "linestyle": "-"} for i in range(len(arms))]


def final_checkpoint(da: xr.DataArray) -> xr.DataArray:
    """Per run, the last budget at which ``da`` holds a finite value (``da`` without ``budget``)."""
    if "budget" not in da.dims:
        return da
    other = [d for d in da.dims if d not in ("run", "budget")]
    has = da.notnull().any(other) if other else da.notnull()
    last = (has * np.arange(da.sizes["budget"])).max("budget")
    out = da.isel(budget=last.astype(int))
    return out.drop_vars("budget", errors="ignore")


def log2_axis(ax: Axes, values: np.ndarray, fmt=None, which: str = "x") -> None:
    """Log-scaled axis with ticks at the powers of two spanned by ``values``."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log", base=2)
    if v.size:
        ticks = 2.0 ** np.arange(np.floor(np.log2(v.min())), np.ceil(np.log2(v.max())) + 1)
        if ticks.size > 5:  # every other power of two (or sparser): labels stay apart on a narrow axis
            ticks = ticks[:: int(np.ceil(ticks.size / 5))]
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_major_formatter(FuncFormatter(fmt) if fmt else ScalarFormatter())
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())


def factored_legend(ds: xr.Dataset, arms: list[tuple[str, dict, np.ndarray]], styles: list[dict], lines: list) -> list:
    """Legend handles: one per arm, or, when arms differ by size (colour) and T_train (line
    style), one per size and one per T_train."""
    values = [a[1] for a in arms]
    if not (any("d_model" in v for v in values) and any("train_length" in v for v in values)):
        return lines
    handles, seen = [], set()
    for v, style in zip(values, styles):
        if ("d", v["d_model"]) not in seen:
            seen.add(("d", v["d_model"]))
            handles.append(Line2D([], [], color=style["color"], label=f"d_model {v['d_model']}"))
    for v, style in zip(values, styles):
        if ("T", v["train_length"]) not in seen:
            seen.add(("T", v["train_length"]))
            handles.append(Line2D([], [], color="0.3", linestyle=style["linestyle"], label=f"T_train {v['train_length']}"))
    return handles


def arm_legend(ax: Axes, handles: list, band: bool, inside_up_to: int = 3, **kw) -> None:
    """The legend: inside the axes at matplotlib's best place up to ``inside_up_to``
    entries, beside the axes past them."""
    if band:
        handles = [*handles, Patch(facecolor="0.6", alpha=0.3, label=BAND)]
    if not handles:
        return
    if len(handles) > inside_up_to:
        kw = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, **kw}
    legend(ax, handles, fontsize="small", **kw)
