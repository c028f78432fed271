"""Figure panels of the long-context task studies (copying, passkey, babilong): pure ``(ds, ax) -> ax`` functions.

Runs are pooled by (``arch``, ``intervention``): a line or cell is the mean over the
seeds of that pair, and the shaded band (line panels) spans the seeds' minimum to
maximum (a legend entry says so). The training lengths ``[train_min, train_max]`` are shaded grey. Only learned
models are drawn (``status == "ok"``; a heatmap's title counts the runs left out), and in a dataset with post-training arms only
the arms (``phase == "post"``: each intervention and its compute-matched ``zero``
control). The difference panels show the paired contrasts (arm − control, mean over
seeds, starred where the paired-t p-value, Holm-corrected, is below 0.05;
:mod:`dynlab.analysis.contrasts`). No torch, no
file I/O.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.transforms import ScaledTranslation

from dynlab.figures.arms import BAND
from dynlab.figures.legends import legend
from dynlab.lm.figures.panels import holm
from dynlab.figures.panel import NothingToDraw, Panel, needs
from dynlab.figures.style import axis_label, log_axis

__all__ = ["DODGE", "geometry_q_panel", "geometry_tcross_panel", "babi_panel", "babilong_panels", "copying_panel", "copying_panels", "passkey_difference", "passkey_heatmap",
           "passkey_panels"]


#: Points between the arms that :func:`geometry_tcross_panel` draws side by side at one value.
DODGE = 10.0


def _tested(ds: xr.Dataset) -> xr.Dataset:
    """The rows to draw: learned models, and only the post-training arms when there are any."""
    keep = np.ones(ds.sizes["run"], dtype=bool)
    if "status" in ds:
        keep &= ds["status"].values.astype(str) == "ok"
    if "phase" in ds.coords and (ds["phase"].values.astype(str) == "post").any():
        keep &= ds["phase"].values.astype(str) == "post"
    if not keep.any():
        raise NothingToDraw("no learned model (status ok) in the dataset")
    return ds.isel(run=np.flatnonzero(keep))


def _left_out(ds: xr.Dataset, intervention: str) -> str:
    """``", k not learned (left out)"`` for the rows of ``intervention`` that :func:`_tested`
    drops as not learned (``""`` when none)."""
    if "status" not in ds:
        return ""
    bad = ds["status"].values.astype(str) != "ok"
    rows = ds["intervention"].values.astype(str) == intervention
    if "phase" in ds.coords and (ds["phase"].values.astype(str) == "post").any():
        phase = ds["phase"].values.astype(str)
        # an arm's row not learned, or a base model not learned (no arm was trained from it)
        failed = int((rows & (phase == "post") & bad).sum() + ((phase == "base") & bad).sum())
    else:
        failed = int((rows & bad).sum())
    return f", {failed} not learned (left out)" if failed else ""


def _chosen_intervention(ds: xr.Dataset, intervention: str | None) -> str:
    """``intervention``, or the dataset's first; one that the dataset lacks is nothing to draw."""
    interventions = list(dict.fromkeys(ds["intervention"].values.astype(str)))
    iv = intervention if intervention is not None else interventions[0]
    if iv not in interventions:
        raise NothingToDraw(f"intervention {iv!r} not in the dataset; allowed: {', '.join(interventions)}")
    return iv


def _pairs(ds: xr.Dataset) -> list[tuple[str, str]]:
    return list(dict.fromkeys(zip(ds["arch"].values.astype(str), ds["intervention"].values.astype(str))))


def _runs(ds: xr.Dataset, arch: str, intervention: str) -> xr.Dataset:
    keep = (ds["arch"] == arch) & (ds["intervention"] == intervention)
    return ds.isel(run=np.flatnonzero(keep.values))


def _label(ds: xr.Dataset, arch: str, intervention: str, n: int) -> str:
    multi_arch = len(np.unique(ds["arch"].values)) > 1
    name = f"{arch} / {intervention}" if multi_arch else intervention
    return f"{name} ({n} seed{'s' if n != 1 else ''})"


def _shade_training(ds: xr.Dataset, ax: Axes) -> None:
    if "train_min" in ds.coords and "train_max" in ds.coords:
        ax.axvspan(float(ds["train_min"].min()), float(ds["train_max"].max()), color="0.9", zorder=0,
                   label="training lengths")


