"""``dynlab runs STUDY --tensorboard DIR``: a study's stored curves as a TensorBoard log.

Each run of the study becomes one TensorBoard run, a folder of ``DIR`` named by what the
run is (:func:`dynlab.app.runs.list_runs`: its arm, the settings its study sweeps, then
its id), holding the curves its ``result.json`` stores, each under one tag:

- ``train/loss``: the training loss at ``loss_curve_step`` (the stored curve: at most 64
  points, each the mean over a window of steps, :func:`dynlab.training.loss_curve`);
- ``eval/accuracy``: a tracker's test accuracy, with the word length as the step;
- ``eval/ppl``: an LM's binned perplexity PPL(t), with the position t (tokens) as the step.

Run it again while a study trains, or after, to add the runs finished since: each run's
folder is written afresh (its old event files replaced).  ``DIR`` must be new, empty, or
a log this command wrote (its marker file :data:`MARKER`).  The events are written by
``torch.utils.tensorboard`` (the ``tensorboard`` package, extra ``[tensorboard]``); view
them with ``tensorboard --logdir DIR``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from dynlab.errors import DynlabInputError

__all__ = ["MARKER", "TAGS", "run_scalars", "write_tensorboard"]

#: The file that marks a folder as a TensorBoard log written by ``dynlab runs``.
MARKER = ".dynlab-tensorboard"
FLAG = "--tensorboard"
ALLOWED = "a new or empty folder, or one that `dynlab runs --tensorboard` wrote"
#: Each tag: the ``result.json`` fields of its steps and of its values.
TAGS = {"train/loss": ("loss_curve_step", "loss_curve"), "eval/accuracy": ("lengths", "accuracy"),
        "eval/ppl": ("ppl_binned_t", "ppl_binned")}


def run_scalars(result: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """The ``(step, value)`` points of each tag of :data:`TAGS` that ``result`` (a run's
    ``result.json``) stores; a tag whose two lists are missing or unequal is left out."""
    out = {}
    for tag, (steps_key, values_key) in TAGS.items():
        steps, values = result.get(steps_key), result.get(values_key)
        if isinstance(steps, list) and isinstance(values, list) and steps and len(steps) == len(values):
            out[tag] = [(int(s), float(v)) for s, v in zip(steps, values) if v is not None]
    return out


def _folder_name(row: dict[str, Any], columns: list[str]) -> str:
    """``arch=mamba,group=C2,seed=0,id=0243729157`` (characters outside ``[\\w.=,+-]`` as ``_``)."""
    from dynlab.results.naming import shown

    parts = [f"{c}={shown(row[c])}" for c in columns if row.get(c) is not None]
    return re.sub(r"[^\w.=,+-]", "_", ",".join([*parts, f"id={row['run_id'][:10]}"]))


def _check_log_dir(out: Path) -> None:
    """Refuse ``out`` before anything is written: a dynlab folder, a folder holding files this
    command did not write, or one that cannot be written (one line each)."""
    from dynlab.app.folders import check_out
    from dynlab.outputs import refuse_inside_dynlab_folder
    from dynlab.results.folder import check_owned_folder

    refuse_inside_dynlab_folder(out, FLAG, ALLOWED)
    check_owned_folder(out, MARKER, ("*",), FLAG, ALLOWED, legacy=lambda _: False)
    check_out(out, flag=FLAG)


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

    out = Path(out).expanduser()
    _check_log_dir(out)
    writer_class = _writer_class()
    claim_owned_folder(out, MARKER, f"written by dynlab runs --tensorboard\nstudy: {Path(root).resolve()}\n")
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
        for old in folder.glob("events.out.tfevents.*") if folder.is_dir() else ():
            old.unlink()
        writer = writer_class(log_dir=str(folder))
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
        writer.close()
        written += 1
    return f"wrote the TensorBoard log of {written} of {len(rows)} runs to {out} (view: tensorboard --logdir {out})"
