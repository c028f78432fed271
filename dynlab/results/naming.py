"""What names a run: its arm and the settings its study sweeps, read from its spec's fields.

A run is named by

- its *arm*, what the study chose for it (:data:`ARM_FIELDS`, by the spec class that a
  ``spec.json`` records): the model (``arch``), the group and the seed of a word-problem
  run; the mixer (``arch``), the training intervention and the seed of a language-model
  run; the mixer and the seed of a task run (whose post-training arms are all inside it);
- the *swept settings*: every other field whose value differs between the runs of its
  study (:func:`swept_fields`), e.g. the width, the training length, the state size or the
  budget of a sweep; a field a spec leaves out (a later field at its default,
  :attr:`dynlab.spec.Spec.hash_omit_at_default`) counts as a value of its own.

Each is named as the study dataset names it where the dataset has the coordinate
(``arch``, ``group``, ``seed``, ``intervention``, ``train_length``, ``d_model``,
``d_state``, ``budget``, ...: :mod:`dynlab.results.vocabulary`), else by its field
(``steps``; the full path when two fields share a last name).  The fields are a spec's
:meth:`~dynlab.spec.Spec.hashed_fields`, which is what its ``spec.json`` holds under
``fields``: the run loop names each finished run from its spec, ``dynlab runs`` from the
files, in the same words.  Standard library only (no torch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["ARM_FIELDS", "DATASET_NAMES", "MISSING", "arm_label", "flat_fields", "run_names", "shown", "swept_fields"]

#: The arm of a run, per spec class name: coordinate name -> dotted path in the spec's fields.
ARM_FIELDS: dict[str, dict[str, str]] = {
    "RunSpec": {"arch": "model.arch", "group": "task.group", "seed": "seed"},
    "LMRunSpec": {"arch": "model.mixer", "intervention": "intervention.kind", "seed": "seed"},
    "LMTaskRunSpec": {"arch": "model.mixer", "seed": "seed"},
}

#: A swept field's name where the study dataset has a coordinate for it (the others: by field).
DATASET_NAMES = {"model.arch": "arch", "model.mixer": "arch", "intervention.kind": "intervention",
                 "train.seq_len": "train_length", "eval.checkpoints": "budget", "model.hidden": "hidden",
                 "model.layers": "layers", "model.nonlinearity": "nonlinearity", "task.group": "group"}

#: How a field that a spec leaves out (or holds as null) is shown.
MISSING = "-"


def flat_fields(fields: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The leaves of a spec's fields by dotted path (``{"model": {"arch": "x"}}`` ->
    ``{"model.arch": "x"}``); lists stay values."""
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if isinstance(value, Mapping):
            out.update(flat_fields(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def swept_fields(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The dotted paths, in sorted order, whose values differ between ``runs`` (``(spec
    class name, flat fields)`` each), leaving out each run's arm (:data:`ARM_FIELDS`)."""
    arm = {path for kind, _ in runs for path in ARM_FIELDS.get(kind, {}).values()}
    paths = sorted({p for _, flat in runs for p in flat} - arm)
    return [p for p in paths if len({_key(f[p]) if p in f else None for _, f in runs}) > 1]


def _names(paths: Sequence[str]) -> dict[str, str]:
    """The name each swept path is shown by: the dataset's, else its last part, else (when
    two paths share it, or it is an arm's name) the whole path."""
    taken = {name for arm in ARM_FIELDS.values() for name in arm}
    last = [DATASET_NAMES.get(p, p.rsplit(".", 1)[-1]) for p in paths]
    return {p: (n if last.count(n) == 1 and (n not in taken or p in DATASET_NAMES) else p)
            for p, n in zip(paths, last)}


def run_names(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns that name ``runs`` (``(spec class name, spec fields)`` each, the fields as
    ``spec.json`` holds them) and, per run, its value in each: the arm's coordinates first
    (:data:`ARM_FIELDS`, in the order of the runs' classes), then the swept settings
    (:func:`swept_fields`, over the runs with fields).  A run lacks a column (None) when its
    spec leaves the field out (every column, when its fields are empty: a spec that does not read)."""
    flats = [(kind, flat_fields(fields)) for kind, fields in runs]
    arm_paths: dict[str, str] = {}
    for kind, _ in flats:
        for name, path in ARM_FIELDS.get(kind, {}).items():
            arm_paths.setdefault(name, path)
    swept = _names(swept_fields([run for run in flats if run[1]]))  # a run whose spec is unread: no part
    rows = []
    for kind, flat in flats:
        own = ARM_FIELDS.get(kind, {})
        row = {name: flat.get(own[name]) if name in own else None for name in arm_paths}
        row.update({name: flat.get(path) for path, name in swept.items() if name not in row})
        rows.append(row)
    return [*arm_paths, *(n for n in swept.values() if n not in arm_paths)], rows


def shown(value: Any) -> str:
    """A column's value as text: lists joined by commas, floats shortest, null as :data:`MISSING`."""
    if value is None:
        return MISSING
    if isinstance(value, (list, tuple)):
        return ",".join(shown(v) for v in value) or MISSING
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def arm_label(row: Mapping[str, Any]) -> str:
    """One run's names (a row of :func:`run_names`) as a label: ``tanh-rnn, C2, seed 0`` — an
    arm's name alone where it is text, else ``name value`` (``seed 0``, ``d_model 64``,
    ``nonlinearity relu``); the columns it lacks left out."""
    arm = {name for names in ARM_FIELDS.values() for name in names}
    return ", ".join(shown(v) if k in arm and isinstance(v, str) else f"{k} {shown(v)}"
                     for k, v in row.items() if v is not None)
