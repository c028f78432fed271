"""``dynlab figures``: every panel of a study, drawn into a folder that only figures are written to."""

from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from dynlab.app.checks import nonempty_path
from dynlab.app.folders import check_out
from dynlab.errors import DynlabInputError


#: What ``dynlab figures`` writes (``dynlab.figures.write_figures``): a folder holding
#: only these takes new figures.
FIGURE_FILES = ("*.png", "*.pdf", "*.md", "NOTES.txt")

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


def figures(study_dir: str | Path, out: str = "figures") -> Any:
    """Draw every panel of the study in ``study_dir`` (a study folder or its dataset.nc) into
    ``out``, after ``dynlab figures``' checks: what :func:`draw_study_figures`
    returns (``written``, ``skipped``, ``empty``)."""
    out_dir, study = figure_places(out, str(study_dir))
    from dynlab.studies import STUDIES

    return draw_study_figures(study, out_dir, STUDIES)


def draw_study_figures(study_dir: str | Path, out_dir: Path, studies: Mapping[str, Any]) -> Any:
    """Draw every panel of the study dataset at ``study_dir`` into ``out_dir`` (made when
    missing) with its study's panels (``studies``: name -> Study, as
    ``dynlab.studies.STUDIES``); the :func:`dynlab.figures.write_figures` result.  A dataset
    of a study without figures, or a folder that cannot be made, is one line of bad input."""
    from dynlab.figures import write_figures
    from dynlab.results.folder import FIGURES_MARKER, claim_owned_folder
    from dynlab.results.schema import open_dataset

    ds = open_dataset(study_dir)
    name = str(ds.attrs.get("study", ""))
    study = studies.get(name)
    if study is None or study.panels is None:
        drawable = ", ".join(n for n, s in studies.items() if s.panels is not None)
        raise DynlabInputError(f"{study_dir} holds a dataset of study {name!r}, which has no figures; "
                               f"allowed: a dataset of {drawable}")
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
    return write_figures(ds, out_dir, study.panels)
