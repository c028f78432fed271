"""What a word-problem study's selections mean, read from the names alone (torch-free):
group names in canonical spelling (``c2`` is ``C2``), and the groups too large for the
per-run analyses, refused before anything runs.  The tracking studies hand these to the
shared study machinery as hooks (:attr:`dynlab.runner.protocol.Study.prepare_options`,
:attr:`dynlab.runner.protocol.Study.check_analyses`), which knows nothing of groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.tracking.groups import group_name, group_order

__all__ = ["MAX_ANALYSIS_ORDER", "canonical_groups", "canonical_options", "check_analysable", "check_specs_analysable"]

#: Largest group (order) whose runs get the per-run error-control analyses
#: (:func:`dynlab.tracking.analysis.pipeline.analyze_tracker`): its per-step work grows as
#: samples × order² and its chunks as samples × steps × order (order 256: about 8 GiB at
#: the paper preset); larger groups train, but are refused the analyses before anything runs.
MAX_ANALYSIS_ORDER = 256


def canonical_groups(names: Sequence[str]) -> tuple[str, ...]:
    """Group names in canonical spelling (:func:`dynlab.tracking.groups.group_name`, from the name
    alone: ``c2`` -> ``C2``), repeats of one group dropped.  A name that is no group is kept
    as given, for the study to refuse with the allowed names."""
    def canonical(name: str) -> str:
        try:
            return group_name(name)
        except (ValueError, TypeError):  # DynlabInputError is a ValueError
            return name

    return tuple(dict.fromkeys(canonical(n) for n in names))


def canonical_options(options: Any) -> Any:
    """``options`` (a :class:`dynlab.runner.protocol.StudyOptions`) with its groups (``extra["groups"]``,
    the word-problem studies' own selection) in canonical spelling, repeats of one group
    dropped (``C2``, ``c2`` and ``C2`` are one group).  Groups that are not a list of names
    are left as given, for the study's options to refuse."""
    groups = options.extra.get("groups")
    if groups is None or isinstance(groups, str) or not isinstance(groups, Sequence):
        return options
    return dataclasses.replace(options, extra={**options.extra, "groups": canonical_groups(tuple(groups))})


def check_analysable(group: str, study: str) -> None:
    """Refuse the per-run analyses of ``group`` (a group name; its order is read from the
    name, nothing is built) when its order is above :data:`MAX_ANALYSIS_ORDER`: one line
    naming the group, its order, the limit and ``--no-analysis``."""
    order = group_order(group)
    if order > MAX_ANALYSIS_ORDER:
        raise DynlabInputError(
            f"group {group} (order {order}) is too large for the per-run analyses of study {study}; "
            f"allowed: groups of order at most {MAX_ANALYSIS_ORDER} (dynlab.tracking.selection.MAX_ANALYSIS_ORDER), "
            "or the study without analyses (--no-analysis)"
        )


def check_specs_analysable(study: str, specs: Sequence[Any]) -> None:
    """Refuse the per-run analyses of study ``study`` when a spec's group (``spec.task.group``)
    is too large for them (:func:`check_analysable`); a spec that cannot be read (None: a
    damaged run, redone later) is left out."""
    for spec in specs:
        group = getattr(getattr(spec, "task", None), "group", None)
        if isinstance(group, str):
            check_analysable(group, study)