def _legend(ax: Axes, **kw) -> None:
    """The axes' legend, the band's entry last."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] == BAND)
    legend(ax, [handles[i] for i in order], [labels[i] for i in order], fontsize="small", **kw)


def _mean_band(ds: xr.Dataset, ax: Axes, da: xr.DataArray, label: str) -> None:
    mean = da.mean("run")
    line, = ax.plot(ds["length"].values, mean.values, marker="o", markersize=3, label=label)
    if da.sizes["run"] > 1:
        ax.fill_between(ds["length"].values, da.min("run").values, da.max("run").values, color=line.get_color(),
                        alpha=0.2, linewidth=0)
        if not getattr(ax, "_dynlab_band_labelled", False):  # one legend entry says what the bands are
            ax.fill_between([], [], [], color="0.45", alpha=0.35, linewidth=0, label=BAND)
            ax._dynlab_band_labelled = True


@needs("{variable}", "length", "arch", "intervention", what="copying accuracy")
def copying_panel(ds: xr.Dataset, ax: Axes, variable: str = "accuracy") -> Axes:
    """Copying: ``variable`` (per-character ``accuracy`` or ``exact_match``) vs string length, per intervention."""
    ds = _tested(ds)
    _shade_training(ds, ax)
    for arch, iv in _pairs(ds):
        runs = _runs(ds, arch, iv)
        _mean_band(ds, ax, runs[variable], _label(ds, arch, iv, runs.sizes["run"]))
    if "train_max" in ds.coords:
        ax.axvline(3 * float(ds["train_max"].max()), color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel(axis_label(ds["length"], "string length"))
    ax.set_ylabel(axis_label(ds[variable], variable))
    ax.set_ylim(0, 1.02)
    what = "per-character accuracy" if variable == "accuracy" else ds[variable].attrs.get("long_name", variable)
    ax.set_title(f"Copying: {what} vs length (dotted: 3x training)")
    _legend(ax)
    return ax


@needs("accuracy", "length", "depth", "intervention", "train_max", what="passkey heatmap")
def passkey_heatmap(ds: xr.Dataset, ax: Axes, intervention: str | None = None) -> Axes:
    """Passkey: mean accuracy over (length, depth) for the learned runs of ``intervention``
    (default: the first); the title counts the runs left out because they did not learn."""
    everyone = ds
    ds = _tested(ds)
    iv = _chosen_intervention(ds, intervention)
    acc = ds["accuracy"].isel(run=np.flatnonzero((ds["intervention"] == iv).values))
    mean = acc.mean("run").transpose("depth", "length")
    im = ax.imshow(mean.values, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(ds.sizes["length"]), [str(int(v)) for v in ds["length"].values])
    ax.set_yticks(range(ds.sizes["depth"]), [f"{v:g}" for v in ds["depth"].values])
    for (i, j), v in np.ndenumerate(mean.values):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6, color="w" if v < 0.6 else "k")
    ax.figure.colorbar(im, ax=ax, label=axis_label(ds["accuracy"], "accuracy"))
    ax.set_xlabel(axis_label(ds["length"], "length"))
    ax.set_ylabel(axis_label(ds["depth"], "depth"))
    n = acc.sizes["run"]
    left_out = _left_out(everyone, iv)
    ax.set_title(f"Passkey accuracy, {iv} ({n} learned run{'s' if n != 1 else ''}{left_out}; "
                 f"trained ≤ {int(ds['train_max'].max())})")
    return ax


@needs("accuracy", "length", "kind", "intervention", what="bAbI accuracy")
def babi_panel(ds: xr.Dataset, ax: Axes, intervention: str | None = None) -> Axes:
    """bAbI-style: accuracy vs length, one line per task kind (mean over the runs of ``intervention``),
    and each kind's ``chance`` level dotted (when the dataset has it); the title counts the
    runs left out because they did not learn."""
    everyone = ds
    ds = _tested(ds)
    iv = _chosen_intervention(ds, intervention)
    runs = ds.isel(run=np.flatnonzero((ds["intervention"] == iv).values))
    _shade_training(ds, ax)
    chance = "chance" in ds
    for kind in runs["kind"].values:
        _mean_band(runs, ax, runs["accuracy"].sel(kind=kind), str(kind))
        if chance:  # always the most common answer: dotted, in the kind's colour
            ax.axhline(float(ds["chance"].sel(kind=kind)), color=ax.lines[-1].get_color(), linestyle=":",
                       linewidth=1, label=f"{kind} chance" if len(runs["kind"]) == 1 else None)
    if chance and len(runs["kind"]) > 1:
        ax.plot([], [], color="0.4", linestyle=":", linewidth=1, label="chance (dotted)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel(axis_label(ds["length"], "length"))
    ax.set_ylabel(axis_label(ds["accuracy"], "accuracy"))
    ax.set_ylim(0, 1.02)
    ax.set_title(f"bAbI-style accuracy per kind, {iv} ({runs.sizes['run']} learned runs{_left_out(everyone, iv)})")
    _legend(ax, ncols=2)
    return ax


@needs("contrast_mean", "contrast_p", "length", "depth", what="passkey difference")
def passkey_difference(ds: xr.Dataset, ax: Axes, contrast: str | None = None, arch: str | None = None) -> Axes:
    """Passkey: paired difference arm − zero control over (length, depth), mean over seeds;
    cells with a Holm-adjusted p < 0.05 (paired t, corrected over every cell of every
    contrast of the mixer) are marked with ``*``."""
    names = [str(c) for c in ds["contrast"].values]
    c = contrast if contrast is not None else names[0]
    if c not in names:
        raise NothingToDraw(f"contrast {c!r} not in the dataset; allowed: {', '.join(names)}")
    a = arch if arch is not None else str(ds["mixer"].values[0])
    sel = {"contrast": c, "mixer": a}
    mean = ds["contrast_mean"].sel(sel).transpose("depth", "length")
    every = ds["contrast_p"].sel(mixer=a)  # Holm over every cell of every contrast of this mixer
    adjusted = every.copy(data=holm(every.values))
    n_tests = int(np.isfinite(every.values).sum())
    p = adjusted.sel(contrast=c).transpose("depth", "length").values
    n = int(ds["contrast_n"].sel(sel))
    im = ax.imshow(mean.values, origin="lower", aspect="auto", vmin=-1, vmax=1, cmap="RdBu")
    ax.set_xticks(range(ds.sizes["length"]), [str(int(v)) for v in ds["length"].values])
    ax.set_yticks(range(ds.sizes["depth"]), [f"{v:g}" for v in ds["depth"].values])
    for (i, j), v in np.ndenumerate(mean.values):
        if np.isfinite(v):
            star = "*" if np.isfinite(p[i, j]) and p[i, j] < 0.05 else ""
            ax.text(j, i, f"{v:+.2f}{star}", ha="center", va="center", fontsize=6)
    ax.figure.colorbar(im, ax=ax, label="accuracy difference (arm − zero)")
    ax.set_xlabel(axis_label(ds["length"], "length"))
    ax.set_ylabel(axis_label(ds["depth"], "depth"))
    ax.set_title(f"Passkey: {c} − zero, {n} paired seed{'s' if n != 1 else ''} "
                 f"(* Holm-adjusted p < 0.05, {n_tests} tests)")
    return ax


def _interventions(ds: xr.Dataset) -> list[str]:
    if "intervention" not in ds.coords:
        return []
    try:
        ds = _tested(ds)
    except NothingToDraw:
        pass
    return list(dict.fromkeys(ds["intervention"].values.astype(str)))


@needs("geo_q", "geo_accuracy", "distance", "arch", "intervention", what="q of the task variable vs distance")
def geometry_q_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """q = R/M of the task variable against the distance since it was written, per arm
    (mean over seeds, band: min–max), with the retrieval accuracy on a second axis
    (dashed, same colour); dotted lines: q = τ and accuracy 0.5 (``dynlab analyze``)."""
    ds = _tested(ds)
    tau = float(ds.attrs.get("geo_tau", 1.0))
    twin = ax.twinx()
    for arch, iv in _pairs(ds):
        runs = _runs(ds, arch, iv)
        x = runs["distance"].values
        q = runs["geo_q"]
        line, = ax.plot(x, q.mean("run").values, marker="o", markersize=3, label=_label(ds, arch, iv, runs.sizes["run"]))
        if runs.sizes["run"] > 1:
            ax.fill_between(x, q.min("run").values, q.max("run").values, color=line.get_color(), alpha=0.2, linewidth=0)
        twin.plot(x, runs["geo_accuracy"].mean("run").values, linestyle="--", color=line.get_color(), linewidth=1)
    ax.axhline(tau, color="0.4", linestyle=":", linewidth=1)
    twin.axhline(0.5, color="0.7", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    log_axis(ax, "y")
    ax.set_xlabel(axis_label(ds["distance"], "distance"))
    ax.set_ylabel(axis_label(ds["geo_q"], "q"))
    twin.set_ylabel("retrieval accuracy (dashed)")
    twin.set_ylim(0, 1.02)
    ax.set_title(f"q of the task variable vs distance (dotted: q = {tau:g}; band: seeds min-max)")
    _legend(ax)
    return ax


@needs("geo_T_cross", "geo_crossed", "geo_horizon", "geo_horizon_reached", "intervention", what="T_cross vs horizon")
def geometry_tcross_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """T_cross from the states against the retrieval horizon (first distance with accuracy
    < 0.5), one point per learned tested model.  Filled: both observed; ``>``: T_cross
    censored (q never reached τ: at least that far); ``^``: horizon censored; open
    diamond: both; dashed: T_cross = horizon.  The arms are drawn side by side (:data:`DODGE`
    points apart) and ``×k`` marks k models of an arm on one point.  Title: Pearson r of
    log2 values, censored at their bound."""
    ok = ds.isel(run=np.flatnonzero(ds["status"].values.astype(str) == "ok")) if "status" in ds else ds
    t, h = ok["geo_T_cross"].values.astype(float), ok["geo_horizon"].values.astype(float)
    ct, ch = ~ok["geo_crossed"].values.astype(bool), ~ok["geo_horizon_reached"].values.astype(bool)
    good = np.isfinite(t) & np.isfinite(h)
    if not good.any():
        raise NothingToDraw("no model with a measured T_cross and horizon")
    ivs = ok["intervention"].values.astype(str)
    arms = list(dict.fromkeys(ivs[good]))
    for j, iv in enumerate(arms):
        color = f"C{j}"
        # the arms side by side (a fixed offset in points, the data unchanged): one never hides another
        dodge = ax.transData + ScaledTranslation((j - (len(arms) - 1) / 2) * DODGE / 72, 0, ax.figure.dpi_scale_trans)
        labelled = False
        for mask, marker, fill, what in ((~ct & ~ch, "o", color, "observed"), (ct & ~ch, ">", color, "T_cross censored"),
                                         (~ct & ch, "^", color, "horizon censored"), (ct & ch, "D", "none", "both censored")):
            sel = good & (ivs == iv) & mask
            if sel.any():
                sc = ax.scatter(t[sel], h[sel], s=16, marker=marker, facecolors=fill, edgecolors=color,
                                label=None if labelled else iv, transform=dodge)
                sc.set_gid(what)  # which censoring the points carry (read by the tests)
                labelled = True
        points, counts = np.unique(np.stack([t[good & (ivs == iv)], h[good & (ivs == iv)]], 1), axis=0, return_counts=True)
        for (pt, ph), k in zip(points, counts):
            if k > 1:  # k models of this arm on one point
                ax.annotate(f"×{k}", (pt, ph), xycoords=dodge, xytext=(0, 3), textcoords="offset points", ha="center",
                            va="bottom", fontsize=6, color=color)
    lo, hi = float(np.nanmin([t[good], h[good]])), float(np.nanmax([t[good], h[good]]))
    ax.plot([lo, hi], [lo, hi], color="0.5", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.margins(0.12)  # room for the arms drawn beside a point at the view's edge, and their counts above it
    ax.set_xlabel(axis_label(ds["geo_T_cross"], "T_cross"))
    ax.set_ylabel(axis_label(ds["geo_horizon"], "retrieval horizon"))
    x, y = np.log2(t[good]), np.log2(h[good])
    if good.sum() <= 2:
        said = "r undefined (2 models or fewer)"
    elif x.std() == 0 or y.std() == 0:  # one side has one value for every model
        name, value = ("T_cross", t[good][0]) if x.std() == 0 else ("the horizon", h[good][0])
        said = f"r undefined ({name} is {value:g} in every model)"
    else:
        said = f"r = {float(np.corrcoef(x, y)[0, 1]):.2f}"
    ax.set_title(f"T_cross vs retrieval horizon: {said}\n(n = {int(good.sum())}; censored: "
                 f"{int((ct & good).sum())} T_cross, {int((ch & good).sum())} horizons)")
    legend(ax, fontsize="small")
    return ax


def _geometry_panels(ds: xr.Dataset, kind: str) -> dict[str, Panel]:
    if "geo_q" not in ds:
        return {}
    return {f"{kind}_geometry_q": Panel(geometry_q_panel, figure="geometry"),
            f"{kind}_geometry_tcross": Panel(geometry_tcross_panel, figure="geometry")}


def copying_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """The panels of a copying dataset: per-character accuracy and exact match vs length
    (and, once analysed, the state geometry's two panels, in their own figure ``geometry``)."""
    return {"copying_accuracy": Panel(copying_panel), "copying_exact_match": Panel(copying_panel, {"variable": "exact_match"}),
            **_geometry_panels(ds, "copying")}


def passkey_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """The panels of a passkey dataset: one accuracy heatmap per intervention, one difference panel per contrast
    (and, once analysed, the state geometry's two panels, in their own figure ``geometry``)."""
    panels = {f"passkey_{iv}": Panel(passkey_heatmap, {"intervention": iv}) for iv in _interventions(ds)}
    if "contrast" in ds.coords:
        panels.update({f"passkey_diff_{c}": Panel(passkey_difference, {"contrast": str(c)}) for c in ds["contrast"].values})
    panels.update(_geometry_panels(ds, "passkey"))
    return panels


def babilong_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """The panels of a babilong dataset: accuracy per task kind, one panel per intervention
    (and, once analysed, the state geometry's two panels, in their own figure ``geometry``)."""
    return {**{f"babi_{iv}": Panel(babi_panel, {"intervention": iv}) for iv in _interventions(ds)},
            **_geometry_panels(ds, "babi")}
