"""Figure panels of the group trackers' dynamics (paper A): the return map's eigenvalues at
the centroids and at its fixed points, recovery from a perturbation, the failure modes and
the decision margin; pure ``(ds, ax) -> ax`` functions like :mod:`dynlab.tracking.figures.panels`
(same dataset, same rules: only runs with ``status == 'ok'`` are drawn, except in the
return-map panel, which marks the runs that never learned apart).
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Circle

from dynlab.figures.legends import legend
from dynlab.figures.panel import NothingToDraw, needs
from dynlab.tracking.figures.runs import (
    FAILURE_MODES, MODE_COLORS, ORDER, PHI_ORDER, arch_order, color_of, median_band, nonempty, ok_runs, ordered, strs,
)
from dynlab.figures.style import FAMILY_COLORS, arch_color, axis_label, family_color, log_axis

__all__ = [
    "EIG_VIEW",
    "failure_modes",
    "fixed_point_spectra",
    "margin_panel",
    "perturbation_recovery",
    "return_map_eigs",
]


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
    status = strs(ds, "status", "ok")
    keep = np.isin(status, ("ok", "not-learned"))
    ds = nonempty(ds.isel(run=np.flatnonzero(keep)), panel)
    status = status[keep]
    re = np.asarray(ds["return_map_eig_real"].values, dtype=np.float64)  # [run, k]
    im = np.asarray(ds["return_map_eig_imag"].values, dtype=np.float64)
    keys = strs(ds, color_by)
    ax.add_patch(Circle((0, 0), 1.0, fill=False, color="#777777", linewidth=0.7, linestyle="--"))
    ax.axhline(0, color="#cccccc", linewidth=0.5, zorder=0)
    ax.axvline(0, color="#cccccc", linewidth=0.5, zorder=0)
    fin = np.isfinite(re) & np.isfinite(im)
    inside = fin & (np.abs(re) <= EIG_VIEW) & (np.abs(im) <= EIG_VIEW)
    present = []
    learned = status == "ok"
    for k in ordered(keys[learned], ORDER):
        sel = (keys == k) & learned
        ok = inside[sel]
        if ok.any():
            ax.scatter(re[sel][ok], im[sel][ok], s=6, color=color_of(color_by, k), alpha=0.5, linewidths=0, label=k)
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
    legend(ax, beside="right", loc="upper left", markerscale=2, handletextpad=0.2, fontsize=6)
    ax.set_title(title)
    return ax


@needs("fp_eig_real", "fp_eig_imag", "arch", what="fixed-point spectra")
def fixed_point_spectra(ds: xr.Dataset, ax: Axes) -> Axes:
    """Eigenvalues of DF_w at the fixed points of the return maps (the principal fixed point
    of every symbolic state and word; :mod:`dynlab.tracking.analysis.fixed_points.per_state`) of the learned
    runs in the complex plane, one colour per architecture, with the unit circle: inside
    it the fixed point attracts along that eigenvector, on it the map is neutral
    (Theorem 1's affine trackers along U).  The view is clipped to |Re λ|, |Im λ| ≤
    :data:`EIG_VIEW`; the legend counts the eigenvalues outside it and the runs with no
    fixed point."""
    panel = "fixed-point spectra"
    ds = nonempty(ok_runs(ds), panel)
    re = np.asarray(ds["fp_eig_real"].values, dtype=np.float64).reshape(ds.sizes["run"], -1)  # [run, state·k_fp]
    im = np.asarray(ds["fp_eig_imag"].values, dtype=np.float64).reshape(ds.sizes["run"], -1)
    archs = strs(ds, "arch")
    ax.add_patch(Circle((0, 0), 1.0, fill=False, color="#777777", linewidth=0.7, linestyle="--"))
    ax.axhline(0, color="#cccccc", linewidth=0.5, zorder=0)
    ax.axvline(0, color="#cccccc", linewidth=0.5, zorder=0)
    fin = np.isfinite(re) & np.isfinite(im)
    inside = fin & (np.abs(re) <= EIG_VIEW) & (np.abs(im) <= EIG_VIEW)
    drawn = False
    for arch in arch_order(ds):
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
    ds = nonempty(ok_runs(ds), panel)
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
    fams = strs(ds, "family")
    styles = {"U": "-", "U_perp": "--"}
    for fam in ordered(fams, tuple(FAMILY_COLORS)):
        for j, d in enumerate(dirs):
            median_band(ax, x, rel[fams == fam, j], family_color(fam), styles.get(d, ":"), None)
    if not np.isfinite(rel).any():
        raise NothingToDraw(f"{panel}: perturb_delta_norm is NaN for every run")
    ax.axhline(1.0, color="#999999", linestyle=":", linewidth=0.7)
    log_axis(ax, "y")
    t0 = int(ds.attrs.get("analysis_t_ref", steps[0]))
    ax.set_xlabel(f"steps after injection (t0 = {t0})")
    ax.set_ylabel("perturbation size / size at t0")
    handles = [Line2D([], [], color=family_color(f), label=f) for f in ordered(fams, tuple(FAMILY_COLORS))]
    handles += [
        Line2D([], [], color="black", linestyle=styles.get(d, ":"), label="along U" if d == "U" else "along U⊥")
        for d in dirs
    ]
    legend(ax, handles)
    ax.set_title("Recovery from a perturbation")
    return ax


@needs("{variable}", "{by}", what="failure modes")
def failure_modes(ds: xr.Dataset, ax: Axes, by: str = "arch", variable: str = "failure_mode") -> Axes:
    """Number of runs in each failure mode (robust, climb, saturation) per ``by`` (horizontal
    stacked bars); runs without an analysis are counted as 'not analysed'.  ``variable``
    picks the classification: ``failure_mode`` (from q), ``failure_mode_par`` (from q∥) or
    ``failure_mode_dec`` (from q_dec); the title names which."""
    panel = "failure modes"
    ds = nonempty(ok_runs(ds), panel)
    modes = strs(ds, variable)
    modes = np.where(np.isin(modes, FAILURE_MODES), modes, "not analysed")
    keys = strs(ds, by)
    rows = arch_order(ds) if by == "arch" else ordered(keys, PHI_ORDER)
    left = np.zeros(len(rows))
    for mode in (*FAILURE_MODES, "not analysed"):
        counts = np.array([np.sum((keys == r) & (modes == mode)) for r in rows], dtype=float)
        if counts.any():
            ax.barh(np.arange(len(rows)), counts, left=left, color=MODE_COLORS[mode], label=mode, height=0.7)
            left += counts
    ax.set_yticks(np.arange(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    if by == "arch":
        fam_of = dict(zip(strs(ds, "arch"), strs(ds, "family")))
        for tick, r in zip(ax.get_yticklabels(), rows):
            tick.set_color(family_color(fam_of.get(r, "")))
    ax.set_xlabel("runs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    legend(ax, loc="center right")  # in the empty right part reserved by the x limit
    ax.set_xlim(0, max(1.0, float(left.max())) * 1.75)
    source = {"_par": "q∥", "_dec": "q_dec"}.get(variable[len("failure_mode"):], "q")
    ax.set_title(f"Failure modes (from {source})")
    return ax


@needs("{variable}", "group", what="margin vs group order")
def margin_panel(ds: xr.Dataset, ax: Axes, variable: str = "half_margin_rel") -> Axes:
    """Room for error per group, ordered by group order (C2 → C6 → S3 …): ``variable``
    (default the median over t of (M/2) / centroid radius) per run, coloured by family,
    with the family medians joined."""
    panel = "margin vs group order"
    ds = nonempty(ok_runs(ds), panel)
    groups = strs(ds, "group")
    if "group_order" in ds:
        order_of = dict(zip(groups, np.asarray(ds["group_order"].values).astype(int)))
    else:
        from dynlab.tracking.groups import get_group

        order_of = {g: get_group(g).order for g in set(groups)}
    cols = sorted(set(groups), key=lambda g: (order_of[g], g))
    pos = {g: i for i, g in enumerate(cols)}
    vals = np.asarray(ds[variable].values, dtype=np.float64)
    fams = strs(ds, "family")
    fam_list = ordered(fams, tuple(FAMILY_COLORS))
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
    legend(ax)
    ax.set_title("Decision margin vs group order")
    return ax
