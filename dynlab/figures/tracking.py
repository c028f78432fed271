"""Figure panels for the group-tracking studies (paper A): pure ``(ds, ax) -> ax`` functions.

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

import warnings
from collections.abc import Sequence

import matplotlib.ticker
import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, Patch, Rectangle

from dynlab.figures.panel import MissingData, NothingToDraw, needs
from dynlab.names import ABLATION_NONLINEARITIES
from dynlab.figures.style import FAMILY_COLORS, arch_color, axis_label, family_color, finite, log_axis

__all__ = [
    "MissingData",
    "accuracy_heatmap",
    "failure_modes",
    "fixed_point_spectra",
    "margin_panel",
    "mp_failure_table",
    "mp_by_nonlinearity",
    "perturbation_recovery",
    "q_curves",
    "r_par_perp",
    "return_map_eigs",
    "tcross_mp_scatter",
    "uncensored_pearson",
]

#: Order of the nonlinearities in the ablation (state-dependent first, normalisations last).
PHI_ORDER = (*ABLATION_NONLINEARITIES, "identity", "default")
FAILURE_MODES = ("robust", "climb", "saturation")
_ORDER = ("affine", "state-dependent", *PHI_ORDER)
_MODE_COLORS = {"robust": "#2b8a3e", "climb": "#f08c00", "saturation": "#c92a2a", "not analysed": "#adb5bd"}
_MODE_MARKERS = {"robust": "o", "climb": "^", "saturation": "s", "not analysed": "x", "not learned": "+"}
_PHI_COLORS = {
    "tanh": "#cb181d",
    "relu": "#fd8d3c",
    "maxmin": "#8c2d04",
    "groupsort": "#e7298a",
    "layernorm": "#2171b5",
    "sphere": "#41ab5d",
    "identity": "#555555",
    "default": "#555555",
}


#: Ratios at or below this are numerical zeros (e.g. R(1) = 0 with a fixed initial state) and
#: are not drawn on log axes.
_ZERO = 1e-10


def _ok(ds: xr.Dataset) -> xr.Dataset:
    """Runs with status 'ok' (all runs when there is no ``status``)."""
    if "status" in ds:
        keep = np.asarray(ds["status"].values).astype(str) == "ok"
        ds = ds.isel(run=np.flatnonzero(keep))
    return ds


def _in_group(ds: xr.Dataset, group: str | None) -> xr.Dataset:
    if group is None or "group" not in ds.coords:
        return ds
    groups = np.asarray(ds["group"].values).astype(str)
    if groups.size and group not in groups:  # no run left at all: the caller's _nonempty says so
        raise NothingToDraw(f"group {group!r} not in the dataset (groups: {', '.join(sorted(set(groups)))})")
    return ds.isel(run=np.flatnonzero(groups == group))


def _nonempty(ds: xr.Dataset, panel: str) -> xr.Dataset:
    if ds.sizes.get("run", 0) == 0:
        raise NothingToDraw(f"{panel} has no finished runs to draw")
    return ds


def _strs(ds: xr.Dataset, name: str, default: str = "") -> np.ndarray:
    if name in ds.variables:
        return np.asarray(ds[name].values).astype(str)
    return np.full(ds.sizes.get("run", 0), default)


def _ordered(values: Sequence[str], order: Sequence[str] = ()) -> list[str]:
    """Unique values: those in ``order`` first (in that order), then the rest in first-seen order."""
    seen = list(dict.fromkeys(str(v) for v in values))
    first = [v for v in order if v in seen]
    return first + [v for v in seen if v not in first]


def _arch_order(ds: xr.Dataset) -> list[str]:
    """Architectures: affine family first, then state-dependent, each in first-seen order."""
    arch, fam = _strs(ds, "arch"), _strs(ds, "family")
    fam_of = dict(zip(arch, fam))
    archs = _ordered(arch)
    rank = {"affine": 0, "state-dependent": 1}
    return sorted(archs, key=lambda a: (rank.get(fam_of.get(a, ""), 2), archs.index(a)))


def _color_of(by: str, value: str) -> str:
    if by == "family":
        return family_color(value)
    if by == "nonlinearity":
        return _PHI_COLORS.get(value, "#7f7f7f")
    return arch_color(value)


def _title_suffix(ds: xr.Dataset, group: str | None) -> str:
    if group is not None:
        return f" — {group}"
    groups = _ordered(_strs(ds, "group"))
    return f" — {groups[0]}" if len(groups) == 1 else ""


def _tau(ds: xr.Dataset) -> float:
    for key in ("analysis_tau", "tau"):
        if key in ds.attrs:
            return float(ds.attrs[key])
    return 0.5


def _median_band(ax: Axes, x: np.ndarray, rows: np.ndarray, color: str, style: str, label: str | None) -> None:
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


def _mp_ticks(ax: Axes, ds: xr.Dataset, floor: float) -> None:
    """y ticks of an mp axis: the evaluated lengths (thinned to stay readable) and '0' at the
    floor where runs with mp = 0 are drawn."""
    if "length" not in ds:
        return
    ticks = [floor]
    for v in np.sort(finite(ds["length"].values)):
        if v / ticks[-1] >= 1.6:
            ticks.append(float(v))
    ax.set_yticks(ticks, ["0", *[f"{v:g}" for v in ticks[1:]]])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())


# -- panels ----------------------------------------------------------------------------------


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
    ds = _ok(ds)
    if group is None and "group" in ds.coords and ds.sizes["run"]:
        group = _ordered(_strs(ds, "group"))[0]
    ds = _nonempty(_in_group(ds, group), panel)
    everyone = _in_group(everyone, group)
    rows = _arch_order(everyone) if by == "arch" else _ordered(_strs(everyone, by), PHI_ORDER)
    keys = _strs(ds, by)
    all_keys = _strs(everyone, by)
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
        fam_of = dict(zip(_strs(everyone, "arch"), _strs(everyone, "family")))
        for tick, r in zip(ax.get_yticklabels(), rows):
            tick.set_color(family_color(fam_of.get(r, "")))
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    ax.set_xlabel(axis_label(ds["length"], "sequence length"))
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    cb.set_label(axis_label(ds[variable], variable))
    cb.outline.set_linewidth(0.4)
    ax.set_title(f"Accuracy vs length{_title_suffix(ds, group)}")
    return ax


@needs("{variable}", "t", what="q(t) curves")
def q_curves(
    ds: xr.Dataset, ax: Axes, group: str | None = None, variable: str = "q", color_by: str = "family"
) -> Axes:
    """q(t) = R/M per run (log–log), coloured by ``color_by``; the threshold τ as a dashed line
    and each run's T_cross marked with a cross on its curve.  Numerical zeros (q ≤ 1e-10,
    e.g. at t = 1 where R(1) = 0) are not drawn."""
    panel = "q(t) curves"
    ds = _nonempty(_in_group(_ok(ds), group), panel)
    t = np.asarray(ds["t"].values, dtype=np.float64)
    q = np.asarray(ds[variable].values, dtype=np.float64)  # [run, t]
    keys = _strs(ds, color_by)
    tname = "T_cross" if variable == "q" else f"T_cross_{variable[2:]}"
    tcross = np.asarray(ds[tname].values, dtype=np.float64) if tname in ds else np.full(q.shape[0], np.nan)
    drawn = 0
    for i in range(q.shape[0]):
        row = np.where(q[i] > _ZERO, q[i], np.nan)
        if not np.isfinite(row).any():
            continue
        c = _color_of(color_by, keys[i])
        ax.plot(t, row, color=c, alpha=0.75, linewidth=0.8)
        drawn += 1
        if np.isfinite(tcross[i]):
            j = int(np.argmin(np.abs(t - tcross[i])))
            ax.plot([t[j]], [row[j]], marker="x", color=c, markersize=4, markeredgewidth=1.0, linestyle="none")
    if drawn == 0:
        raise NothingToDraw(f"{panel}: every run's {variable} is NaN")
    tau = _tau(ds)
    ax.axhline(tau, color="black", linestyle="--", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel(axis_label(ds["t"], "step"))
    ax.set_ylabel(axis_label(ds[variable], variable))
    handles = [Line2D([], [], color=_color_of(color_by, k), label=k) for k in _ordered(keys, _ORDER)]
    handles += [
        Line2D([], [], color="black", linestyle="--", linewidth=0.7, label=f"τ = {tau:g}"),
        Line2D([], [], color="black", marker="x", linestyle="none", label="T_cross"),
    ]
    ax.legend(handles=handles, loc="best")
    what = {"q": "q(t)", "q_par": "q∥(t) = R∥/M", "q_dec": "q_dec(t), trained decoder",
            "q_pair_out": "q_pair(t), readout features", "q_pair": "q_pair(t), state"}.get(variable, variable)
    ax.set_title(f"Distinguishability ratio {what}{_title_suffix(ds, group)}")
    return ax


def _corr_label(ds: xr.Dataset, variant: str) -> str:
    """r and ρ with their 95 % bootstrap CIs of ``variant`` ('replace' censoring), from the
    study's ``corr_*(variant, censoring)`` table."""
    if "corr_r" not in ds or variant not in ds["variant"].values:
        return "r, ρ: not in dataset (< 3 ok runs)"
    row = {k: float(ds[f"corr_{k}"].sel(variant=variant, censoring="replace"))
           for k in ("r", "r_lo", "r_hi", "rho", "rho_lo", "rho_hi", "n")}
    if not np.isfinite(row["r"]):
        return "r, ρ undefined (T_cross or mp constant)"
    return (f"r = {row['r']:.2f} (95% CI [{row['r_lo']:.2f}, {row['r_hi']:.2f}])\n"
            f"ρ = {row['rho']:.2f} ([{row['rho_lo']:.2f}, {row['rho_hi']:.2f}]), n = {int(row['n'])}")


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
    length; ``×k`` marks k censored runs drawn on one point.  The legend gives Pearson r
    and Spearman ρ with their bootstrap CIs over all runs (censored ones at their bounds,
    the study's table), and Pearson r with its 95 % CI over the uncensored runs alone
    (:func:`uncensored_pearson`), since a stack of censored runs at one corner can make
    the first."""
    variant = variant or default_variant(ds)
    variable = _tcross_name(variant)
    panel = f"{variable} vs mp"
    ds = _nonempty(_ok(ds), panel)
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
    y = np.where(mp > 0, mp, np.nan)  # log axis: mp = 0 (failed at the first length) is clipped below
    floor = 0.5 * float(np.nanmin(finite(ds["length"].values))) if "length" in ds else 1.0
    y = np.where(mp <= 0, floor, y)
    keys = _strs(ds, color_by)
    for k in _ordered(keys, _ORDER):
        for cens, face in ((False, None), (True, "none")):
            sel = (keys == k) & ((tc_cens | mp_cens) == cens) & np.isfinite(x) & np.isfinite(y)
            if sel.any():
                c = _color_of(color_by, k)
                ax.scatter(x[sel], y[sel], s=14, marker="o", facecolors=face or c, edgecolors=c, linewidths=0.8)
    if not (np.isfinite(x) & np.isfinite(y)).any():
        raise NothingToDraw(f"{panel}: no run has finite T_cross (or horizon) and mp")
    lo = min(float(np.nanmin(x)), float(np.nanmin(y)))
    hi = max(float(np.nanmax(x)), float(np.nanmax(y)))
    ax.plot([lo, hi], [lo, hi], color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    _mp_ticks(ax, ds, floor)
    ax.set_xlabel(axis_label(ds[variable], variable))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [
        Line2D([], [], marker="o", color=_color_of(color_by, k), linestyle="none", label=k)
        for k in _ordered(keys, _ORDER)
    ]
    censored = (tc_cens | mp_cens) & np.isfinite(x) & np.isfinite(y)
    handles.append(Line2D([], [], marker="o", markerfacecolor="none", color="#555555", linestyle="none",
                          label=f"censored (at its bound): {int(censored.sum())}"))
    _stack_counts(ax, x[censored], y[censored])
    uncensored = ~(tc_cens | mp_cens) & (mp > 0) & np.isfinite(tc) & np.isfinite(mp)
    ax.legend(handles=handles, loc="upper left", fontsize=6)
    ax.text(0.98, 0.02, "all, censored at bounds: " + _corr_label(ds, variant) + "\nuncensored only: "
            + uncensored_pearson(tc[uncensored], mp[uncensored]), transform=ax.transAxes, ha="right", va="bottom",
            fontsize=5.5, color="#333333")
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


def _stack_counts(ax: Axes, x: np.ndarray, y: np.ndarray) -> None:
    """Write ``×k`` beside every point that ``k > 1`` censored runs share, so a stack of
    censored runs at one bound is seen as many runs, not one."""
    if x.size == 0:
        return
    points, counts = np.unique(np.stack([x, y], axis=1), axis=0, return_counts=True)
    for (px, py), k in zip(points, counts):
        if k > 1:
            ax.annotate(f"×{k}", (px, py), xytext=(4, -8), textcoords="offset points", fontsize=6, color="#555555")


def _loglog_label(x: np.ndarray, y: np.ndarray) -> str:
    """Pearson r and Spearman ρ of (log x, log y) over the failing runs drawn filled."""
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return f"failing runs: n = {x.size} (r undefined)"
    lx, ly = np.log(x), np.log(y)
    r = float(np.corrcoef(lx, ly)[0, 1])
    from scipy.stats import rankdata  # ranks 1..n, ties sharing their average rank

    rho = float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])
    return f"failing runs (log–log): r = {r:.2f}, ρ = {rho:.2f}, n = {x.size}"


@needs("T_horizon", "mp", "arch", what="horizon forecast vs mp")
def horizon_forecast_scatter(ds: xr.Dataset, ax: Axes) -> Axes:
    """Predicted horizon ``T_horizon`` (from steps ≤ the training length) against the
    measured max-pass length mp, one point per ``ok`` run coloured by architecture, log–log.

    Filled: failing runs with a finite forecast (mp below the evaluated horizon), the runs of
    the 'drop' rule; the legend gives their Pearson r and Spearman ρ of the logarithms.  Open:
    censored runs at their bound (T_horizon NaN → the run's horizon; mp passed every length
    → its largest length).  mp = 0 is drawn at half the shortest length."""
    panel = "T_horizon vs mp"
    ds = _nonempty(_ok(ds), panel)
    pred = np.asarray(ds["T_horizon"].values, dtype=np.float64)
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    horizon = (np.asarray(ds["horizon"].values, dtype=np.float64) if "horizon" in ds
               else np.full(pred.shape, float(np.nanmax(ds["length"].values)) if "length" in ds else np.nan))
    pred_cens = ~np.isfinite(pred)
    mp_cens = np.asarray(ds["mp_censored"].values).astype(bool) if "mp_censored" in ds else np.zeros(mp.shape, bool)
    floor = 0.5 * float(np.nanmin(finite(ds["length"].values))) if "length" in ds else 1.0
    x = np.where(pred_cens, horizon, np.maximum(pred, floor))
    y = np.where(mp > 0, mp, floor)
    drawable = np.isfinite(x) & np.isfinite(y)
    if not drawable.any():
        raise NothingToDraw(f"{panel}: no run has a finite forecast (or horizon) and mp")
    failing = ~pred_cens & ~mp_cens & drawable
    archs = _strs(ds, "arch")
    for a in _arch_order(ds):
        c = arch_color(a)
        for sel, face in ((failing, c), (~failing & drawable, "none")):
            pick = sel & (archs == a)
            if pick.any():
                ax.scatter(x[pick], y[pick], s=14, marker="o", facecolors=face, edgecolors=c, linewidths=0.8)
    lo, hi = float(min(x[drawable].min(), y[drawable].min())), float(max(x[drawable].max(), y[drawable].max()))
    ax.plot([lo, hi], [lo, hi], color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    _mp_ticks(ax, ds, floor)
    ax.set_xlabel(axis_label(ds["T_horizon"], "T_horizon"))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [Line2D([], [], marker="o", color=arch_color(a), linestyle="none", label=a) for a in _arch_order(ds)]
    handles.append(Line2D([], [], marker="o", markerfacecolor="none", color="#555555", linestyle="none",
                          label="censored"))
    handles.append(Patch(visible=False, label=_loglog_label(x[failing], y[failing])))
    ax.legend(handles=handles, loc="best", fontsize=6, framealpha=0.6)
    ax.set_title("Horizon forecast (t ≤ t_ref) vs mp")
    return ax


@needs("R_par", "R_perp", "M", "t", what="R_par vs R_perp")
def r_par_perp(ds: xr.Dataset, ax: Axes, group: str | None = None) -> Axes:
    """R∥(t)/M(t) (solid) and R⊥(t)/M(t) (dashed): scatter along U and orthogonal to it in
    units of the centroid separation, median over the runs of each family, IQR shaded."""
    panel = "R_par vs R_perp"
    ds = _nonempty(_in_group(_ok(ds), group), panel)
    t = np.asarray(ds["t"].values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        par = np.asarray(ds["R_par"].values / ds["M"].values, dtype=np.float64)
        perp = np.asarray(ds["R_perp"].values / ds["M"].values, dtype=np.float64)
    par[~np.isfinite(par) | (par <= _ZERO)] = np.nan
    perp[~np.isfinite(perp) | (perp <= _ZERO)] = np.nan
    fams = _strs(ds, "family")
    for fam in _ordered(fams, tuple(FAMILY_COLORS)):
        sel = fams == fam
        c = family_color(fam)
        _median_band(ax, t, par[sel], c, "-", None)
        _median_band(ax, t, perp[sel], c, "--", None)
    if not (np.isfinite(par).any() or np.isfinite(perp).any()):
        raise NothingToDraw(f"{panel}: R_par/M and R_perp/M are NaN for every run")
    ax.axhline(_tau(ds), color="black", linestyle=":", linewidth=0.7)
    log_axis(ax, "x")
    log_axis(ax, "y")
    ax.set_xlabel(axis_label(ds["t"], "step"))
    ax.set_ylabel("scatter / separation M")
    handles = [Line2D([], [], color=family_color(f), label=f) for f in _ordered(fams, tuple(FAMILY_COLORS))]
    handles += [
        Line2D([], [], color="black", linestyle="-", label="R∥/M (along U)"),
        Line2D([], [], color="black", linestyle="--", label="R⊥/M (orthogonal)"),
        Line2D([], [], color="black", linestyle=":", linewidth=0.7, label=f"τ = {_tau(ds):g}"),
    ]
    ax.legend(handles=handles, loc="best")
    ax.set_title(f"Where the error lives{_title_suffix(ds, group)}")
    return ax


#: Half-width of the return-map panel's view: eigenvalues farther out (models whose maps
#: blow up, mostly runs that never learned) are counted in the legend, not drawn.
EIG_VIEW = 1.6


@needs("return_map_eig_real", "return_map_eig_imag", what="return-map eigenvalues")
def return_map_eigs(ds: xr.Dataset, ax: Axes, color_by: str = "family") -> Axes:
    """Eigenvalues of the return map restricted to U (P_U·DF_w·P_U) in the complex plane,
    all words and centroids of every evaluated run, with the unit circle (Theorem 1:
    affine ≈ 1).  Runs that learned (``ok``) are filled dots coloured by ``color_by``;
    runs that never reached the training length (``not-learned``) are grey crosses.  The
    view is clipped to |Re λ|, |Im λ| ≤ :data:`EIG_VIEW` so the unit circle stays readable;
    the legend counts the eigenvalues outside it."""
    panel = "return-map eigenvalues"
    status = _strs(ds, "status", "ok")
    keep = np.isin(status, ("ok", "not-learned"))
    ds = _nonempty(ds.isel(run=np.flatnonzero(keep)), panel)
    status = status[keep]
    re = np.asarray(ds["return_map_eig_real"].values, dtype=np.float64)  # [run, k]
    im = np.asarray(ds["return_map_eig_imag"].values, dtype=np.float64)
    keys = _strs(ds, color_by)
    ax.add_patch(Circle((0, 0), 1.0, fill=False, color="#777777", linewidth=0.7, linestyle="--"))
    ax.axhline(0, color="#cccccc", linewidth=0.5, zorder=0)
    ax.axvline(0, color="#cccccc", linewidth=0.5, zorder=0)
    fin = np.isfinite(re) & np.isfinite(im)
    inside = fin & (np.abs(re) <= EIG_VIEW) & (np.abs(im) <= EIG_VIEW)
    present = []
    learned = status == "ok"
    for k in _ordered(keys[learned], _ORDER):
        sel = (keys == k) & learned
        ok = inside[sel]
        if ok.any():
            ax.scatter(re[sel][ok], im[sel][ok], s=6, color=_color_of(color_by, k), alpha=0.5, linewidths=0, label=k)
            present.append(k)
    nl = ~learned
    if inside[nl].any():
        ax.scatter(re[nl][inside[nl]], im[nl][inside[nl]], s=8, marker="x", color="#999999", alpha=0.6,
                   linewidths=0.6, label="not learned")
        present.append("not learned")
    if not present:
        raise NothingToDraw(f"{panel}: every eigenvalue is NaN or outside the view (U empty for every run)")
    return _eigen_view(ax, int((fin & ~inside).sum()), "Return map on U: eigenvalues")


def _eigen_view(ax: Axes, n_out: int, title: str, extra: str | None = None) -> Axes:
    """Finish an eigenvalue panel: the legend (with the count of eigenvalues outside the
    clipped view, and ``extra``), the square view of :data:`EIG_VIEW`, the labels, ``title``."""
    if n_out:
        ax.plot([], [], linestyle="none", label=f"{n_out} with |Re|, |Im| > {EIG_VIEW:g} not shown")
    if extra:
        ax.plot([], [], linestyle="none", label=extra)
    ax.set_xlim(-EIG_VIEW, EIG_VIEW)
    ax.set_ylim(-EIG_VIEW, EIG_VIEW)
    ax.set_aspect("equal")
    ax.set_xlabel("Re λ")
    ax.set_ylabel("Im λ")
    ax.legend(loc="upper left", markerscale=2, handletextpad=0.2, fontsize=6)
    ax.set_title(title)
    return ax


@needs("fp_eig_real", "fp_eig_imag", "arch", what="fixed-point spectra")
def fixed_point_spectra(ds: xr.Dataset, ax: Axes) -> Axes:
    """Eigenvalues of DF_w at the fixed points of the return maps (the principal fixed point
    of every symbolic state and word; :mod:`dynlab.analysis.fixed_points`) of the learned
    runs in the complex plane, one colour per architecture, with the unit circle: inside
    it the fixed point attracts along that eigenvector, on it the map is neutral
    (Theorem 1's affine trackers along U).  The view is clipped to |Re λ|, |Im λ| ≤
    :data:`EIG_VIEW`; the legend counts the eigenvalues outside it and the runs with no
    fixed point."""
    panel = "fixed-point spectra"
    ds = _nonempty(_ok(ds), panel)
    re = np.asarray(ds["fp_eig_real"].values, dtype=np.float64).reshape(ds.sizes["run"], -1)  # [run, state·k_fp]
    im = np.asarray(ds["fp_eig_imag"].values, dtype=np.float64).reshape(ds.sizes["run"], -1)
    archs = _strs(ds, "arch")
    ax.add_patch(Circle((0, 0), 1.0, fill=False, color="#777777", linewidth=0.7, linestyle="--"))
    ax.axhline(0, color="#cccccc", linewidth=0.5, zorder=0)
    ax.axvline(0, color="#cccccc", linewidth=0.5, zorder=0)
    fin = np.isfinite(re) & np.isfinite(im)
    inside = fin & (np.abs(re) <= EIG_VIEW) & (np.abs(im) <= EIG_VIEW)
    drawn = False
    for arch in _arch_order(ds):
        sel = archs == arch
        ok = inside[sel]
        if ok.any():
            ax.scatter(re[sel][ok], im[sel][ok], s=5, color=arch_color(arch), alpha=0.45, linewidths=0, label=arch)
            drawn = True
    if not drawn:
        raise NothingToDraw(f"{panel}: no learned run has a fixed point inside the view")
    n_none = int((~fin.any(axis=1)).sum())
    return _eigen_view(ax, int((fin & ~inside).sum()), "Return map at its fixed points: eigenvalues",
                       f"{n_none} learned runs without a fixed point" if n_none else None)


@needs("perturb_delta_norm", what="perturbation recovery")
def perturbation_recovery(ds: xr.Dataset, ax: Axes) -> Axes:
    """Size of a perturbation injected along U (solid) and U⊥ (dashed) at t0, relative to
    its size at injection, against steps since injection; median per family, IQR shaded."""
    panel = "perturbation recovery"
    ds = _nonempty(_ok(ds), panel)
    da = ds["perturb_delta_norm"]  # [run, direction, t_pert]
    tdim = [d for d in da.dims if d not in ("run", "direction")]
    if "direction" not in da.dims or len(tdim) != 1:
        raise ValueError(f"{panel}: perturb_delta_norm must have dims (run, direction, t); got {da.dims}")
    da = da.transpose("run", "direction", tdim[0])
    steps = np.asarray(da[tdim[0]].values, dtype=np.float64)
    x = steps - steps[0]
    vals = np.asarray(da.values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = vals / vals[:, :, :1]
    rel[~np.isfinite(rel) | (rel <= 0)] = np.nan
    dirs = [str(d) for d in da["direction"].values]
    fams = _strs(ds, "family")
    styles = {"U": "-", "U_perp": "--"}
    for fam in _ordered(fams, tuple(FAMILY_COLORS)):
        for j, d in enumerate(dirs):
            _median_band(ax, x, rel[fams == fam, j], family_color(fam), styles.get(d, ":"), None)
    if not np.isfinite(rel).any():
        raise NothingToDraw(f"{panel}: perturb_delta_norm is NaN for every run")
    ax.axhline(1.0, color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "y")
    t0 = int(ds.attrs.get("analysis_t_ref", steps[0]))
    ax.set_xlabel(f"steps after injection (t0 = {t0})")
    ax.set_ylabel("perturbation size / size at t0")
    handles = [Line2D([], [], color=family_color(f), label=f) for f in _ordered(fams, tuple(FAMILY_COLORS))]
    handles += [
        Line2D([], [], color="black", linestyle=styles.get(d, ":"), label="along U" if d == "U" else "along U⊥")
        for d in dirs
    ]
    ax.legend(handles=handles, loc="best")
    ax.set_title("Recovery from a perturbation")
    return ax


@needs("{variable}", "{by}", what="failure modes")
def failure_modes(ds: xr.Dataset, ax: Axes, by: str = "arch", variable: str = "failure_mode") -> Axes:
    """Number of runs in each failure mode (robust, climb, saturation) per ``by`` (horizontal
    stacked bars); runs without an analysis are counted as 'not analysed'.  ``variable``
    picks the classification: ``failure_mode`` (from q) or ``failure_mode_par`` (from q∥)."""
    panel = "failure modes"
    ds = _nonempty(_ok(ds), panel)
    modes = _strs(ds, variable)
    modes = np.where(np.isin(modes, FAILURE_MODES), modes, "not analysed")
    keys = _strs(ds, by)
    rows = _arch_order(ds) if by == "arch" else _ordered(keys, PHI_ORDER)
    left = np.zeros(len(rows))
    for mode in (*FAILURE_MODES, "not analysed"):
        counts = np.array([np.sum((keys == r) & (modes == mode)) for r in rows], dtype=float)
        if counts.any():
            ax.barh(np.arange(len(rows)), counts, left=left, color=_MODE_COLORS[mode], label=mode, height=0.7)
            left += counts
    ax.set_yticks(np.arange(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    if by == "arch":
        fam_of = dict(zip(_strs(ds, "arch"), _strs(ds, "family")))
        for tick, r in zip(ax.get_yticklabels(), rows):
            tick.set_color(family_color(fam_of.get(r, "")))
    ax.set_xlabel("runs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="center right")  # in the empty right part reserved by the x limit
    ax.set_xlim(0, max(1.0, float(left.max())) * 1.75)
    ax.set_title("Failure modes" + (" (from q∥)" if variable.endswith("_par") else ""))
    return ax


@needs("{variable}", "group", what="margin vs group order")
def margin_panel(ds: xr.Dataset, ax: Axes, variable: str = "half_margin_rel") -> Axes:
    """Room for error per group, ordered by group order (C2 → C6 → S3 …): ``variable``
    (default the median over t of (M/2) / centroid radius) per run, coloured by family,
    with the family medians joined."""
    panel = "margin vs group order"
    ds = _nonempty(_ok(ds), panel)
    groups = _strs(ds, "group")
    if "group_order" in ds:
        order_of = dict(zip(groups, np.asarray(ds["group_order"].values).astype(int)))
    else:
        from dynlab.tracking.groups import get_group

        order_of = {g: get_group(g).order for g in set(groups)}
    cols = sorted(set(groups), key=lambda g: (order_of[g], g))
    pos = {g: i for i, g in enumerate(cols)}
    vals = np.asarray(ds[variable].values, dtype=np.float64)
    fams = _strs(ds, "family")
    fam_list = _ordered(fams, tuple(FAMILY_COLORS))
    width = 0.5 / max(1, len(fam_list))
    rng = np.random.default_rng(0)  # jitter only
    for fi, fam in enumerate(fam_list):
        off = (fi - (len(fam_list) - 1) / 2) * width
        c = family_color(fam)
        sel = (fams == fam) & np.isfinite(vals)
        xs = np.array([pos[g] for g in groups[sel]], dtype=float) + off
        ax.scatter(xs + rng.uniform(-0.06, 0.06, xs.size), vals[sel], s=10, color=c, alpha=0.6, linewidths=0)
        meds = [np.median(vals[sel & (groups == g)]) if (sel & (groups == g)).any() else np.nan for g in cols]
        ax.plot(np.arange(len(cols)) + off, meds, color=c, marker="_", markersize=9, label=fam)
    if not np.isfinite(vals).any():
        raise NothingToDraw(f"{panel}: {variable} is NaN for every run")
    ax.set_xticks(np.arange(len(cols)))
    ax.set_xticklabels([f"{g}\n|G|={order_of[g]}" for g in cols])
    ax.set_xlim(-0.6, len(cols) - 0.4)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(axis_label(ds[variable], variable))
    ax.legend(loc="best")
    ax.set_title("Decision margin vs group order")
    return ax


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
        ds = ds.isel(run=np.flatnonzero(np.isin(_strs(ds, "status"), ("ok", "not-learned"))))
    ds = _nonempty(ds, panel)
    phis = _ordered(_strs(ds, "nonlinearity"), PHI_ORDER)
    groups = _ordered(_strs(ds, "group"))
    gcolors = ("#1b6ca8", "#d9480f", "#5f3dc4", "#2b8a3e", "#862e9c")
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    floor = 0.5 * float(np.nanmin(finite(ds["length"].values))) if "length" in ds else 1.0
    y = np.where(mp > 0, mp, floor)
    modes = _strs(ds, default_mode_variable(ds), "not analysed")
    modes = np.where(np.isin(modes, FAILURE_MODES), modes, "not analysed")
    learned = _strs(ds, "status", "ok") == "ok"
    modes = np.where(learned, modes, "not learned")
    keys, gk = _strs(ds, "nonlinearity"), _strs(ds, "group")
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
                if _MODE_MARKERS[mode] in ("x", "+"):  # unfilled marker: one colour
                    ax.scatter(xs, y[s2], s=16, marker=_MODE_MARKERS[mode], color=c, linewidths=0.8)
                else:
                    ax.scatter(xs, y[s2], s=16, marker=_MODE_MARKERS[mode], facecolors=c, edgecolors=c,
                               linewidths=0.8)
            meds.append(np.median(y[sel & learned]) if (sel & learned).any() else np.nan)
        ax.plot(np.arange(len(phis)) + off, meds, color=c, linewidth=0.7, alpha=0.7)
    log_axis(ax, "y")
    ax.set_xticks(np.arange(len(phis)))
    ax.set_xticklabels(phis, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(phis) - 0.4)
    if "length" in ds:
        ax.axhline(float(np.nanmax(ds["length"].values)), color="#999999", linestyle=":", linewidth=0.7)
        _mp_ticks(ax, ds, floor)
    ax.set_xlabel(axis_label(ds["nonlinearity"], "nonlinearity φ"))
    ax.set_ylabel(axis_label(ds["mp"], "mp"))
    handles = [Line2D([], [], color=gcolors[i % len(gcolors)], marker="o", label=g) for i, g in enumerate(groups)]
    handles += [Line2D([], [], color="#555555", marker=_MODE_MARKERS[m], linestyle="none", label=m)
                for m in (*FAILURE_MODES, "not analysed", "not learned") if m in set(modes)]
    ax.legend(handles=handles, loc="best", ncols=2)
    ax.set_title("Nonlinearity ablation: max-pass length")
    return ax


@needs("mp", "{by}", what="mp table")
def mp_failure_table(ds: xr.Dataset, by: str = "nonlinearity") -> str:
    """A Markdown table per (``by``, group): runs, runs that learned (status ``ok``), median
    and range of their mp (``≥`` when the median is censored), the count of each failure
    mode among them, the runs that never reached the training length (``not-learned``) and
    the rest (diverged, or learned but not analysed).  The failure modes are those of the
    study's default crossing variant (:func:`default_mode_variable`)."""
    keys, groups = _strs(ds, by), _strs(ds, "group")
    status = _strs(ds, "status", "ok")
    mp = np.asarray(ds["mp"].values, dtype=np.float64)
    cens = np.asarray(ds["mp_censored"].values).astype(bool) if "mp_censored" in ds else np.zeros(mp.shape, bool)
    mode_var = default_mode_variable(ds)
    modes = _strs(ds, mode_var, "")
    rows_order = _ordered(keys, PHI_ORDER) if by == "nonlinearity" else _arch_order(ds)
    head = (f"| {by} | group | runs | learned | mp median | mp min–max | robust | climb | saturation "
            "| not learned | failed/not analysed |")
    lines = [head, "|" + "---|" * 11]
    for r in rows_order:
        for g in _ordered(groups):
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
