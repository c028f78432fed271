"""Figures: panels as pure ``(ds, ax) -> ax`` functions, and :func:`write_figures`.

``write_figures(ds, out_dir)`` draws every panel that applies to a study dataset (chosen
by ``ds.attrs['study']``), each as ``<panel>.png`` and ``<panel>.pdf`` at column width in
the house style (:mod:`dynlab.figures.style`), plus one composite ``<study>.png/.pdf``
of all drawn panels at page width.  A panel whose variables are missing (e.g. a study
run without analyses) is skipped with a note.  For the nonlinearity study it also
writes ``mp_table.md``.  Panels never import torch and never touch files.

The length-generalization panels live in :mod:`dynlab.figures.lm` (imported only when
such a dataset is drawn).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import xarray as xr
from matplotlib.axes import Axes

from dynlab.figures.style import COLUMN_WIDTH, PAGE_WIDTH, PANEL_HEIGHT, publication_style
from dynlab.figures.tracking import (
    MissingData,
    accuracy_heatmap,
    failure_modes,
    margin_panel,
    mp_by_nonlinearity,
    mp_failure_table,
    perturbation_recovery,
    q_curves,
    r_par_perp,
    return_map_eigs,
    tcross_mp_scatter,
)

__all__ = [
    "FigureSet",
    "MissingData",
    "accuracy_heatmap",
    "failure_modes",
    "margin_panel",
    "mp_by_nonlinearity",
    "mp_failure_table",
    "perturbation_recovery",
    "q_curves",
    "r_par_perp",
    "return_map_eigs",
    "study_panels",
    "tcross_mp_scatter",
    "write_figures",
]

Panel = Callable[[xr.Dataset, Axes], Axes]


@dataclass
class FigureSet:
    """What :func:`write_figures` did: files written, and panels skipped with the reason."""

    written: list[Path] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def _groups(ds: xr.Dataset) -> list[str]:
    if "group" not in ds.coords:
        return []
    return list(dict.fromkeys(str(g) for g in ds["group"].values))


def _missing_as_note(panel: Panel) -> Panel:
    """Turn a panel's KeyError or ValueError (an absent variable) into :class:`MissingData`."""

    def guarded(ds: xr.Dataset, ax: Axes) -> Axes:
        try:
            return panel(ds, ax)
        except (KeyError, ValueError) as exc:
            raise MissingData(f"{getattr(panel, '__name__', 'panel')}: {exc} (absent from the dataset?)") from None

    return guarded


def study_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """Panel name -> panel for the study that wrote ``ds`` (``ds.attrs['study']``)."""
    study = str(ds.attrs.get("study", ""))
    if study == "length-generalization":
        from dynlab.figures import lm

        return {name: _missing_as_note(panel) for name, panel in lm.PANELS.items()}
    if study in ("copying", "passkey", "babilong"):
        from dynlab.figures import tasks

        return {name: _missing_as_note(panel) for name, panel in tasks.task_panels(ds).items()}
    groups = _groups(ds)
    if study == "nonlinearity":
        panels: dict[str, Panel] = {"mp_by_nonlinearity": mp_by_nonlinearity}
        for g in groups:
            panels[f"accuracy_{g}"] = partial(accuracy_heatmap, group=g, by="nonlinearity")
        panels["failure_modes"] = partial(failure_modes, by="nonlinearity")
        for g in groups:
            panels[f"q_{g}"] = partial(q_curves, group=g, color_by="nonlinearity")
        panels["return_map_eigs"] = partial(return_map_eigs, color_by="nonlinearity")
        return panels
    panels = {f"accuracy_{g}": partial(accuracy_heatmap, group=g) for g in groups} or {"accuracy": accuracy_heatmap}
    panels.update(
        {
            "q_curves": q_curves,
            "q_dec_curves": partial(q_curves, variable="q_dec"),
            "tcross_mp": tcross_mp_scatter,
            "tcross_q_mp": partial(tcross_mp_scatter, variant="q"),
            "r_par_perp": r_par_perp,
            "return_map_eigs": return_map_eigs,
            "perturbation_recovery": perturbation_recovery,
            "failure_modes": failure_modes,
            "failure_modes_dec": partial(failure_modes, variable="failure_mode_dec"),
            "margin": margin_panel,
        }
    )
    return panels


def _save(fig, stem: Path, written: list[Path]) -> None:
    for ext in ("png", "pdf"):
        path = stem.with_suffix(f".{ext}")
        fig.savefig(path)
        written.append(path)


def write_figures(ds: xr.Dataset, out_dir: str | Path) -> FigureSet:
    """Write every applicable panel (PNG + PDF) and one composite figure to ``out_dir``."""
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = FigureSet()
    panels = study_panels(ds)
    drawn: list[tuple[str, Panel]] = []
    with publication_style():
        for name, panel in panels.items():
            fig = Figure(figsize=(COLUMN_WIDTH, PANEL_HEIGHT), layout="constrained")
            try:
                panel(ds, fig.add_subplot())
            except MissingData as exc:
                result.skipped[name] = str(exc)
                continue
            _save(fig, out / name, result.written)
            drawn.append((name, panel))
        if drawn:
            ncols = 2 if len(drawn) > 1 else 1
            nrows = math.ceil(len(drawn) / ncols)
            fig = Figure(figsize=(PAGE_WIDTH if ncols == 2 else COLUMN_WIDTH, PANEL_HEIGHT * nrows),
                         layout="constrained")
            axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
            for ax, (name, panel), letter in zip(axes, drawn, "abcdefghijklmnopqrstuvwxyz"):
                panel(ds, ax)
                title = ax.get_title()
                ax.set_title("")
                ax.set_title(f"({letter}) {title}", loc="left")
            for ax in axes[len(drawn):]:
                ax.set_visible(False)
            study = str(ds.attrs.get("study", "")) or "study"
            _save(fig, out / study, result.written)
        if str(ds.attrs.get("study", "")) == "nonlinearity":
            try:
                table = out / "mp_table.md"
                table.write_text(mp_failure_table(ds))
                result.written.append(table)
            except MissingData as exc:
                result.skipped["mp_table"] = str(exc)
    notes = [f"{k}: skipped ({v})" for k, v in result.skipped.items()]
    (out / "NOTES.txt").write_text("\n".join(notes) + ("\n" if notes else "all panels drawn\n"))
    return result
