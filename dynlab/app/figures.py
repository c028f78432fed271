"""``dynlab figures``: every panel of a study (or those ``--panels`` names), drawn into a
folder that only figures are written to, in the formats ``--format`` names and at the
width ``--width`` names; each option is checked before anything is written."""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from dynlab.app.checks import nonempty_path, parse_list
from dynlab.app.folders import check_out
from dynlab.errors import DynlabInputError
from dynlab.names import FIGURE_FORMATS, FIGURE_WIDTHS


#: What ``dynlab figures`` writes (``dynlab.figures.write_figures``): a folder holding
#: only these takes new figures.
FIGURE_FILES = ("*.png", "*.pdf", "*.svg", "*.md", "NOTES.txt")


def figure_formats(text: str) -> tuple[str, ...]:
    """The formats ``--format`` names (a comma list of :data:`~dynlab.names.FIGURE_FORMATS`)."""
    formats = parse_list(text, "--format") or ()
    bad = [f for f in formats if f not in FIGURE_FORMATS]
    if bad:
        raise DynlabInputError(f"unknown --format {bad[0]!r}; allowed: a comma list of {', '.join(FIGURE_FORMATS)}")
    return formats


def figure_width(text: str) -> str:
    """The width ``--width`` names, one of :data:`~dynlab.names.FIGURE_WIDTHS`."""
    if text not in FIGURE_WIDTHS:
        raise DynlabInputError(f"unknown --width {text!r}; allowed: {', '.join(FIGURE_WIDTHS)} "
                               "(3.4 in, one column; 7.2 in, the page)")
    return text


def figure_places(out: str, study_dir: str) -> tuple[Path, Path]:
    """``dynlab figures``'s output folder, checked (not a folder of other files, writable),
    and its STUDY_DIR (not an empty path)."""
    study = nonempty_path(study_dir, "STUDY_DIR", "a study folder written by `dynlab study`, or its dataset.nc")
    out_dir = nonempty_path(out, "--out", "a folder (made when missing), e.g. --out figures")
    from dynlab.outputs import refuse_foreign_folder
    from dynlab.results.folder import FIGURES_MARKER, check_owned_folder

    allowed = "a new or empty folder, or one `dynlab figures` wrote"
    refuse_foreign_folder(out_dir, "--out", own=FIGURE_FILES, allowed=allowed)
    check_owned_folder(out_dir, FIGURES_MARKER, FIGURE_FILES, "--out", allowed, legacy=figure_notes_of_dynlab)
    check_out(out_dir)
    return out_dir, study


def figure_notes_of_dynlab(folder: Path) -> bool:
    """Whether ``folder/NOTES.txt`` reads as the notes ``dynlab figures`` writes (a figure
    folder written before its marker existed)."""
    try:
        lines = (folder / "NOTES.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return False
    note = re.compile(r"[\w.+-]+: (drawn empty|skipped) \(.*\)")
    return bool(lines) and (lines == ["all panels drawn"] or all(note.fullmatch(line) for line in lines))


def figures(study_dir: str | Path, out: str = "figures", panels: str | None = None, formats: str = "png,pdf",
            width: str = "column") -> Any:
    """Draw every panel of the study in ``study_dir`` (a study folder or its dataset.nc), or
    the comma list ``panels`` of them, into ``out`` as ``formats`` (a comma list of png,
    pdf, svg) at ``width`` (column or page), after ``dynlab figures``' checks: what
    :func:`draw_study_figures` returns (``written``, ``skipped``, ``empty``)."""
    kinds, size = figure_formats(formats), figure_width(width)
    names = parse_list(panels, "--panels")
    out_dir, study = figure_places(out, str(study_dir))
    from dynlab.studies import STUDIES

    return draw_study_figures(study, out_dir, STUDIES, names, kinds, size)


def figure_lines(figs: Any) -> list[str]:
    """What ``dynlab figures`` prints of a :class:`~dynlab.figures.FigureSet`: each file
    written, then a line per panel drawn empty (written, saying why) or skipped (not written)."""
    return [*map(str, figs.written),
            *(f"{'drawn empty' if name in figs.empty else 'skipped'} {name}: {why}" for name, why in figs.skipped.items())]


def _study_of(ds: Any, study_dir: str | Path, studies: Mapping[str, Any]) -> tuple[str, Any]:
    """The name and Study of the dataset ``ds``; a study without figures is bad input."""
    name = str(ds.attrs.get("study", ""))
    study = studies.get(name)
    if study is None or study.panels is None:
        drawable = ", ".join(n for n, s in studies.items() if s.panels is not None)
        raise DynlabInputError(f"{study_dir} holds a dataset of study {name!r}, which has no figures; "
                               f"allowed: a dataset of {drawable}")
    return name, study


def draw_study_figures(study_dir: str | Path, out_dir: Path, studies: Mapping[str, Any],
                       names: tuple[str, ...] | None = None, formats: tuple[str, ...] = ("png", "pdf"),
                       width: str = "column") -> Any:
    """Draw the panels of the study dataset at ``study_dir`` into ``out_dir`` (made when
    missing) with its study's panels (``studies``: name -> Study, as
    ``dynlab.studies.STUDIES``): every one and the composites, or only ``names`` (no
    composite), in ``formats`` at ``width``; the :func:`dynlab.figures.write_figures`
    result.  A dataset of a study without figures, a name that is not one of its panels
    or tables, or a folder that cannot be made, is one line of bad input."""
    from dynlab.figures import figure_items, write_figures
    from dynlab.results.folder import FIGURES_MARKER, claim_owned_folder
    from dynlab.results.schema import open_dataset

    ds = open_dataset(study_dir)
    name, study = _study_of(ds, study_dir, studies)
    if names is not None:
        known = list(figure_items(ds, study.panels))
        unknown = [n for n in names if n not in known]
        if unknown:
            raise DynlabInputError(f"unknown --panels {unknown[0]!r} for this {name} dataset; "
                                   f"allowed: a comma list of {', '.join(known)}")
    marker = out_dir / FIGURES_MARKER
    try:
        drawn = marker.read_text(encoding="utf-8", errors="replace").partition("study: ")[2].strip()
    except OSError:
        drawn = ""  # no marker yet, or one from before markers named their study
    if drawn and drawn != name:  # two studies' panels would mix in one folder under one NOTES.txt
        raise DynlabInputError(f"--out {out_dir} holds the figures of study {drawn!r}, not {name!r}; allowed: a new "
                               f"or empty folder, or one `dynlab figures` wrote for {name}")
    try:
        # the marker first, naming the study: a later `figures --out` knows the folder and whose figures it holds
        claim_owned_folder(out_dir, FIGURES_MARKER, f"written by dynlab\nstudy: {name}\n")
    except OSError as exc:
        raise DynlabInputError(f"--out {out_dir} cannot be made ({exc.strerror or exc}); allowed: a writable folder") from None
    return write_figures(ds, out_dir, study.panels, names, formats, width)
