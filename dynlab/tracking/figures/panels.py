"""Figure panels for the group-tracking studies (paper A): pure ``(ds, ax) -> ax`` functions.

This module draws what the runs measure along the sequence: the accuracy heatmap, q(t),
T_cross and the horizon forecast against mp, and R∥/R⊥; the dynamics panels (return-map
and fixed-point eigenvalues, perturbation recovery, failure modes, margin) are
:mod:`dynlab.tracking.figures.dynamics`, the nonlinearity ablation's :mod:`dynlab.tracking.figures.ablation`,
and what they share (run selection, orders, colours) :mod:`dynlab.tracking.figures.runs`.

Each panel reads a study dataset (dim ``run`` with coords ``arch``, ``family``, ``group``,
``seed``, ``nonlinearity``; see :mod:`dynlab.results.vocabulary`), labels its axes from the
variables' ``long_name``/``units`` and draws on the given axes only: no torch, no file
I/O.  Each panel declares the variables it reads (:func:`dynlab.figures.panel.needs`);
called without them (e.g. on a study run with ``--no-analysis``) it raises
:class:`~dynlab.figures.panel.MissingVariables`, and with nothing to draw in them (no
finished run) :class:`~dynlab.figures.panel.NothingToDraw`; :func:`dynlab.figures.write_figures`
skips the first with a note and draws the second as an empty panel saying why.  Only runs with ``status == 'ok'`` are drawn, except in the return-map panel, which
marks the runs that never learned their task (``status == 'not-learned'``) apart.

Pooled curves (R∥/R⊥, perturbation recovery) are medians over the runs of a family with
the inter-quartile range shaded; scale-dependent quantities are made scale-free first
(R∥ and R⊥ divided by the separation M(t); perturbation size divided by its size at
injection), so runs of different widths and architectures can be pooled.
"""


from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from dynlab.figures.panel import NothingToDraw, needs
from dynlab.tracking.figures.runs import (
    ORDER, PHI_ORDER, arch_order, color_of, in_group, median_band, mp_floor, mp_ticks, nonempty, ok_runs, ordered, strs,
    tau_of, title_suffix,
)
from dynlab.figures.legends import legend
from dynlab.figures.style import FAMILY_COLORS, arch_color, axis_label, family_color, log_axis

__all__ = [
    "MissingData",
    "accuracy_heatmap",
    "default_variant",
    "horizon_forecast_scatter",
    "q_curves",
    "r_par_perp",
    "tcross_mp_scatter",
    "uncensored_pearson",
]

#: Ratios at or below this are numerical zeros (e.g. R(1) = 0 with a fixed initial state) and
#: are not drawn on log axes.
_ZERO = 1e-10




@needs("{variable}", "{by}", "length", what="accuracy heatmap")
def accuracy_heatmap(
    ds: xr.Dataset, ax: Axes, group: str | None = None, variable: str = "accuracy", by: str = "arch"
) -> Axes:
    """Accuracy vs length as a heatmap: rows = ``by`` (architecture), columns = evaluated
    lengths, colour = mean over the learned seeds (status ok) of ``variable`` for one group
    (default: the first).  A row with seeds that did not learn is labelled ``arch (k/n)``
    (k of n learned); a row none of whose seeds learned is hatched grey, "not learned"."""
    panel = "accuracy heatmap"
    everyone = ds
    ds = ok_runs(ds)
    if group is None and "group" in ds.coords and ds.sizes["run"]:
        group = ordered(strs(ds, "group"))[0]
    ds = nonempty(in_group(ds, group), panel)
    everyone = in_group(everyone, group)
    rows = arch_order(everyone) if by == "arch" else ordered(strs(everyone, by), PHI_ORDER)
    keys = strs(ds, by)
    all_keys = strs(everyone, by)
    learned = {r: int((keys == r).sum()) for r in rows}
    trained = {r: int((all_keys == r).sum()) for r in rows}
    acc = np.asarray(ds[variable].values, dtype=np.float64)  # [run, length]
    mat = np.full((len(rows), acc.shape[1]), np.nan)
    for i, r in enumerate(rows):
        sel = acc[keys == r]
        if np.isfinite(sel).any():
            mat[i] = np.nanmean(np.where(np.isfinite(sel), sel, np.nan), axis=0)
    im = ax.imshow(mat, aspect="auto", vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
    lengths = np.asarray(ds["length"].values)
    ax.set_xticks(np.arange(lengths.size))
    ax.set_xticklabels([str(int(L)) for L in lengths], rotation=45, ha="right", rotation_mode="anchor")
    ax.set_yticks(np.arange(len(rows)))
    # a row with seeds that did not learn says how many learned; a row with none is hatched
    ax.set_yticklabels([r if learned[r] == trained[r] else f"{r} ({learned[r]}/{trained[r]})" for r in rows])
    for i, r in enumerate(rows):
        if learned[r] == 0:
            ax.add_patch(Rectangle((-0.5, i - 0.5), lengths.size, 1.0, facecolor="0.92", edgecolor="0.6",
                                   hatch="////", linewidth=0))
            ax.text((lengths.size - 1) / 2, i, f"not learned ({trained[r]} seed{'s' if trained[r] != 1 else ''})",
                    ha="center", va="center", fontsize=6, color="0.3",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0})
    if by == "arch":
        fam_of = dict(zip(strs(everyone, "arch"), strs(everyone, "family")))
        for tick, r in zip(ax.get_yticklabels(), rows):
            tick.set_color(family_color(fam_of.get(r, "")))
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ax.set_xlabel(axis_label(ds["length"], "sequence length"))
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cb.set_label(axis_label(ds[variable], variable))
    cb.outline.set_linewidth(0.4)
    ax.set_title(f"Accuracy vs length{title_suffix(ds, group)}")
    return ax


