"""What the group-tracking panels share: which runs are drawn, in which order and colour.

The run selection (:func:`ok_runs`, :func:`in_group`, :func:`nonempty`), the orders of
architectures, families and nonlinearities (:func:`arch_order`, :func:`ordered`,
:data:`PHI_ORDER`), the colours of nonlinearities and failure modes, and the small drawing
helpers (:func:`median_band`, :func:`mp_floor`, :func:`mp_ticks`) used by :mod:`dynlab.tracking.figures.panels`,
:mod:`dynlab.tracking.figures.dynamics` and :mod:`dynlab.tracking.figures.ablation`.  No torch, no file I/O.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import matplotlib.ticker
import numpy as np
import xarray as xr
from matplotlib.axes import Axes

from dynlab.names import ABLATION_NONLINEARITIES
from dynlab.figures.panel import NothingToDraw
from dynlab.figures.style import arch_color, family_color, finite

#: Order of the nonlinearities in the ablation (state-dependent first, normalisations last).
PHI_ORDER = (*ABLATION_NONLINEARITIES, "identity", "default")
FAILURE_MODES = ("robust", "climb", "saturation")
ORDER = ("affine", "state-dependent", *PHI_ORDER)
MODE_COLORS = {"robust": "#2b8a3e", "climb": "#f08c00", "saturation": "#c92a2a", "not analysed": "#adb5bd"}
MODE_MARKERS = {"robust": "o", "climb": "^", "saturation": "s", "not analysed": "x", "not learned": "+"}
PHI_COLORS = {
    "tanh": "#cb181d",
    "relu": "#fd8d3c",
    "maxmin": "#8c2d04",
    "groupsort": "#e7298a",
    "layernorm": "#2171b5",
    "sphere": "#41ab5d",
    "identity": "#555555",
    "default": "#555555",
}


def ok_runs(ds: xr.Dataset) -> xr.Dataset:
    """Runs with status 'ok' (all runs when there is no ``status``)."""
    if "status" in ds:
        keep = np.asarray(ds["status"].values).astype(str) == "ok"
        ds = ds.isel(run=np.flatnonzero(keep))
    return ds


def in_group(ds: xr.Dataset, group: str | None) -> xr.Dataset:
    if group is None or "group" not in ds.coords:
        return ds
    groups = np.asarray(ds["group"].values).astype(str)
    if groups.size and group not in groups:  # no run left at all: the caller's nonempty says so
        raise NothingToDraw(f"group {group!r} not in the dataset (groups: {', '.join(sorted(set(groups)))})")
    return ds.isel(run=np.flatnonzero(groups == group))


def nonempty(ds: xr.Dataset, panel: str) -> xr.Dataset:
    if ds.sizes.get("run", 0) == 0:
        raise NothingToDraw(f"{panel} has no finished runs to draw")
    return ds


def strs(ds: xr.Dataset, name: str, default: str = "") -> np.ndarray:
    if name in ds.variables:
        return np.asarray(ds[name].values).astype(str)
    return np.full(ds.sizes.get("run", 0), default)


def ordered(values: Sequence[str], order: Sequence[str] = ()) -> list[str]:
    """Unique values: those in ``order`` first (in that order), then the rest in first-seen order."""
    seen = list(dict.fromkeys(str(v) for v in values))
    first = [v for v in order if v in seen]
    return first + [v for v in seen if v not in first]


def arch_order(ds: xr.Dataset) -> list[str]:
    """Architectures: affine family first, then state-dependent, each in first-seen order."""
    arch, fam = strs(ds, "arch"), strs(ds, "family")
    fam_of = dict(zip(arch, fam))
    archs = ordered(arch)
    rank = {"affine": 0, "state-dependent": 1}
    return sorted(archs, key=lambda a: (rank.get(fam_of.get(a, ""), 2), archs.index(a)))


def color_of(by: str, value: str) -> str:
    if by == "family":
        return family_color(value)
    if by == "nonlinearity":
        return PHI_COLORS.get(value, "#7f7f7f")
    return arch_color(value)


def title_suffix(ds: xr.Dataset, group: str | None) -> str:
    if group is not None:
        return f" — {group}"
    groups = ordered(strs(ds, "group"))
    return f" — {groups[0]}" if len(groups) == 1 else ""


def tau_of(ds: xr.Dataset) -> float:
    for key in ("analysis_tau", "tau"):
        if key in ds.attrs:
            return float(ds.attrs[key])
    return 0.5


def median_band(ax: Axes, x: np.ndarray, rows: np.ndarray, color: str, style: str, label: str | None) -> None:
    """Median over rows ``[n, T]`` with the inter-quartile range shaded (NaN-aware)."""
    if rows.shape[0] == 0 or not np.isfinite(rows).any():
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns give NaN, as wanted
        med = np.nanmedian(rows, axis=0)
        lo, hi = np.nanpercentile(rows, [25, 75], axis=0)
    ax.plot(x, med, color=color, linestyle=style, label=label)
    if rows.shape[0] > 1:
        ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)


def mp_floor(ds: xr.Dataset, mp: np.ndarray) -> float:
    """Where a run with mp = 0 (failed at its first length) is drawn on a log axis: half the
    smallest evaluated length or positive mp, below every run that passed a length (an mp
    pooled over lengths may be smaller than the shortest one)."""
    low = np.concatenate([finite(ds["length"].values) if "length" in ds else np.empty(0), finite(mp)])
    low = low[low > 0]
    return 0.5 * float(low.min()) if low.size else 1.0


def mp_ticks(ax: Axes, ds: xr.Dataset, floor: float, zero: bool = True) -> None:
    """y ticks of an mp axis: the evaluated lengths (thinned to stay readable) and, when a
    run with mp = 0 is drawn (``zero``), '0' at the floor where it is, the axis then
    starting just below it (no point lies under the '0')."""
    if "length" not in ds:
        return
    ticks = [floor]
    for v in np.sort(finite(ds["length"].values)):
        if v / ticks[-1] >= 1.6:
            ticks.append(float(v))
    if zero:
        ax.set_yticks(ticks, ["0", *[f"{v:g}" for v in ticks[1:]]])
        ax.set_ylim(bottom=floor / 1.4)
    else:
        ax.set_yticks(ticks[1:], [f"{v:g}" for v in ticks[1:]])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
