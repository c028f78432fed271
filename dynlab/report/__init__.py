"""Markdown tables of a study dataset: the numbers a paper prints, read from what was measured.

``dynlab report PATH`` (a study folder or its ``dataset.nc``) prints them, so a results
document regenerates from the datasets instead of being retyped. Every table says which
runs it pools and on what machine they ran (the dataset's attributes).

Supported studies (``ds.attrs["study"]``):

- ``copying``, ``passkey``, ``babilong`` (:func:`task_tables`): the trained models'
  status, then per test length the accuracy of the zero-state control and of each
  post-training arm (mean over the learned seeds, with min–max), and each arm's paired
  difference from the control (mean, 95 % t-interval, paired-t p; see
  :mod:`dynlab.analysis.contrasts`);
- ``length-generalization`` (:func:`lm_tables`): per intervention the far/in PPL ratio —
  the mean binned PPL over the last eighth of the evaluation length divided by p*, the
  lowest binned PPL within the training length — and the Definition 3.2 verdicts; with
  post-training arms (:func:`intervention_tables`), each arm's far and in-range PPL
  contrasts with Holm's p over arms × {far, in-range}, the arms' order with bootstrap
  intervals and every pair of arms tested, and what TBTT reads.

``dynlab report FILE.json`` reads a benchmark result instead (:func:`bench_tables`):

- a training-throughput file written by ``dynlab bench train --json`` (a ``results``
  list; the quantities are defined in :mod:`dynlab.bench`);
- a run-phases file written by ``benchmarks/bench_run_phases.py --json`` (``preset`` and
  ``rows``; defined in that script's docstring).

``docs/performance.md`` holds these tables for the files in ``benchmarks/results/``
(``benchmarks/make_docs.sh`` writes them; a test checks they still match).

Each paper's tables live in its own package: paper A's in :mod:`dynlab.tracking.report`
(:mod:`~dynlab.tracking.report.tables`, group-tracking; :mod:`~dynlab.tracking.report.theory`,
what each tracker can track), paper B's in :mod:`dynlab.lm.report`
(:mod:`~dynlab.lm.report.tables`, length-generalization; :mod:`~dynlab.lm.report.forget`, the
``state`` preset; :mod:`~dynlab.lm.report.tasks`, copying, passkey, babilong).  This package
holds what both share, :mod:`~dynlab.report.bench` (benchmark JSON) and
:mod:`~dynlab.report.format` (number formats, the machine and status lines), and
:func:`report`, which picks the tables of a path; every public name of the papers' tables is
importable from ``dynlab.report`` (imported on first use).

No torch and no plotting: xarray and numpy only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports
from dynlab.errors import DynlabInputError

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.report.bench import bench_machine_line, bench_markdown, bench_tables
    from dynlab.report.format import machine_line
    from dynlab.lm.report.tables import (
        arm_order_lines, budget_tables, context_tables, far_in_ratio, first_rise, holm_contrasts, intervention_tables,
        last_rise, lm_tables, size_tables, tbtt_line,
    )
    from dynlab.lm.report.tasks import TASK_STUDIES, arm_in_range, headline, headline_contrasts, task_tables
    from dynlab.tracking.report.theory import THEORY, theory_learns
    from dynlab.tracking.report.tables import learned_mp, reproduction_tables, tracking_tables

#: Public name -> the module that defines it, imported when the name is first read (as in
#: :mod:`dynlab`), so that one module (:mod:`~dynlab.tracking.report.theory`, :mod:`~dynlab.lm.report.tables`)
#: loads without the others.
_EXPORTS = {name: module for module, names in {
    "dynlab.report.bench": ("bench_machine_line", "bench_markdown", "bench_tables"),
    "dynlab.report.format": ("machine_line",),
    "dynlab.lm.report.tables": ("arm_order_lines", "budget_tables", "context_tables", "far_in_ratio", "first_rise",
                         "holm_contrasts", "intervention_tables", "last_rise", "lm_tables", "size_tables", "tbtt_line"),
    "dynlab.lm.report.tasks": ("TASK_STUDIES", "arm_in_range", "headline", "headline_contrasts", "task_tables"),
    "dynlab.tracking.report.theory": ("THEORY", "theory_learns"),
    "dynlab.tracking.report.tables": ("learned_mp", "reproduction_tables", "tracking_tables"),
}.items() for name in names}

__all__ = sorted([*_EXPORTS, "report"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)


def report(path: str | Path) -> str:
    """The Markdown tables of the study dataset at ``path`` (a study folder or a ``.nc`` file),
    or of the benchmark result at ``path`` (a ``.json`` file, :func:`bench_tables`)."""
    from dynlab.report.bench import bench_tables
    from dynlab.results.schema import open_dataset

    p = Path(path).expanduser()
    if p.suffix.lower() == ".json" and not p.is_dir():
        return bench_tables(p)
    ds = open_dataset(p)
    try:
        return _study_tables(p, ds)
    except KeyError as exc:  # a variable the study's tables need is missing (an edited or partial dataset)
        name = str(exc.args[0]).splitlines()[0][:120] if exc.args else "a variable"
        raise DynlabInputError(f"{p} lacks what its {ds.attrs.get('study')} tables need ({name}); allowed: the "
                               "dataset.nc of a study as `dynlab study` and `dynlab analyze` write it") from None


def _study_tables(p: Path, ds) -> str:
    """:func:`report` of the study dataset ``ds`` read from ``p``."""
    from dynlab.lm.report.tables import budget_tables, context_tables, intervention_tables, lm_tables, size_tables
    from dynlab.lm.report.tasks import TASK_STUDIES, task_tables
    from dynlab.tracking.report.tables import tracking_tables

    study = ds.attrs.get("study")
    if study in TASK_STUDIES:
        return task_tables(ds)
    if study == "length-generalization":
        import numpy as np

        from dynlab.lm.report.forget import is_state_map, state_tables

        if is_state_map(ds):
            return state_tables(ds)
        if "budget" in ds.dims and "annealed" in ds.coords:
            return size_tables(ds)
        if "budget" in ds.dims:
            return budget_tables(ds)
        if "phase" in ds.coords:
            return intervention_tables(ds)
        if "train_length" in ds.coords and np.unique(ds["train_length"].values).size > 1:
            return context_tables(ds)
        return lm_tables(ds)
    if study == "group-tracking":
        return tracking_tables(ds)
    if study is None:
        raise DynlabInputError(f"{p} is not a dataset a dynlab study wrote (it has no 'study' attribute); allowed: a "
                               "study folder or the dataset.nc of copying, passkey, babilong, length-generalization or "
                               "group-tracking, or a benchmark .json file")
    raise DynlabInputError(f"no report for study {study!r}; allowed: "
                           f"{', '.join((*TASK_STUDIES, 'length-generalization', 'group-tracking'))}")
