"""The Study protocol: what a study module in ``studies/`` provides to the runner.

A study is a plain list of run specs plus four functions, found by name through the
registry of ``studies/__init__.py`` (docs/choices.md, "How the code is organised"):

- ``make_specs(options) -> list[Spec]`` — validated specs for a preset and the user's
  selections; must raise ``ValueError`` (one line, naming allowed values) on bad input
  *before* anything is written.
- ``run_one(spec, device, progress) -> RunOutcome`` — train and evaluate one spec.
- ``run_many(specs, device, progress) -> list[RunOutcome]`` (optional) — train several
  specs together (an ensemble); ``group_key(spec)`` says which specs may share a work
  item (same key = same architecture and shapes).
- ``analyze_one(spec, store, device, progress) -> xr.Dataset`` (optional) — analyses of a
  finished run, stored beside it as ``analysis.nc`` and recomputable by ``dynlab analyze``.
- ``assemble(specs, store, options) -> xr.Dataset`` — the study dataset (dim ``run``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import xarray as xr

from dynlab.config import Spec
from dynlab.errors import DynlabInputError
from dynlab.results.store import RunStore
from dynlab.train.progress import NullProgress

__all__ = ["EVALUATED_STATUSES", "RunOutcome", "Study", "StudyOptions", "select_names"]

#: Run statuses whose runs have weights, are evaluated and get the per-run analyses:
#: ``ok`` (learned) and ``not-learned`` (training ended below the training length).
#: ``diverged`` runs have neither.
EVALUATED_STATUSES = ("ok", "not-learned")


@dataclass(frozen=True)
class StudyOptions:
    """The user's selections for one study invocation (None = the preset's default)."""

    preset: str = "quick"
    models: tuple[str, ...] | None = None
    groups: tuple[str, ...] | None = None
    seeds: tuple[int, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class RunOutcome:
    """What ``run_one`` returns: JSON-able ``result`` (must hold ``status``) and weights."""

    result: dict[str, Any]
    state_dict: dict[str, torch.Tensor] | None


@dataclass(frozen=True)
class Study:
    name: str
    description: str
    presets: tuple[str, ...]
    make_specs: Callable[[StudyOptions], list[Spec]]
    run_one: Callable[[Spec, torch.device, NullProgress], RunOutcome]
    assemble: Callable[[list[Spec], RunStore, StudyOptions], xr.Dataset]
    analyze_one: Callable[[Spec, RunStore, torch.device, NullProgress], xr.Dataset] | None = None
    run_many: Callable[[list[Spec], torch.device, NullProgress], list[RunOutcome]] | None = None
    group_key: Callable[[Spec], Hashable] | None = None
    max_group: int = 1
    spec_type: type[Spec] = Spec

    def work_items(self, specs: list[Spec]) -> list[list[Spec]]:
        """Split ``specs`` into work items: groups of equal ``group_key`` of at most
        ``max_group`` specs (singletons when the study has no ``run_many``)."""
        if self.run_many is None or self.group_key is None or self.max_group <= 1:
            return [[s] for s in specs]
        groups: dict[Hashable, list[Spec]] = {}
        for s in specs:
            groups.setdefault(self.group_key(s), []).append(s)
        items = []
        for members in groups.values():
            for i in range(0, len(members), self.max_group):
                items.append(members[i : i + self.max_group])
        return items

    def run_item(self, item: list[Spec], device: torch.device, progress: NullProgress) -> list[RunOutcome]:
        if len(item) > 1 and self.run_many is not None:
            return self.run_many(item, device, progress)
        return [self.run_one(s, device, progress) for s in item]

    def check_preset(self, preset: str) -> str:
        if preset not in self.presets:
            raise DynlabInputError(f"unknown preset {preset!r} for study {self.name}; allowed: {', '.join(self.presets)}")
        return preset


def select_names(
    values: tuple[str, ...] | None, default: tuple[str, ...], allowed: tuple[str, ...], what: str
) -> tuple[str, ...]:
    """The user's selection of ``what`` (e.g. mixers): ``default`` for None or ``("all",)``,
    else ``values`` without repeats, each checked against ``allowed`` (one-line error)."""
    if values is None or tuple(values) == ("all",):
        return default
    for v in values:
        if v not in allowed:
            raise DynlabInputError(f"unknown {what} {v!r}; allowed: all, {', '.join(allowed)}")
    return tuple(dict.fromkeys(values))
