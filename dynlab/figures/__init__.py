"""Figures: panels as pure ``(ds, ax) -> ax`` functions, and :func:`write_figures`.

Every panel declares the dataset variables it reads (:func:`dynlab.figures.panel.needs`),
and every study declares its panels (``Study.panels``: a function of the dataset giving
panel name -> :class:`~dynlab.figures.panel.Panel` or :class:`~dynlab.figures.panel.Table`;
the builders are :func:`group_tracking_panels`, :func:`nonlinearity_panels`,
:func:`dynlab.figures.lm.length_generalization_panels` and the task studies' in
:mod:`dynlab.figures.tasks`).

``write_figures(ds, out_dir, panels)`` draws each panel as ``<panel>.png`` and
``<panel>.pdf`` at column width in the house style (:mod:`dynlab.figures.style`), one
composite ``<study>.png/.pdf`` of all drawn panels at page width (7 in, two columns), and
each table as ``<name>.md``; a title wider than its axes is wrapped
(:func:`~dynlab.figures.style.fit_titles`), never clipped.  A panel is skipped (no file, a note) only when a variable it declared is
absent (e.g. a study run without analyses).  A panel that finds nothing to draw in its
variables (:class:`~dynlab.figures.panel.NothingToDraw`, e.g. no run of the study
learned) is still written, as an empty panel whose text says why
(:func:`~dynlab.figures.panel.draw_empty`; in the composite too), and noted: the files and
the composite's panel letters are the same whatever the runs did.  Any other error in a
panel is a bug and propagates.  Panels never import torch and never touch files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xarray as xr

from dynlab.figures.panel import (
    MissingData, MissingVariables, NothingToDraw, Panel, Table, draw_empty, empty_table, needs,
)
from dynlab.figures.ablation import mp_by_nonlinearity, mp_failure_table
from dynlab.figures.dynamics import (
    failure_modes, fixed_point_spectra, margin_panel, perturbation_recovery, return_map_eigs,
)
from dynlab.figures.style import COLUMN_WIDTH, PAGE_WIDTH, PANEL_HEIGHT, fit_titles, publication_style
from dynlab.figures.tracking import (
    accuracy_heatmap, horizon_forecast_scatter, q_curves, r_par_perp, tcross_mp_scatter,
)

__all__ = [
    "FigureSet",
    "MissingData",
    "MissingVariables",
    "NothingToDraw",
    "Panel",
    "Table",
    "accuracy_heatmap",
    "composite_figure",
    "draw_empty",
    "failure_modes",
    "fixed_point_spectra",
    "group_tracking_panels",
    "margin_panel",
    "mp_by_nonlinearity",
    "mp_failure_table",
    "needs",
    "nonlinearity_panels",
    "panel_figure",
    "perturbation_recovery",
    "q_curves",
    "r_par_perp",
    "return_map_eigs",
    "tcross_mp_scatter",
    "write_figures",
]

#: What a study declares: panel name -> Panel (drawn) or Table (written as Markdown).
FigureItems = Mapping[str, "Panel | Table"]


@dataclass
class FigureSet:
    """What :func:`write_figures` did.

    Attributes:
        written: the files written, in order.
        skipped: panel or table name -> why it was not drawn from data: a declared
            variable is absent (no file written) or it found nothing to draw (written
            empty, saying why; its name is also in ``empty``).
        empty: the names of the panels and tables written empty.
    """

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)


def _groups(ds: xr.Dataset) -> list[str]:
    if "group" not in ds.coords:
        return []
    return list(dict.fromkeys(str(g) for g in ds["group"].values))


def group_tracking_panels(ds: xr.Dataset) -> dict[str, Panel | Table]:
    """The panels of a group-tracking dataset: an accuracy heatmap per group, q(t) and
    q_dec(t), T_cross vs mp (default variant and q), the horizon forecast vs mp, R∥/R⊥, return-map eigenvalues
    at the centroids and at the fixed points, perturbation recovery, failure modes (from q and q_dec) and the margin per group."""
    panels: dict[str, Panel | Table] = {f"accuracy_{g}": Panel(accuracy_heatmap, {"group": g}) for g in _groups(ds)}
    if not panels:
        panels["accuracy"] = Panel(accuracy_heatmap)
    panels.update(
        q_curves=Panel(q_curves),
        q_dec_curves=Panel(q_curves, {"variable": "q_dec"}),
        tcross_mp=Panel(tcross_mp_scatter),
        tcross_q_mp=Panel(tcross_mp_scatter, {"variant": "q"}),
        horizon_forecast=Panel(horizon_forecast_scatter),
        r_par_perp=Panel(r_par_perp),
        return_map_eigs=Panel(return_map_eigs),
        fixed_point_spectra=Panel(fixed_point_spectra),
        perturbation_recovery=Panel(perturbation_recovery),
        failure_modes=Panel(failure_modes),
        failure_modes_dec=Panel(failure_modes, {"variable": "failure_mode_dec"}),
        margin=Panel(margin_panel),
    )
    return panels


def nonlinearity_panels(ds: xr.Dataset) -> dict[str, Panel | Table]:
    """The panels of the nonlinearity ablation: mp per φ, accuracy heatmaps (a row per φ),
    failure modes per φ, q(t) per group coloured by φ, return-map eigenvalues, and the
    Markdown table ``mp_table`` (:func:`~dynlab.figures.ablation.mp_failure_table`)."""
    groups = _groups(ds)
    panels: dict[str, Panel | Table] = {"mp_by_nonlinearity": Panel(mp_by_nonlinearity)}
    for g in groups:
        panels[f"accuracy_{g}"] = Panel(accuracy_heatmap, {"group": g, "by": "nonlinearity"})
    panels["failure_modes"] = Panel(failure_modes, {"by": "nonlinearity"})
    for g in groups:
        panels[f"q_{g}"] = Panel(q_curves, {"group": g, "color_by": "nonlinearity"})
    panels["return_map_eigs"] = Panel(return_map_eigs, {"color_by": "nonlinearity"})
    panels["mp_table"] = Table(mp_failure_table)
    return panels


#: matplotlib's notice that a figure too crowded for its size keeps its plain layout: the
#: figure is written all the same, and the notice (which names a line of dynlab's source) is not shown.
LAYOUT_NOTICE = "constrained_layout not applied"


def _save(fig, stem: Path, written: list[Path]) -> None:
    import warnings

    for ext in ("png", "pdf"):
        path = stem.with_suffix(f".{ext}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LAYOUT_NOTICE, category=UserWarning)
            fig.savefig(path)
        written.append(path)


def panel_figure(ds: xr.Dataset, item: Panel) -> tuple[Any, str | None]:
    """One panel on its own figure (column width, titles fitted): ``(figure, None)``, or,
    when it has nothing to draw, ``(its empty version, why)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(COLUMN_WIDTH, PANEL_HEIGHT), layout="constrained")
    why = None
    try:
        item(ds, fig.add_subplot())
    except NothingToDraw as exc:
        why = str(exc)
        # a fresh figure: the panel may have drawn something before it gave up
        fig = Figure(figsize=(COLUMN_WIDTH, PANEL_HEIGHT), layout="constrained")
        draw_empty(fig.add_subplot(), item.label, why)
    return fit_titles(fig), why


