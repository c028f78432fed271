"""The study registry: one module per study, found by name (the protocol is :mod:`dynlab.runner.protocol`).

The registry is static.  :data:`CATALOG` says, for every built-in study, which module
holds it, its description and presets, the shape of its command (``tracking``: models,
groups, seeds; ``lm``: mixers, interventions, a text source, seeds) and the names its
selections accept.  Listing the studies, building the command line and refusing a bad
selection read the catalog and import no study module (hence neither torch nor
matplotlib).  A study's module is imported when its :class:`~dynlab.runner.protocol.Study` is first
asked for: :func:`get_study`, or a value of :data:`STUDIES` (a read-only mapping of name
-> Study in catalog order).  tests/app/test_cli_lazy.py imports every study and checks
that the catalog says what the modules say.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dynlab.errors import DynlabInputError
from dynlab.names import BABI_KINDS, CELL_NAMES, MIXER_NAMES, SOURCES, TASK_INTERVENTION_NAMES, TBTT

if TYPE_CHECKING:
    from dynlab.runner.protocol import Study

__all__ = ["CATALOG", "CELL_NAMES", "MIXER_NAMES", "SOURCES", "STUDIES", "StudyEntry", "get_study", "register_study"]

# CELL_NAMES, MIXER_NAMES and SOURCES: the lists of dynlab.names, re-exported here for the command line.


@dataclass(frozen=True)
class StudyEntry:
    """What the command line knows about a study without importing it.

    Attributes:
        name: the study's name (``dynlab study <name>``).
        module: the module whose ``STUDY`` it is.
        description: one line: the help of its command and its row of ``dynlab study list``.
        presets: as ``Study.presets``.
        command: ``tracking`` (``--models`` = cells, ``--groups``) or ``lm`` (``--models``
            = mixers, ``--interventions``, ``--source``, task options).
        models: the names ``--models`` accepts besides ``all`` (``all``: the study's default).
        interventions: the names ``--interventions`` accepts (``lm`` only).
        task_options: the task options the study takes, of ``--lengths``, ``--depths``, ``--kinds``.
        kinds: the names ``--kinds`` accepts.
    """

    name: str
    module: str
    description: str
    presets: tuple[str, ...]
    command: Literal["tracking", "lm"]
    models: tuple[str, ...]
    interventions: tuple[str, ...] = ()
    task_options: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()


#: Every built-in study by name, in the order ``dynlab study list`` shows them.
CATALOG: dict[str, StudyEntry] = {e.name: e for e in (
    StudyEntry(
        "group-tracking", "dynlab.studies.group_tracking",
        "Trackers on group word problems (C2, C6, S3, …): accuracy vs length to 1000, max-pass length.",
        ("smoke", "quick", "sweep", "groups", "paper"), "tracking", CELL_NAMES),
    StudyEntry(
        "length-generalization", "dynlab.studies.length_generalization",
        "Recurrent LMs (Mamba-2, Mamba-1, GLA) trained short with initial-state interventions, "
        "evaluated at 16x the training length: PPL(t), EffRem, state statistics; presets budget and context "
        "map the PPL rise over training tokens and context, interventions post-trains where it rises; pretrained "
        "post-trains a checkpoint (--checkpoint) per intervention against a zero-state control.",
        ("smoke", "quick", "budget", "context", "size", "size-annealed", "state", "interventions", "size-interventions",
         "pretrained", "paper"),
        "lm", MIXER_NAMES, (*TASK_INTERVENTION_NAMES, TBTT)),
    StudyEntry(
        "nonlinearity", "dynlab.studies.nonlinearity",
        "Ablation of the state nonlinearity φ (tanh, ReLU, max/min, GroupSort, LayerNorm, sphere) on C6, S3.",
        ("smoke", "quick", "sweep", "paper"), "tracking", CELL_NAMES),
    StudyEntry(
        "copying", "dynlab.studies.copying",
        "Synthetic copying $<s>|<s>. : LMs (Mamba-2, Mamba-1, GLA) trained on short strings from the zero state, post-trained "
        "with state passing / fitted noise vs a zero-state control; accuracy at longer strings (3x).",
        ("smoke", "quick", "paper"), "lm", MIXER_NAMES, TASK_INTERVENTION_NAMES, ("--lengths",)),
    StudyEntry(
        "passkey", "dynlab.studies.passkey",
        "Passkey retrieval in Shakespeare filler: LMs trained short from the zero state, post-trained with fitted "
        "noise / state passing vs a zero-state control; accuracy over (length, depth) to 16x the training length.",
        ("smoke", "quick", "paper"), "lm", MIXER_NAMES, TASK_INTERVENTION_NAMES, ("--lengths", "--depths")),
    StudyEntry(
        "babilong", "dynlab.studies.babilong",
        f"bAbI-style questions ({', '.join(BABI_KINDS)}) in long Shakespeare filler: LMs trained short from the zero state, "
        "post-trained with state passing / fitted noise vs a zero-state control; accuracy vs length per kind.",
        ("smoke", "quick", "kinds", "paper"), "lm", MIXER_NAMES, TASK_INTERVENTION_NAMES, ("--lengths", "--kinds"),
        BABI_KINDS),
)}

#: Studies registered at run time (:func:`register_study`), and the built-in ones once imported.
_LOADED: dict[str, Study] = {}


def register_study(study: Study) -> Study:
    """Make ``study`` available by its name (it replaces a study of the same name)."""
    _LOADED[study.name] = study
    return study


def get_study(name: str) -> Study:
    """The study called ``name``; its module is imported on first use.  A one-line
    :class:`~dynlab.errors.DynlabInputError` naming the studies for an unknown name."""
    study = _LOADED.get(name)
    if study is not None:
        return study
    entry = CATALOG.get(name)
    if entry is None:
        raise DynlabInputError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}")
    return _LOADED.setdefault(name, importlib.import_module(entry.module).STUDY)


class _Studies(Mapping[str, "Study"]):
    """Name -> :class:`~dynlab.runner.protocol.Study` of every built-in and registered study; a
    built-in study's module is imported when its value is read."""

    def __getitem__(self, name: str) -> Study:
        if name not in CATALOG and name not in _LOADED:
            raise KeyError(name)
        return get_study(name)

    def __iter__(self) -> Iterator[str]:
        yield from CATALOG
        yield from (n for n in _LOADED if n not in CATALOG)

    def __len__(self) -> int:
        return len(CATALOG) + sum(1 for n in _LOADED if n not in CATALOG)

    def __contains__(self, name: object) -> bool:
        return name in CATALOG or name in _LOADED

    def __repr__(self) -> str:
        return f"STUDIES({', '.join(self)})"


#: Every study by name (built-in ones first, in catalog order); reading a value imports its module.
STUDIES: Mapping[str, Study] = _Studies()
