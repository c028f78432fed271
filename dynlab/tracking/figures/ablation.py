"""Figure panels of the nonlinearity ablation (paper A): mp per nonlinearity φ and the
Markdown table of mp and failure modes per φ and group; pure functions of the study
dataset like :mod:`dynlab.tracking.figures.panels`.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from dynlab.figures.legends import legend
from dynlab.figures.panel import needs
from dynlab.tracking.figures.runs import (
    FAILURE_MODES, MODE_MARKERS, PHI_ORDER, arch_order, mp_floor, mp_ticks, nonempty, ordered, strs,
)
from dynlab.figures.style import axis_label, log_axis

__all__ = [
    "default_mode_variable",
    "mp_by_nonlinearity",
    "mp_failure_table",
]


def default_mode_variable(ds: xr.Dataset) -> str:
    """The failure-mode variable of the study's default crossing variant (attr
    ``corr_default_variant``, e.g. ``q_dec`` -> ``failure_mode_dec``); ``failure_mode`` (the
    literal q's) when the dataset names none or lacks that variable."""
    variant = str(ds.attrs.get("corr_default_variant", "q"))
    name = "failure_mode" + variant[1:] if variant.startswith("q") else "failure_mode_dec"
    return name if name in ds else "failure_mode"


@needs("mp", "nonlinearity", what="mp by nonlinearity")
def mp_by_nonlinearity(ds: xr.Dataset, ax: Axes) -> Axes:
    """Nonlinearity ablation: mp per nonlinearity φ (one point per run, colour = group,
    marker = failure mode, '+' for a run that never reached its training length, median per
    group over the learned runs joined); log y axis, mp = 0 drawn at the floor."""
    panel = "mp by nonlinearity"
    if "status" in ds:
        ds = ds.isel(run=np.flatnonzero(np.isin(strs(ds, "status"), ("ok", "not-learned"))))
    ds = nonempty(ds, panel)
    phis = ordered(strs(ds, "nonlinearity"), PHI_ORDER)
    groups = ordered(strs(ds, "group"))
    gcolors = ("#1b6ca8", "#d9480f", "#5f3dc4", "#2b8a3e", "#862e9c")
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    floor = mp_floor(ds, mp)
    y = np.where(mp > 0, mp, floor)
    modes = strs(ds, default_mode_variable(ds), "not analysed")
    modes = np.where(np.isin(modes, FAILURE_MODES), modes, "not analysed")
    learned = strs(ds, "status", "ok") == "ok"
    modes = np.where(learned, modes, "not learned")
    keys, gk = strs(ds, "nonlinearity"), strs(ds, "group")
    width = 0.6 / max(1, len(groups))
    for gi, g in enumerate(groups):
        off = (gi - (len(groups) - 1) / 2) * width
        c = gcolors[gi % len(gcolors)]
        meds = []
        for pi, p in enumerate(phis):
            sel = (keys == p) & (gk == g) & np.isfinite(y)
            for mode in np.unique(modes[sel]):
                s2 = sel & (modes == mode)
                xs = np.full(s2.sum(), pi + off)
                if MODE_MARKERS[mode] in ("x", "+"):  # unfilled marker: one colour
                    ax.scatter(xs, y[s2], s=16, marker=MODE_MARKERS[mode], color=c, linewidths=0.8)
                else:
                    ax.scatter(xs, y[s2], s=16, marker=MODE_MARKERS[mode], facecolors=c, edgecolors=c,
                               linewidths=0.8)
            meds.append(np.median(y[sel & learned]) if (sel & learned).any() else np.nan)
        ax.plot(np.arange(len(phis)) + off, meds, color=c, linewidth=0.7, alpha=0.7)
    log_axis(ax, "y")
    ax.set_xticks(np.arange(len(phis)))
    ax.set_xticklabels(phis, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(phis) - 0.4)
    if "length" in ds:
        ax.axhline(float(np.nanmax(ds["length"].values)), color="#999999", linestyle=":", linewidth=0.7)
        mp_ticks(ax, ds, floor, zero=bool((np.isfinite(mp) & (mp <= 0)).any()))
    ax.set_xlabel(axis_label(ds["nonlinearity"], "nonlinearity φ"))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [Line2D([], [], color=gcolors[i % len(gcolors)], marker="o", label=g) for i, g in enumerate(groups)]
    handles += [Line2D([], [], color="#555555", marker=MODE_MARKERS[m], linestyle="none", label=m)
                for m in (*FAILURE_MODES, "not analysed", "not learned") if m in set(modes)]
    legend(ax, handles, ncols=2)
    ax.set_title("Nonlinearity ablation: max-pass length")
    return ax


@needs("mp", "{by}", what="mp table")
def mp_failure_table(ds: xr.Dataset, by: str = "nonlinearity") -> str:
    """A Markdown table per (``by``, group): runs, runs that learned (status ``ok``), median
    and range of their mp (``≥`` when the median is censored), the count of each failure
    mode among them, the runs that never reached the training length (``not-learned``) and
    the rest (diverged, or learned but not analysed).  The failure modes are those of the
    study's default crossing variant (:func:`default_mode_variable`)."""
    keys, groups = strs(ds, by), strs(ds, "group")
    status = strs(ds, "status", "ok")
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    cens = np.asarray(ds["mp_censored"].values).astype(bool) if "mp_censored" in ds else np.zeros(mp.shape, bool)
    mode_var = default_mode_variable(ds)
    modes = strs(ds, mode_var, "")
    rows_order = ordered(keys, PHI_ORDER) if by == "nonlinearity" else arch_order(ds)
    head = (f"| {by} | group | runs | learned | mp median | mp min–max | robust | climb | saturation "
            "| not learned | failed/not analysed |")
    lines = [head, "|" + "---|" * 11]
    for r in rows_order:
        for g in ordered(groups):
            sel = (keys == r) & (groups == g)
            if not sel.any():
                continue
            ok = sel & (status == "ok") & np.isfinite(mp)
            if ok.any():
                med = float(np.median(mp[ok]))
                ge = "≥ " if cens[ok].sum() * 2 > ok.sum() else ""
                med_s, rng_s = f"{ge}{med:g}", f"{mp[ok].min():g}–{mp[ok].max():g}"
            else:
                med_s = rng_s = "—"
            counts = [int(np.sum(ok & (modes == m))) for m in FAILURE_MODES]
            not_learned = int(np.sum(sel & (status == "not-learned")))
            other = int(sel.sum()) - sum(counts) - not_learned
            lines.append(f"| {r} | {g} | {int(sel.sum())} | {int(ok.sum())} | {med_s} | {rng_s} | "
                         + " | ".join(str(c) for c in counts) + f" | {not_learned} | {other} |")
    return "\n".join(lines) + "\n"