def composite_figure(ds: xr.Dataset, drawn: Sequence[tuple[str, Panel, str | None]]) -> Any:
    """The composite of ``drawn`` (``(name, panel, why it is empty or None)``): two columns at
    page width (:data:`PAGE_WIDTH`, one column for a single panel), panels lettered (a), (b),
    ... in their titles, titles fitted to their axes."""
    from matplotlib.figure import Figure

    ncols = 2 if len(drawn) > 1 else 1
    nrows = math.ceil(len(drawn) / ncols)
    fig = Figure(figsize=(PAGE_WIDTH if ncols == 2 else COLUMN_WIDTH, PANEL_HEIGHT * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax, (_, panel, why), letter in zip(axes, drawn, "abcdefghijklmnopqrstuvwxyz"):
        if why is None:
            panel(ds, ax)
        else:
            draw_empty(ax, panel.label, why)
        title = ax.get_title()
        ax.set_title("")
        ax.set_title(f"({letter}) {title}", loc="left")
    for ax in axes[len(drawn):]:
        ax.set_visible(False)
    return fit_titles(fig)


def write_figures(ds: xr.Dataset, out_dir: str | Path,
                  panels: FigureItems | Callable[[xr.Dataset], FigureItems]) -> FigureSet:
    """Write every panel of ``panels`` (PNG + PDF), one composite figure and every table
    (Markdown) to ``out_dir``; ``panels`` is a study's ``Study.panels`` (a function of the
    dataset) or its result, joined by the training-loss panel wherever the runs stored their
    loss curves (:func:`dynlab.figures.training.training_panels`).  A panel or table with nothing to draw is written empty,
    saying why.  Also writes ``NOTES.txt`` listing the skipped and the empty ones."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = FigureSet()
    items = panels(ds) if callable(panels) else panels
    from dynlab.figures.training import training_panels

    items = {**items, **{k: v for k, v in training_panels(ds).items() if k not in items}}  # every study's loss curves
    drawn: list[tuple[str, Panel, str | None]] = []  # (name, panel, why it is empty or None)

    def nothing(name: str, why: str) -> str:
        result.skipped[name] = why
        result.empty.append(name)
        return why

    with publication_style():
        for name, item in items.items():
            if not isinstance(item, (Panel, Table)):
                raise TypeError(f"figure item {name!r} is a {type(item).__name__}; allowed: Panel, Table")
            absent = item.missing(ds)
            if absent:
                result.skipped[name] = f"{item.what} needs {', '.join(absent)} (absent from the dataset)"
                continue
            if isinstance(item, Table):
                try:
                    text = item(ds)
                except NothingToDraw as exc:
                    text = empty_table(item.label, nothing(name, str(exc)))
                path = out / f"{name}.md"
                path.write_text(text)
                result.written.append(path)
                continue
            fig, why = panel_figure(ds, item)
            if why is not None:
                nothing(name, why)
            _save(fig, out / name, result.written)
            drawn.append((name, item, why))
        if drawn:
            study = str(ds.attrs.get("study", "")) or "study"
            _save(composite_figure(ds, drawn), out / study, result.written)
    notes = [f"{k}: {'drawn empty' if k in result.empty else 'skipped'} ({v})" for k, v in result.skipped.items()]
    (out / "NOTES.txt").write_text("\n".join(notes) + ("\n" if notes else "all panels drawn\n"))
    return result
