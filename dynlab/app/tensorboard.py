"""``dynlab runs STUDY --tensorboard DIR``: a study's stored curves as a TensorBoard log.

Each run of the study becomes one TensorBoard run, a folder of ``DIR`` named by what the
run is (:func:`dynlab.app.runs.list_runs`: its arm, the settings its study sweeps, then
its id), holding the curves its ``result.json`` stores, each under one tag:

- ``train/loss``: the training loss at ``loss_curve_step`` (the stored curve: at most 64
  points, each the mean over a window of steps, :func:`dynlab.training.loss_curve`);
- ``eval/accuracy``: the test accuracy with the test length as the step (group-tracking's
  word lengths; a task's lengths in tokens, one tag per passkey depth or bAbI kind,
  ``eval/accuracy/depth=0.25``, ``eval/accuracy/kind=qa1``);
- ``eval/ppl``: an LM's binned perplexity PPL(t), with the position t (tokens) as the step;
- ``post/<arm>/eval/accuracy``, ``post/<arm>/eval/ppl``...: the same tags of each
  post-training arm a run holds.

A curve that does not read as numbers (a damaged ``result.json``) is left out, as is a run
whose ``result.json`` does not read.  Run it again while a study trains, or after, to add
the runs finished since: the log is rebuilt (the run folders it wrote before are removed
first).  ``DIR`` must be new, empty, or the log of the same study written by this command
(its marker file :data:`MARKER` names the study).  The events are written by
``torch.utils.tensorboard`` (the ``tensorboard`` package, extra ``[tensorboard]``); view
them with ``tensorboard --logdir DIR``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from dynlab.app.checks import nonempty_path
from dynlab.errors import DynlabInputError

__all__ = ["MARKER", "run_scalars", "write_tensorboard"]

#: The file that marks a folder as a TensorBoard log written by ``dynlab runs``.
MARKER = ".dynlab-tensorboard"
FLAG = "--tensorboard"
ALLOWED = "a new or empty folder, or the log of the same study that `dynlab runs --tensorboard` wrote"


def _points(steps: Any, values: Any) -> list[tuple[int, float]] | None:
    """``(step, value)`` pairs of two equal lists, steps integers and values real numbers
    (a None value left out); None when the lists do not read so."""
    if not (isinstance(steps, list) and isinstance(values, list) and steps and len(steps) == len(values)):
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in steps):
        return None
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        return None
    return [(x, float(v)) for x, v in zip(steps, values) if v is not None]


def _accuracy(record: dict[str, Any], result: dict[str, Any], prefix: str) -> dict[str, list[tuple[int, float]]]:
    """``record``'s test accuracy per length (``result``'s ``lengths``): one tag, or one per
    passkey depth or bAbI kind when each length holds a row of them."""
    acc, lengths = record.get("accuracy"), result.get("lengths")
    if not (isinstance(acc, list) and acc and all(isinstance(row, list) for row in acc)):
        points = _points(lengths, acc)
        return {f"{prefix}accuracy": points} if points else {}
    axis = "depth" if isinstance(result.get("depths"), list) else "kind"
    labels = result.get("depths") if axis == "depth" else result.get("kinds")
    if not (isinstance(labels, list) and all(len(row) == len(labels) for row in acc)):
        return {}
    out = {}
    for j, label in enumerate(labels):
        points = _points(lengths, [row[j] for row in acc])
        if points:
            out[f"{prefix}accuracy/{axis}={label}"] = points
    return out


#: The tags of the curves stored as two lists: the ``result.json`` fields of their steps and values.
CURVES = {"train/loss": ("loss_curve_step", "loss_curve"), "eval/ppl": ("ppl_binned_t", "ppl_binned")}


def _record_scalars(record: dict[str, Any], result: dict[str, Any], prefix: str) -> dict[str, list[tuple[int, float]]]:
    """The tags of one record (the run's result, or one post-training arm's), each after ``prefix``."""
    out = {}
    for tag, (steps_key, values_key) in CURVES.items():
        points = _points(record.get(steps_key), record.get(values_key))
        if points:
            out[prefix + tag] = points
    out.update(_accuracy(record, result, prefix + "eval/"))
    return out


def run_scalars(result: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """The ``(step, value)`` points of each tag (module docstring) that ``result`` (a run's
    ``result.json``) stores; a curve that does not read as numbers is left out."""
    out = _record_scalars(result, result, "")
    post = result.get("post")
    for arm, record in (post.items() if isinstance(post, dict) else ()):
        if isinstance(record, dict):
            out.update(_record_scalars(record, result, f"post/{arm}/"))
    return out


def _folder_name(row: dict[str, Any], columns: list[str]) -> str:
    """``arch=mamba,group=C2,seed=0,id=0243729157`` (characters outside ``[\\w.=,+-]`` as ``_``)."""
    from dynlab.results.naming import shown

    parts = [f"{c}={shown(row[c])}" for c in columns if row.get(c) is not None]
    return re.sub(r"[^\w.=,+-]", "_", ",".join([*parts, f"id={row['run_id'][:10]}"]))


def _marker_text(root: Path) -> str:
    return f"written by dynlab runs --tensorboard\nstudy: {Path(root).resolve()}\n"


def _check_log_dir(out: Path, root: Path) -> None:
    """Refuse ``out`` before anything is written: a dynlab run or study folder or a folder
    inside one, a folder holding files this command did not write, the log of another
    study, or a folder that cannot be written (one line each)."""
    from dynlab.app.folders import check_out
    from dynlab.outputs import refuse_foreign_folder
    from dynlab.results.folder import check_owned_folder

    refuse_foreign_folder(out, FLAG, allowed=ALLOWED)
    check_owned_folder(out, MARKER, ("*",), FLAG, ALLOWED, legacy=lambda _: False)
    try:
        marker = (out / MARKER).read_text(encoding="utf-8", errors="replace")
    except OSError:
        marker = None  # a new or empty folder
    if marker is not None and marker != _marker_text(root):
        other = (marker.strip().splitlines() or ["a marker that names no study"])[-1]
        raise DynlabInputError(f"{FLAG} {out} holds the log of another study ({other}); allowed: {ALLOWED}")
    check_out(out, flag=FLAG)


#: The name of a run's folder in the log (:func:`_folder_name`): it ends in the run's id.
RUN_FOLDER = re.compile(r"(.*,)?id=[0-9a-f]{10}")


def _writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch says so when the tensorboard package is missing
        raise DynlabInputError(f"{FLAG} needs the tensorboard package; allowed: pip install 'dynlab[tensorboard]', "
                               f"or leave {FLAG} out") from None
    return SummaryWriter


def write_tensorboard(root: Path, out: str | Path, columns: list[str], rows: list[dict[str, Any]]) -> str:
    """Write the TensorBoard log of the study folder ``root`` to ``out`` (module docstring):
    its runs ``rows`` and the ``columns`` that name them, as :func:`dynlab.app.runs.list_runs`
    gives them; returns the line that says what was written."""
    from dynlab.results.folder import claim_owned_folder

    out = nonempty_path(out, FLAG, ALLOWED)
    _check_log_dir(out, root)
    writer_class = _writer_class()
    claim_owned_folder(out, MARKER, _marker_text(root))
    for old in out.iterdir():  # rebuilt: the runs' folders written before (a run renamed, removed or damaged since)
        if RUN_FOLDER.fullmatch(old.name) and old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
    written = 0
    for row in rows:
        try:
            result = json.loads((Path(root) / "runs" / row["run_id"] / "result.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # missing or damaged: the table says so
        scalars = run_scalars(result) if isinstance(result, dict) else {}
        if not scalars:
            continue
        folder = out / _folder_name(row, columns)
        writer = writer_class(log_dir=str(folder))
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
        writer.close()
        written += 1
    return f"wrote the TensorBoard log of {written} of {len(rows)} runs to {out} (view: tensorboard --logdir {out})"
