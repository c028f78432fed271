"""``dynlab report``: a study's paper tables (or a benchmark's) as Markdown."""

from __future__ import annotations

from pathlib import Path

from dynlab.app.checks import nonempty_path


def report(datasets: list[str | Path]) -> list[tuple[Path, str]]:
    """``(path, Markdown)`` for each of ``datasets`` (study folders, dataset.nc files or
    benchmark .json files), every one read before any is returned."""
    paths = [nonempty_path(str(d), "DATASETS", "study folders, dataset.nc files or benchmark .json files")
             for d in datasets]
    from dynlab.report import report as make_report

    return [(path, make_report(path)) for path in paths]
