"""Figures: panels as pure ``(ds, ax) -> ax`` functions, and :func:`write_figures`.

Every panel declares the dataset variables it reads (:func:`dynlab.figures.panel.needs`),
and every study declares its panels (``Study.panels``: a function of the dataset giving
panel name -> :class:`~dynlab.figures.panel.Panel` or :class:`~dynlab.figures.panel.Table`;
each paper's panels and their builders live in its own package: paper A's in
:mod:`dynlab.tracking.figures` (:func:`~dynlab.tracking.figures.sets.group_tracking_panels`,
:func:`~dynlab.tracking.figures.sets.nonlinearity_panels`), paper B's in :mod:`dynlab.lm.figures`
(:func:`~dynlab.lm.figures.panels.length_generalization_panels`, the task studies' in
:mod:`dynlab.lm.figures.tasks`).  This package holds what every study's figures share and
imports neither paper.

``write_figures(ds, out_dir, panels)`` draws each panel as ``<panel>.png`` and
``<panel>.pdf`` (or the formats asked for, :data:`~dynlab.names.FIGURE_FORMATS`) at column
width (or page width) in the house style (:mod:`dynlab.figures.style`), the composites of
the drawn panels at page width (:func:`composite_pages`: one per claim a study declares,
``Panel.figure``, ``<study>.png`` the main one, ``<study>-<claim>.png`` the others, none
more than three rows of two, so each fits a page), and each table as ``<name>.md``.  A
title wider than its axes is wrapped (:func:`~dynlab.figures.style.fit_titles`), never
clipped, and a legend that would cover a data point is moved where it covers none
(:func:`~dynlab.figures.legends.fit_legends`).  A panel is skipped (no file, a note) only when a variable it declared is
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
from dynlab.figures.legends import fit_figure
from dynlab.figures.style import (
    COLUMN_WIDTH, PAGE_PANEL_HEIGHT, PAGE_WIDTH, PANEL_HEIGHT, ROW_HEIGHT, publication_style,
)
from dynlab.names import FIGURE_FORMATS, FIGURE_WIDTHS

__all__ = [
    "FigureSet",
    "MissingData",
    "MissingVariables",
    "NothingToDraw",
    "Panel",
    "Table",
    "MAX_ROWS",
    "composite_figure",
    "composite_pages",
    "draw_empty",
    "figure_items",
    "needs",
    "panel_figure",
    "panel_size",
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


#: matplotlib's notice that a figure too crowded for its size keeps its plain layout: the
#: figure is written all the same, and the notice (which names a line of dynlab's source) is not shown.
LAYOUT_NOTICE = "constrained_layout not applied"

#: The most rows of panels a composite holds (two panels a row): at :data:`ROW_HEIGHT` a
#: row, less than a page high (:data:`~dynlab.figures.style.PAGE_HEIGHT`).
MAX_ROWS = 3

#: The formats :func:`write_figures` writes unless told otherwise.
DEFAULT_FORMATS = ("png", "pdf")


def _save(fig, stem: Path, written: list[Path], formats: Sequence[str] = DEFAULT_FORMATS) -> None:
    import warnings

    for ext in formats:
        path = stem.with_suffix(f".{ext}")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=LAYOUT_NOTICE, category=UserWarning)
            fig.savefig(path)
        written.append(path)


def panel_size(width: str = "column") -> tuple[float, float]:
    """The size (inches) of one panel's figure at ``width``: ``column`` (:data:`COLUMN_WIDTH`
    by :data:`PANEL_HEIGHT`) or ``page`` (:data:`PAGE_WIDTH` by :data:`PAGE_PANEL_HEIGHT`)."""
    if width not in FIGURE_WIDTHS:
        raise ValueError(f"unknown width {width!r}; allowed: {', '.join(FIGURE_WIDTHS)}")
    return (COLUMN_WIDTH, PANEL_HEIGHT) if width == "column" else (PAGE_WIDTH, PAGE_PANEL_HEIGHT)


def panel_figure(ds: xr.Dataset, item: Panel, width: str = "column") -> tuple[Any, str | None]:
    """One panel on its own figure (:func:`panel_size` of ``width``; titles fitted, legends
    off the data, :func:`~dynlab.figures.legends.fit_figure`): ``(figure, None)``, or, when
    it has nothing to draw, ``(its empty version, why)``."""
    from matplotlib.figure import Figure

    size = panel_size(width)
    fig = Figure(figsize=size, layout="constrained")
    why = None
    try:
        item(ds, fig.add_subplot())
    except NothingToDraw as exc:
        why = str(exc)
        # a fresh figure: the panel may have drawn something before it gave up
        fig = Figure(figsize=size, layout="constrained")
        draw_empty(fig.add_subplot(), item.label, why)
    return fit_figure(fig), why


def composite_figure(ds: xr.Dataset, drawn: Sequence[tuple[str, Panel, str | None]]) -> Any:
    """The composite of ``drawn`` (``(name, panel, why it is empty or None)``, at most
    :data:`MAX_ROWS` rows of two): two columns at page width (:data:`PAGE_WIDTH`, one
    column for a single panel), :data:`ROW_HEIGHT` a row, panels lettered (a), (b), ...
    in their titles, titles fitted and legends off the data."""
    from matplotlib.figure import Figure

    ncols = 2 if len(drawn) > 1 else 1
    nrows = math.ceil(len(drawn) / ncols)
    if nrows > MAX_ROWS:
        raise ValueError(f"a composite holds at most {2 * MAX_ROWS} panels (a page), got {len(drawn)}; "
                         "split them with composite_pages")
    fig = Figure(figsize=(PAGE_WIDTH if ncols == 2 else COLUMN_WIDTH, ROW_HEIGHT * nrows), layout="constrained")
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
    return fit_figure(fig)


def composite_pages(study: str, drawn: Sequence[tuple[str, Panel, str | None]]) -> list[tuple[str, list]]:
    """The composites :func:`write_figures` draws of ``drawn``: ``(file stem, panels)``, one
    per ``Panel.figure`` (claim) in order of first appearance, the main one (``""``) first
    and named ``study``, the others ``study-figure``; a figure of more panels than a page
    holds (:data:`MAX_ROWS` rows of two) goes on pages ``stem``, ``stem-2``, ..."""
    claims: dict[str, list] = {}
    for entry in sorted(drawn, key=lambda d: d[1].figure != ""):  # stable: the main figure first
        claims.setdefault(entry[1].figure, []).append(entry)
    pages = []
    for claim, entries in claims.items():
        stem = f"{study}-{claim}" if claim else study
        for start in range(0, len(entries), 2 * MAX_ROWS):
            pages.append((stem if start == 0 else f"{stem}-{start // (2 * MAX_ROWS) + 1}",
                          entries[start:start + 2 * MAX_ROWS]))
    return pages


def figure_items(ds: xr.Dataset, panels: FigureItems | Callable[[xr.Dataset], FigureItems]) -> dict[str, Panel | Table]:
    """What :func:`write_figures` draws of ``ds``: ``panels`` (a study's ``Study.panels``, a
    function of the dataset, or its result), joined by the training-loss panel wherever the
    runs stored their loss curves (:func:`dynlab.figures.training.training_panels`)."""
    from dynlab.figures.training import training_panels

    items = dict(panels(ds) if callable(panels) else panels)
    return {**items, **{k: v for k, v in training_panels(ds).items() if k not in items}}  # every study's loss curves


def write_figures(ds: xr.Dataset, out_dir: str | Path, panels: FigureItems | Callable[[xr.Dataset], FigureItems],
                  names: Sequence[str] | None = None, formats: Sequence[str] = DEFAULT_FORMATS,
                  width: str = "column") -> FigureSet:
    """Write every panel of :func:`figure_items` (one file per format of ``formats``, of
    :data:`~dynlab.names.FIGURE_FORMATS`, at ``width``: :func:`panel_size`), the composites
    (:func:`composite_pages`, page width) and every table (Markdown) to ``out_dir``.  With
    ``names``, only those panels and tables, and no composite.  A panel or table with
    nothing to draw is written empty, saying why.  Also writes ``NOTES.txt`` listing the
    skipped and the empty ones."""
    out = Path(out_dir)
    items = figure_items(ds, panels)
    if names is not None:
        unknown = [n for n in names if n not in items]
        if unknown:
            raise ValueError(f"unknown panel {unknown[0]!r}; allowed: {', '.join(items)}")
        items = {n: items[n] for n in names}
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if bad or not formats:
        raise ValueError(f"unknown format {bad[0] if bad else ''!r}; allowed: {', '.join(FIGURE_FORMATS)}")
    panel_size(width)  # a width it does not know is refused before anything is written
    out.mkdir(parents=True, exist_ok=True)
    result = FigureSet()
    with publication_style():
        drawn = _draw_items(ds, items, out, result, formats, width)
        if drawn and names is None:
            study = str(ds.attrs.get("study", "")) or "study"
            for stem, page in composite_pages(study, drawn):
                _save(composite_figure(ds, page), out / stem, result.written, formats)
    notes = [f"{k}: {'drawn empty' if k in result.empty else 'skipped'} ({v})" for k, v in result.skipped.items()]
    (out / "NOTES.txt").write_text("\n".join(notes) + ("\n" if notes else "all panels drawn\n"))
    return result


def _draw_items(ds: xr.Dataset, items: Mapping[str, Panel | Table], out: Path, result: FigureSet,
                formats: Sequence[str], width: str) -> list[tuple[str, Panel, str | None]]:
    """Write each panel (its formats) and table of ``items`` into ``out``, noting in
    ``result`` what was written, skipped and drawn empty; the panels drawn, for the composites."""
    drawn: list[tuple[str, Panel, str | None]] = []  # (name, panel, why it is empty or None)

    def nothing(name: str, why: str) -> str:
        result.skipped[name] = why
        result.empty.append(name)
        return why

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
        fig, why = panel_figure(ds, item, width)
        if why is not None:
            nothing(name, why)
        _save(fig, out / name, result.written, formats)
        drawn.append((name, item, why))
    return drawn