@needs("{variable}", "t", what="q(t) curves")
def q_curves(
    ds: xr.Dataset, ax: Axes, group: str | None = None, variable: str = "q", color_by: str = "family"
) -> Axes:
    """q(t) = R/M per run (log–log), coloured by ``color_by``; the threshold τ as a dashed line
    and each run's T_cross marked with a cross on its curve.  Numerical zeros (q ≤ 1e-10,
    e.g. at t = 1 where R(1) = 0) are not drawn."""
    panel = "q(t) curves"
    ds = nonempty(in_group(ok_runs(ds), group), panel)
    t = np.asarray(ds["t"].values, dtype=np.float64)
    q = np.asarray(ds[variable].values, dtype=np.float64)  # [run, t]
    keys = strs(ds, color_by)
    tname = "T_cross" if variable == "q" else f"T_cross_{variable[2:]}"
    tcross = np.asarray(ds[tname].values, dtype=np.float64) if tname in ds else np.full(q.shape[0], np.nan)
    drawn = 0
    for i in range(q.shape[0]):
        row = np.where(q[i] > _ZERO, q[i], np.nan)
        if not np.isfinite(row).any():
            continue
        c = color_of(color_by, keys[i])
        ax.plot(t, row, color=c, alpha=0.75, linewidth=0.8)
        drawn += 1
        if np.isfinite(tcross[i]):
            j = int(np.argmin(np.abs(t - tcross[i])))
            ax.plot([t[j]], [row[j]], marker="x", color=c, markersize=4, markeredgewidth=1.0, linestyle="none")
    if drawn == 0:
        raise NothingToDraw(f"{panel}: every run's {variable} is NaN")
    tau = tau_of(ds)
    ax.axhline(tau, color="black", linestyle="--", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel(axis_label(ds["t"], "step"))
    ax.set_ylabel(axis_label(ds[variable], variable))
    handles = [Line2D([], [], color=color_of(color_by, k), label=k) for k in ordered(keys, ORDER)]
    handles += [
        Line2D([], [], color="black", linestyle="--", linewidth=0.7, label=f"τ = {tau:g}"),
        Line2D([], [], color="black", marker="x", linestyle="none", label="T_cross"),
    ]
    legend(ax, handles)
    what = {"q": "q(t)", "q_par": "q∥(t) = R∥/M", "q_dec": "q_dec(t), trained decoder",
            "q_pair_out": "q_pair(t), readout features", "q_pair": "q_pair(t), state"}.get(variable, variable)
    ax.set_title(f"Distinguishability ratio {what}{title_suffix(ds, group)}")
    return ax


def _corr_label(ds: xr.Dataset, variant: str) -> str:
    """r and ρ with their 95 % bootstrap CIs of ``variant`` ('replace' censoring), from the
    study's ``corr_*(variant, censoring)`` table, as ``r = 0.87 [0.80, 0.92]``,
    ``ρ = 0.81 [0.70, 0.90]`` and ``n = 8 (95 % CIs)`` on three lines."""
    if "corr_r" not in ds or variant not in ds["variant"].values:
        return "r, ρ: not in dataset\n(< 3 ok runs)"
    row = {k: float(ds[f"corr_{k}"].sel(variant=variant, censoring="replace"))
           for k in ("r", "r_lo", "r_hi", "rho", "rho_lo", "rho_hi", "n")}
    if not np.isfinite(row["r"]):
        return "r, ρ undefined\n(T_cross or mp constant)"
    return (f"r = {row['r']:.2f} [{row['r_lo']:.2f}, {row['r_hi']:.2f}]\n"
            f"ρ = {row['rho']:.2f} [{row['rho_lo']:.2f}, {row['rho_hi']:.2f}]\nn = {int(row['n'])} (95 % CIs)")


def default_variant(ds: xr.Dataset) -> str:
    """The study's default crossing-time variant (chosen on held-out seeds; 'q' when absent)."""
    return str(ds.attrs.get("corr_default_variant", "q"))


def _tcross_name(variant: str) -> str:
    """Dataset variable of a crossing-time variant (the names of
    :data:`dynlab.analysis.correlation.CROSSING_VARIANTS` and ``FORECAST_VARIANTS``)."""
    if variant == "q":
        return "T_cross"
    if variant == "probe":
        return "T_probe"
    if variant == "forecast_horizon":
        return "T_horizon"
    if variant.startswith("forecast_"):
        return f"T_{variant}"
    return f"T_cross_{variant[2:]}"


@needs(lambda ds, o: _tcross_name(o["variant"] or default_variant(ds)), "mp", what="T_cross vs mp")
def tcross_mp_scatter(ds: xr.Dataset, ax: Axes, color_by: str = "family", variant: str | None = None) -> Axes:
    """T_cross against mp, one point per ``ok`` run (log–log).  ``variant`` names the
    readability ratio that defines T_cross (:data:`dynlab.analysis.correlation.CROSSING_VARIANTS`;
    default: the study's default variant, :func:`default_variant`).  Censored values are
    drawn at their bound with open markers (T_cross: never crossed → the run's horizon; mp:
    passed every length); mp = 0 (failed at the first length) is drawn at half the shortest
    length (or mp), the '0' of the axis; ``×k`` marks k censored runs drawn on one point.
    The legend's title gives Pearson r and Spearman ρ with their bootstrap CIs over all
    runs (censored ones at their bounds, the study's table), and Pearson r with its 95 % CI
    over the uncensored runs alone (:func:`uncensored_pearson`), since a stack of censored
    runs at one corner can make the first; the legend goes right of the axes where no
    place inside is free (:func:`~dynlab.figures.legends.fit_legends`)."""
    variant = variant or default_variant(ds)
    variable = _tcross_name(variant)
    panel = f"{variable} vs mp"
    ds = nonempty(ok_runs(ds), panel)
    tc = np.asarray(ds[variable].values, dtype=np.float64)
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    horizon = (
        np.asarray(ds["horizon"].values, dtype=np.float64)
        if "horizon" in ds
        else np.full(tc.shape, float(np.nanmax(ds["length"].values)) if "length" in ds else np.nan)
    )
    tc_cens = ~np.isfinite(tc)
    x = np.where(tc_cens, horizon, tc)
    mp_cens = np.asarray(ds["mp_censored"].values).astype(bool) if "mp_censored" in ds else np.zeros(mp.shape, bool)
    floor = mp_floor(ds, mp)  # log axis: mp = 0 (failed at the first length) is drawn at the floor, '0'
    y = np.where(mp <= 0, floor, mp)
    keys = strs(ds, color_by)
    for k in ordered(keys, ORDER):
        for cens, face in ((False, None), (True, "none")):
            sel = (keys == k) & ((tc_cens | mp_cens) == cens) & np.isfinite(x) & np.isfinite(y)
            if sel.any():
                c = color_of(color_by, k)
                ax.scatter(x[sel], y[sel], s=14, marker="o", facecolors=face or c, edgecolors=c, linewidths=0.8)
    shown = np.isfinite(x) & np.isfinite(y)
    if not shown.any():
        raise NothingToDraw(f"{panel}: no run has finite T_cross (or horizon) and mp")
    lo = min(float(np.nanmin(x)), float(np.nanmin(y)))
    hi = max(float(np.nanmax(x)), float(np.nanmax(y)))
    ax.plot([lo, hi], [lo, hi], color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    mp_ticks(ax, ds, floor, zero=bool((shown & (mp <= 0)).any()))
    ax.set_xlabel(axis_label(ds[variable], variable))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [
        Line2D([], [], marker="o", color=color_of(color_by, k), linestyle="none", label=k)
        for k in ordered(keys, ORDER)
    ]
    censored = (tc_cens | mp_cens) & shown
    handles.append(Line2D([], [], marker="o", markerfacecolor="none", color="#555555", linestyle="none",
                          label=f"censored (at its bound): {int(censored.sum())}"))
    _stack_counts(ax, x[censored], y[censored], lo, hi)
    uncensored = ~(tc_cens | mp_cens) & (mp > 0) & np.isfinite(tc) & np.isfinite(mp)
    alone = uncensored_pearson(tc[uncensored], mp[uncensored]).replace(", n = ", "\nn = ")
    # the statistics head the legend, which goes right of the (square-ish) axes when no corner is free
    legend(ax, handles, beside="right", loc="upper left", fontsize=6, alignment="left", title_fontsize=6,
           title=f"all, censored at bounds:\n{_corr_label(ds, variant)}\nuncensored only:\n{alone}")
    ax.set_title(f"Crossing time ({variant}) vs max-pass length")
    return ax


def uncensored_pearson(t_cross: np.ndarray, mp: np.ndarray, ci_level: float = 0.95) -> str:
    """Pearson r of T_cross and mp over the runs where neither is censored, with its
    ``ci_level`` confidence interval (Fisher's z, ``scipy.stats.pearsonr``), as
    ``r = 0.45 [0.21, 0.64], n = 40``; "undefined" below 3 runs or for a constant variable."""
    from scipy.stats import pearsonr

    a, b = np.asarray(t_cross, dtype=float), np.asarray(mp, dtype=float)
    if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return f"r undefined, n = {a.size}"
    res = pearsonr(a, b)
    lo, hi = res.confidence_interval(ci_level)
    return f"r = {res.statistic:.2f} [{lo:.2f}, {hi:.2f}], n = {a.size}"


def _stack_counts(ax: Axes, x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> None:
    """Write ``×k`` beside every point that ``k > 1`` censored runs share, so a stack of
    censored runs at one bound is seen as many runs, not one: level with it, to its right,
    or to its left in the right part of the log view ``[lo, hi]`` (inside the axes, where
    no legend is put on it; off the diagonal, which leaves the point downwards)."""
    if x.size == 0:
        return
    points, counts = np.unique(np.stack([x, y], axis=1), axis=0, return_counts=True)
    span = max(np.log(hi / lo), 1e-9)
    for (px, py), k in zip(points, counts):
        if k > 1:
            right = np.log(px / lo) / span > 0.7
            ax.annotate(f"×{k}", (px, py), xytext=(-5 if right else 5, 0), textcoords="offset points",
                        ha="right" if right else "left", va="center", fontsize=6, color="#555555")


def _loglog_label(x: np.ndarray, y: np.ndarray) -> str:
    """Pearson r and Spearman ρ of (log x, log y) over the failing runs drawn filled."""
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return f"failing runs: n = {x.size}\n(r undefined)"
    lx, ly = np.log(x), np.log(y)
    r = float(np.corrcoef(lx, ly)[0, 1])
    from scipy.stats import rankdata  # ranks 1..n, ties sharing their average rank

    rho = float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])
    return f"failing runs (log–log):\nr = {r:.2f}, ρ = {rho:.2f}, n = {x.size}"


@needs("T_horizon", "mp", "arch", what="horizon forecast vs mp")
def horizon_forecast_scatter(ds: xr.Dataset, ax: Axes) -> Axes:
    """Predicted horizon ``T_horizon`` (from steps ≤ the training length) against the
    measured max-pass length mp, one point per ``ok`` run coloured by architecture, log–log.

    Filled: failing runs with a finite forecast (mp below the evaluated horizon), the runs of
    the 'drop' rule; the legend gives their Pearson r and Spearman ρ of the logarithms.  Open:
    censored runs at their bound (T_horizon NaN → the run's horizon; mp passed every length
    → its largest length).  mp = 0 is drawn at half the shortest length (or mp), the '0'
    of the axis."""
    panel = "T_horizon vs mp"
    ds = nonempty(ok_runs(ds), panel)
    pred = np.asarray(ds["T_horizon"].values, dtype=np.float64)
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    horizon = (np.asarray(ds["horizon"].values, dtype=np.float64) if "horizon" in ds
               else np.full(pred.shape, float(np.nanmax(ds["length"].values)) if "length" in ds else np.nan))
    pred_cens = ~np.isfinite(pred)
    mp_cens = np.asarray(ds["mp_censored"].values).astype(bool) if "mp_censored" in ds else np.zeros(mp.shape, bool)
    floor = mp_floor(ds, mp)
    x = np.where(pred_cens, horizon, np.maximum(pred, floor))
    y = np.where(mp > 0, mp, floor)
    drawable = np.isfinite(x) & np.isfinite(y)
    if not drawable.any():
        raise NothingToDraw(f"{panel}: no run has a finite forecast (or horizon) and mp")
    failing = ~pred_cens & ~mp_cens & drawable
    archs = strs(ds, "arch")
    for a in arch_order(ds):
        c = arch_color(a)
        for sel, face in ((failing, c), (~failing & drawable, "none")):
            pick = sel & (archs == a)
            if pick.any():
                ax.scatter(x[pick], y[pick], s=14, marker="o", facecolors=face, edgecolors=c, linewidths=0.8)
    lo, hi = float(min(x[drawable].min(), y[drawable].min())), float(max(x[drawable].max(), y[drawable].max()))
    ax.plot([lo, hi], [lo, hi], color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    mp_ticks(ax, ds, floor, zero=bool((drawable & (mp <= 0)).any()))
    ax.set_xlabel(axis_label(ds["T_horizon"], "T_horizon"))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [Line2D([], [], marker="o", color=arch_color(a), linestyle="none", label=a) for a in arch_order(ds)]
    handles.append(Line2D([], [], marker="o", markerfacecolor="none", color="#555555", linestyle="none",
                          label="censored"))
    handles.append(Patch(visible=False, label=_loglog_label(x[failing], y[failing])))
    legend(ax, handles, beside="right", fontsize=6)
    ax.set_title("Horizon forecast (t ≤ t_ref) vs mp")
    return ax


@needs("R_par", "R_perp", "M", "t", what="R_par vs R_perp")
def r_par_perp(ds: xr.Dataset, ax: Axes, group: str | None = None) -> Axes:
    """R∥(t)/M(t) (solid) and R⊥(t)/M(t) (dashed): scatter along U and orthogonal to it in
    units of the centroid separation, median over the runs of each family, IQR shaded."""
    panel = "R_par vs R_perp"
    ds = nonempty(in_group(ok_runs(ds), group), panel)
    t = np.asarray(ds["t"].values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        par = np.asarray(ds["R_par"].values / ds["M"].values, dtype=np.float64)
        perp = np.asarray(ds["R_perp"].values / ds["M"].values, dtype=np.float64)
    par[~np.isfinite(par) | (par <= _ZERO)] = np.nan
    perp[~np.isfinite(perp) | (perp <= _ZERO)] = np.nan
    fams = strs(ds, "family")
    for fam in ordered(fams, tuple(FAMILY_COLORS)):
        sel = fams == fam
        c = family_color(fam)
        median_band(ax, t, par[sel], c, "-", None)
        median_band(ax, t, perp[sel], c, "--", None)
    if not (np.isfinite(par).any() or np.isfinite(perp).any()):
        raise NothingToDraw(f"{panel}: R_par/M and R_perp/M are NaN for every run")
    ax.axhline(tau_of(ds), color="black", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel(axis_label(ds["t"], "step"))
    ax.set_ylabel("scatter / separation M")
    handles = [Line2D([], [], color=family_color(f), label=f) for f in ordered(fams, tuple(FAMILY_COLORS))]
    handles += [
        Line2D([], [], color="black", linestyle="-", label="R∥/M (along U)"),
        Line2D([], [], color="black", linestyle="--", label="R⊥/M (orthogonal)"),
        Line2D([], [], color="black", linestyle=":", linewidth=0.7, label=f"τ = {tau_of(ds):g}"),
    ]
    legend(ax, handles)
    ax.set_title(f"Where the error lives{title_suffix(ds, group)}")
    return ax
