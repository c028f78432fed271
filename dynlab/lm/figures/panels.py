"""Figure panels for the length-generalization study: pure ``(ds, ax) -> ax`` functions.

A study dataset has dims ``run`` and ``t`` (a ``budget`` preset adds ``budget``: one
checkpoint per training budget) and run coords such as ``intervention``, ``phase``,
``arch``, ``d_model``, ``train_length``, ``seed`` and ``annealed``.

Position panels (PPL(t), EffRem, state std) draw one line per *arm*: the runs that share
every run coord but the seed (the coords that differ between arms name the line, e.g.
``d_model 16, T_train 32`` or ``tbtt (post)``), the mean over seeds with a band from the
seeds' minimum to their maximum (the legend says so).  One colour per arm, or per model
size with a line style per training length when both vary.  On a dataset with a
``budget`` dimension they read each run's last checkpoint and leave out the separately
trained (annealed) runs, which :func:`far_in_budget_panel` draws.

Summary panels: :func:`far_in_budget_panel` (far/in against the training budget),
:func:`context_ladder_panel` (far/in against T_train) and :func:`contrast_forest_panel`
(the paired intervention contrasts, Holm-corrected).  Each labels itself from the
variables' ``long_name``/``units``.  The arms, their colours, legends and the powers-of-two
axes are :mod:`dynlab.figures.arms`.  No torch, no file I/O.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from dynlab.analysis.contrasts import holm  # one home for the correction (re-exported for the task panels)
from dynlab.figures.arms import (
    ARM_COORDS, PALETTE, SHORT_NAMES, arm_legend, arm_styles, factored_legend, final_checkpoint, log2_axis, run_arms,
    run_value, size_colors, varying_coords,
)
from dynlab.figures.panel import NothingToDraw, Panel, needs
from dynlab.figures.style import axis_label

__all__ = ["EFFREM_NAMES", "PANELS", "context_ladder_panel", "contrast_forest_panel", "effrem_panel",
           "far_in_budget_panel", "holm", "length_generalization_panels", "position_dim", "ppl_panel", "ratio_name",
           "run_arms", "size_colors", "state_std_panel"]

#: Dataset variable of EffRem under each distance.
EFFREM_NAMES = {"tv": "effrem", "js": "effrem_js", "cos": "effrem_cos"}


def _position_runs(ds: xr.Dataset) -> np.ndarray:
    """Runs drawn by the position panels: all, less the annealed runs of a budget dataset."""
    runs = np.arange(ds.sizes["run"])
    if "budget" in ds.dims and "annealed" in ds.coords:
        runs = runs[~ds["annealed"].values.astype(bool)]
    return runs


def _mark_training_length(ds: xr.Dataset, ax: Axes) -> None:
    if "train_length" in ds.coords:
        for length in np.unique(ds["train_length"].values):
            ax.axvline(float(length), color="0.5", linestyle=":", linewidth=0.8, zorder=0)


def _log2_positions(ax: Axes, t: np.ndarray) -> None:
    log2_axis(ax, t, lambda v, _: f"{v:g}")


#: The position dims of a language model's curves: each quantity on its own
#: (:data:`dynlab.results.positions.POSITION_AXES`).
POSITION_DIMS = ("t", "t_bin", "t_effrem", "t_state")


def position_dim(da: xr.DataArray) -> str:
    """The position dim of an LM curve ``da`` (one of :data:`POSITION_DIMS`)."""
    found = [d for d in da.dims if d in POSITION_DIMS]
    if len(found) != 1:
        raise ValueError(f"{da.name or 'the curve'} needs exactly one position dim of {', '.join(POSITION_DIMS)}; "
                         f"its dims are {', '.join(map(str, da.dims))}")
    return str(found[0])


def _arm_lines(ds: xr.Dataset, da: xr.DataArray, ax: Axes, mark_training: bool = True, kept: bool = False) -> Axes:
    """Mean over seeds per arm with a min–max band (see the module docstring); with ``kept``
    the x axis is the context kept, eval_length − t (points with at least one token)."""
    da = final_checkpoint(da)
    pos = position_dim(da)
    arms = run_arms(ds, _position_runs(ds))
    styles = arm_styles(ds, arms)
    handles, banded, drawn = [], False, []
    for (label, values, idx), style in zip(arms, styles):
        part = da.isel(run=idx)
        mean = part.mean("run", skipna=True).dropna(pos)
        if not mean.size:
            continue
        x = mean[pos].values.astype(float)
        if kept:
            x = float(ds["eval_length"].values[idx[0]]) - x
        order = np.argsort(x)
        order = order[x[order] >= 1] if kept else order
        (line,) = ax.plot(x[order], mean.values[order], label=label, **style)
        handles.append(line)
        drawn.append((label, values, idx, style))
        if len(idx) > 1:
            lo = part.min("run", skipna=True).sel({pos: mean[pos]}).values
            hi = part.max("run", skipna=True).sel({pos: mean[pos]}).values
            ax.fill_between(x[order], lo[order], hi[order], color=style["color"], alpha=0.2, linewidth=0)
            banded = True
    if not handles:
        raise NothingToDraw(f"{da.name or 'the variable'} holds no finite value")
    ax.set_xlabel("position t [tokens]")
    if mark_training:
        _mark_training_length(ds, ax)
    arm_legend(ax, factored_legend(ds, [d[:3] for d in drawn], [d[3] for d in drawn], handles), banded)
    return ax


def _checkpoint_note(ds: xr.Dataset) -> str:
    return ", last checkpoint" if "budget" in ds.dims else ""


@needs(lambda ds, o: "ppl_binned" if o["binned"] and "ppl_binned" in ds else "ppl", what="PPL(t)")
def ppl_panel(ds: xr.Dataset, ax: Axes, binned: bool = True) -> Axes:
    """PPL(t) per arm (binned by default), log-scaled position axis."""
    name = "ppl_binned" if binned and "ppl_binned" in ds else "ppl"
    _arm_lines(ds, ds[name], ax)
    pos = position_dim(ds[name])
    _log2_positions(ax, ds[name].dropna(pos, how="all")[pos].values.astype(float))
    ax.set_ylabel(axis_label(ds[name], "perplexity"))
    ax.set_title("PPL(t) from the zero state" + _checkpoint_note(ds))
    return ax


def _effrem_name(ds: xr.Dataset, options: dict) -> str:
    distance = options["distance"]
    if distance not in EFFREM_NAMES:
        raise ValueError(f"distance must be one of {', '.join(EFFREM_NAMES)}, got {distance!r}")
    return EFFREM_NAMES[distance]


@needs(_effrem_name, what="EffRem")
def effrem_panel(ds: xr.Dataset, ax: Axes, distance: str = "tv") -> Axes:
    """EffRem_T(t) per arm for ``distance`` in tv, js, cos (T = evaluation length), against
    the context kept T − t on a log axis (T_train dotted), or, without ``eval_length``, the
    truncation start t."""
    name = EFFREM_NAMES[distance]
    if "eval_length" in ds.coords:  # on a log axis of the context kept, T − t (T_train dotted)
        _arm_lines(ds, ds[name], ax, kept=True)
        _log2_positions(ax, np.asarray([x for ln in ax.get_lines() for x in ln.get_xdata()], dtype=float))
        ax.set_xlabel("context kept T − t [tokens]")
    else:
        _arm_lines(ds, ds[name], ax, mark_training=False)
        ax.set_xlabel("truncation start t [tokens]")
    ax.set_ylabel(axis_label(ds[name], "EffRem"))
    ax.set_title("EffRem_T(t), T = evaluation length" + _checkpoint_note(ds))
    return ax


@needs("state_std", what="state std")
def state_std_panel(ds: xr.Dataset, ax: Axes, layer: int | None = None) -> Axes:
    """State std per arm over position (log scale), averaged over heads (and layers unless ``layer`` is given)."""
    da = ds["state_std"]
    da = da.sel(layer=layer).mean("head") if layer is not None else da.mean(("layer", "head"))
    da.attrs = ds["state_std"].attrs
    _arm_lines(ds, da, ax)
    pos = position_dim(da)
    _log2_positions(ax, da.dropna(pos, how="all")[pos].values.astype(float))
    ax.set_yscale("log")
    ax.set_ylabel(axis_label(ds["state_std"], "state std"))
    ax.set_title("State std vs position" + (f" (layer {layer})" if layer is not None else "") + _checkpoint_note(ds))
    return ax


def ratio_name(ds: xr.Dataset) -> str:
    """The far/in ratio a summary panel reads: ``far_over_in`` (far PPL over the mean PPL in
    (T_train/2, T_train]) when present, else ``far_in_ratio`` (far PPL over p*)."""
    return "far_over_in" if "far_over_in" in ds else "far_in_ratio"


def _ratio_label(ds: xr.Dataset, name: str) -> str:
    what = {"far_over_in": "far PPL / PPL in (T_train/2, T_train]", "far_in_ratio": "far PPL / p*"}[name]
    return what


def _ok(ds: xr.Dataset) -> np.ndarray:
    if "status" in ds:
        return ds["status"].values.astype(str) == "ok"
    return np.ones(ds.sizes["run"], bool)


def _chinchilla(v: float, _=None) -> str:
    return f"{v:g}"


@needs(lambda ds, o: ratio_name(ds), "budget", what="far/in vs budget")
def far_in_budget_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """far/in against the training budget (log2 axis, Chinchilla multiples): one line per
    model size and T_train (mean over seeds of the in-run checkpoints, min–max band over
    seeds), the separately trained (``annealed``) runs as open markers at their budget."""
    name = ratio_name(ds)
    da = ds[name]
    budget = ds["budget"].values.astype(float)
    annealed = ds["annealed"].values.astype(bool) if "annealed" in ds.coords else np.zeros(ds.sizes["run"], bool)
    ok = _ok(ds)
    ladder = np.flatnonzero(~annealed & ok)
    arms = run_arms(ds, ladder) if ladder.size else []
    styles = arm_styles(ds, arms)
    handles, banded, drawn, lined = [], False, [], []
    by_key = {}
    for (label, values, idx), style in zip(arms, styles):
        part = da.isel(run=idx)
        mean = part.mean("run", skipna=True).values
        keep = np.isfinite(mean)
        if not keep.any():
            continue
        (line,) = ax.plot(budget[keep], mean[keep], marker="o", markersize=2.5, label=label, **style)
        handles.append(line)
        lined.append((label, values, idx, style))
        drawn.extend(budget[keep])
        by_key[(values.get("d_model"), values.get("train_length"), values.get("arch"))] = style
        if len(idx) > 1:
            lo, hi = part.min("run", skipna=True).values, part.max("run", skipna=True).values
            ax.fill_between(budget[keep], lo[keep], hi[keep], color=style["color"], alpha=0.2, linewidth=0)
            banded = True
    marked = False
    for i in np.flatnonzero(annealed & ok):
        values = da.isel(run=i).values
        keep = np.isfinite(values)
        if not keep.any():
            continue
        key = tuple(run_value(ds, k, int(i)) if k in ds.coords else None for k in ("d_model", "train_length", "arch"))
        style = by_key.get(key) or next((s for k, s in by_key.items() if k[0] == key[0]), {"color": "0.3"})
        ax.plot(budget[keep], values[keep], linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                markeredgecolor=style["color"], markeredgewidth=1.0, label="_annealed")
        drawn.extend(budget[keep])
        marked = True
    if not drawn:
        raise NothingToDraw(f"{name} holds no finite value of a run with status ok")
    handles = factored_legend(ds, [x[:3] for x in lined], [x[3] for x in lined], handles)
    if marked:
        handles.append(Line2D([], [], linestyle="none", marker="D", markersize=4, markerfacecolor="white",
                              markeredgecolor="0.3", label="annealed run\n(trained to that budget)"))
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=0.8, zorder=0)
    log2_axis(ax, np.asarray(drawn), _chinchilla)
    ax.set_xlabel("training budget [× Chinchilla]")
    ax.set_ylabel(_ratio_label(ds, name))
    ax.set_title("Far/in PPL vs training budget")
    arm_legend(ax, handles, banded)
    return ax


@needs(lambda ds, o: ratio_name(ds), "train_length", what="context ladder")
def context_ladder_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """far/in against T_train (log2 axis): one line per model size (``d_model``, else per
    arm), mean over seeds with a min–max band, each seed as a dot."""
    name = ratio_name(ds)
    da = final_checkpoint(ds[name])
    runs = np.flatnonzero(_ok(ds))
    if "budget" in ds.dims and "annealed" in ds.coords:
        runs = runs[~ds["annealed"].values.astype(bool)[runs]]
    keys = [k for k in ARM_COORDS if k != "train_length"]
    groups: dict[tuple, list[int]] = {}
    varying = varying_coords(ds, runs, keys)
    for i in runs:
        groups.setdefault(tuple(run_value(ds, k, int(i)) for k in varying), []).append(int(i))
    lengths_all = ds["train_length"].values.astype(float)
    sizes = sorted({c[varying.index("d_model")] for c in groups}) if "d_model" in varying else []
    handles, banded, xs = [], False, []
    for n, (combo, idx) in enumerate(groups.items()):
        values = dict(zip(varying, combo))
        if "d_model" in values:
            color = size_colors(len(sizes))[sizes.index(values["d_model"])]
        else:
            color = PALETTE[n % len(PALETTE)]
        r = da.values[idx].astype(float)
        t = lengths_all[idx]
        ts = np.unique(t[np.isfinite(r)])
        if not ts.size:
            continue
        mean = np.array([np.nanmean(r[t == x]) for x in ts])
        lo = np.array([np.nanmin(r[t == x]) for x in ts])
        hi = np.array([np.nanmax(r[t == x]) for x in ts])
        label = ", ".join(f"{SHORT_NAMES.get(k, k)} {v}" if k in SHORT_NAMES else str(v) for k, v in values.items()) or "all runs"
        if "d_model" in values and "n_params" in ds.coords:
            label += f" ({int(ds['n_params'].values[idx[0]]) / 1000:.1f}k params)"
        (line,) = ax.plot(ts, mean, marker="o", markersize=3, color=color, label=label)
        handles.append(line)
        ax.plot(t, r, linestyle="none", marker=".", markersize=2.5, color=color, alpha=0.6, label="_seed")
        if len(idx) > len(ts):
            ax.fill_between(ts, lo, hi, color=color, alpha=0.2, linewidth=0)
            banded = True
        xs.extend(ts)
    if not xs:
        raise NothingToDraw(f"{name} holds no finite value of a run with status ok")
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=0.8, zorder=0)
    log2_axis(ax, np.asarray(xs), lambda v, _: f"{v:g}")
    ax.set_xlabel("training length T_train [tokens]")
    ax.set_ylabel(_ratio_label(ds, name))
    ax.set_title("Far/in PPL vs training length")
    handles.append(Line2D([], [], linestyle="none", marker=".", color="0.4", label="one seed"))
    arm_legend(ax, handles, banded)
    return ax


def _fmt_p(p: float) -> str:
    if not np.isfinite(p):
        return "p n/a"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


@needs("far_contrast_mean", "far_contrast_lo", "far_contrast_hi", "far_contrast_p", "contrast",
       what="intervention contrasts")
def contrast_forest_panel(ds: xr.Dataset, ax: Axes, mixer: str | None = None) -> Axes:
    """Forest plot of the paired contrasts arm − zero control (same trained model, over
    seeds): far PPL and, when stored, in-range PPL, each mean with its 95 % t-interval; the
    p-values are Holm-corrected over every contrast drawn (far and in-range together)."""
    sel = {}
    if "mixer" in ds["far_contrast_mean"].dims:
        mixers = ds["mixer"].values.astype(str)
        if mixer is not None and mixer not in mixers:
            raise NothingToDraw(f"mixer {mixer!r} is not in the dataset (it has {', '.join(mixers)})")
        sel = {"mixer": mixer if mixer is not None else mixers[0]}
    kinds = [("far", "far PPL", "#D55E00", "o")]
    if all(f"in_contrast_{k}" in ds for k in ("mean", "lo", "hi", "p")):
        kinds.append(("in", "in-range PPL", "#0072B2", "s"))
    arms = ds["contrast"].values.astype(str)
    stats = {k: {s: ds[f"{k}_contrast_{s}"].sel(sel).values.astype(float) for s in ("mean", "lo", "hi", "p")}
             for k, *_ in kinds}
    if not any(np.isfinite(stats[k]["mean"]).any() for k, *_ in kinds):
        raise NothingToDraw("no contrast holds a finite mean")
    adjusted = holm(np.stack([stats[k]["p"] for k, *_ in kinds]))
    n_tests = int(np.isfinite(adjusted).sum())
    offsets = np.linspace(-0.15, 0.15, len(kinds)) if len(kinds) > 1 else [0.0]
    y = np.arange(len(arms))[::-1].astype(float)
    handles = []
    for (k, label, color, marker), dy, padj in zip(kinds, offsets, adjusted):
        s = stats[k]
        err = np.vstack([s["mean"] - s["lo"], s["hi"] - s["mean"]])
        h = ax.errorbar(s["mean"], y + dy, xerr=np.where(np.isfinite(err), err, 0), fmt=marker, color=color,
                        markersize=3.5, capsize=2, elinewidth=1, label=label)
        handles.append(h)
        for xi, yi, pi in zip(s["mean"], y + dy, padj):
            if np.isfinite(xi):  # a column of p-values right of the axes: never on a bar
                ax.annotate(_fmt_p(pi), (1.0, yi), xycoords=("axes fraction", "data"), xytext=(3, 0),
                            textcoords="offset points", va="center", fontsize=6, color=color,
                            annotation_clip=False)
    ax.axvline(0.0, color="0.4", linewidth=0.8, zorder=0)
    ax.set_yticks(y, arms)
    ax.set_ylim(-0.6, len(arms) - 0.4)
    n = ds["far_contrast_n"].sel(sel).values if "far_contrast_n" in ds else None
    seeds = f", n = {int(np.nanmax(n))} seeds" if n is not None and np.isfinite(n).any() else ""
    ax.set_xlabel("paired difference arm − zero control [PPL]")
    ax.set_title("Intervention contrasts (arm − control)")
    ax.legend(handles=handles, fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.3), ncols=2,
              title=f"mean, 95 % CI{seeds}; p Holm-corrected over {n_tests} contrasts", title_fontsize=6)
    return ax


PANELS = {"ppl": ppl_panel, "effrem": effrem_panel, "state_std": state_std_panel}


def length_generalization_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """The panels of a length-generalization dataset: PPL(t), EffRem (TV) and the state std;
    far/in vs budget when the dataset has a ``budget`` dimension; the context ladder when
    T_train varies (without ``budget``); the forget map and memory horizon when the state
    size varies (:mod:`dynlab.lm.figures.forget`); the contrast forest plot when the dataset holds
    intervention contrasts (the study adds the training loss,
    :func:`dynlab.figures.training.training_panels`)."""
    panels = {name: Panel(fn) for name, fn in PANELS.items()}
    from dynlab.lm.report.forget import is_state_map

    if is_state_map(ds):  # the state preset
        from dynlab.lm.figures.forget import forget_horizon_panel, forget_map_panel

        panels["forget_map"] = Panel(forget_map_panel)
        if "memory_horizon" in ds:
            panels["forget_horizon"] = Panel(forget_horizon_panel)
        return panels
    if "budget" in ds.dims:
        panels["far_in_budget"] = Panel(far_in_budget_panel)
    elif "train_length" in ds.coords and len(np.unique(ds["train_length"].values)) > 1:
        panels["context_ladder"] = Panel(context_ladder_panel)
    if "far_contrast_mean" in ds:
        panels["contrasts"] = Panel(contrast_forest_panel)
    return panels
