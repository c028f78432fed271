"""``dynlab runs``: the runs of a study folder, one row each, named by what they are.

A row is a run's id (the shortest prefix of at least :data:`SHORT_ID` digits that tells
the listed runs apart; ``--full``: all 16), the coordinates that name it
(:func:`dynlab.results.naming.run_names`: its arm, then the settings its study sweeps) and
its status as its ``result.json`` says (``ok``, ``not-learned``, ``diverged``; ``missing``
for a run the manifest lists that ``runs/`` lacks, ``damaged`` for one whose files do not
read).  The runs are in the manifest's order (the study's), then any other run of
``runs/`` (a study still training its first runs has no manifest yet).  Reads only and
loads no torch, unless ``--tensorboard`` asks it to write a log (:mod:`dynlab.app.tensorboard`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dynlab.app.checks import nonempty_path
from dynlab.errors import DynlabInputError
from dynlab.results.folder import MARKER, RUN_ID, check_run_id, run_folder
from dynlab.results.naming import run_names, shown

__all__ = ["SHORT_ID", "list_runs", "runs_text"]

FLAG = "STUDY_FOLDER"
ALLOWED = "a study folder that `dynlab study` wrote (OUT/<study>, holding runs/ and manifest.json)"
MANIFEST = "manifest.json"
#: The fewest digits of a run id that the table shows.
SHORT_ID = 8


def _studies_inside(root: Path) -> list[str]:
    """The names of the study folders directly inside ``root`` (an ``--out`` folder given for a study's)."""
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                      and ((p / MANIFEST).is_file() or (p / MARKER).is_file()))
    except OSError:
        return []


def _study_root(study_dir: str | Path) -> Path:
    """The study folder given, refused in one line when it is not one."""
    root = nonempty_path(str(study_dir), FLAG, ALLOWED)
    if not root.exists():
        raise DynlabInputError(f"{FLAG} {root} does not exist; allowed: {ALLOWED}")
    if not root.is_dir():
        raise DynlabInputError(f"{FLAG} {root} is not a folder; allowed: {ALLOWED}")
    if not (root / MANIFEST).exists() and not (root / "runs").is_dir():
        inside = [str(root / name) for name in _studies_inside(root)]  # an --out folder: the studies in it
        allowed = f"one of the study folders in it, {' or '.join(inside)}" if inside else ALLOWED
        raise DynlabInputError(f"{FLAG} {root} is not a study folder (no {MANIFEST}, no runs/); allowed: {allowed}")
    return root


def _manifest_ids(root: Path) -> list[str]:
    """The run ids the manifest lists, in its order (none without a manifest)."""
    path = root / MANIFEST
    if not path.exists():
        return []
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 text
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise DynlabInputError(f"{FLAG} {root}: unreadable {MANIFEST} ({why}); allowed: {ALLOWED}") from None
    ids = manifest.get("run_ids") if isinstance(manifest, dict) else None
    if not isinstance(ids, list):
        raise DynlabInputError(f"{FLAG} {root}: broken {MANIFEST} (no list of 'run_ids'); allowed: {ALLOWED}")
    return list(dict.fromkeys(check_run_id(rid, f"broken study manifest {path}") for rid in ids))


def _run_ids(root: Path) -> list[str]:
    """The manifest's runs, then the other run folders of ``runs/`` (sorted)."""
    listed = _manifest_ids(root)
    runs = root / "runs"
    if runs.is_symlink():
        raise DynlabInputError(f"{runs} is a symbolic link; dynlab does not follow links in a study folder")
    try:
        present = sorted(n for n in os.listdir(runs) if RUN_ID.fullmatch(n)) if runs.is_dir() else []
    except OSError as exc:
        raise DynlabInputError(f"{FLAG} {root}: cannot list runs/ ({exc.strerror or exc}); allowed: {ALLOWED}") from None
    known = set(listed)
    return listed + [rid for rid in present if rid not in known]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _run(root: Path, rid: str) -> tuple[str, dict, str, str]:
    """``(spec class, spec fields, status, reason)`` of run ``rid`` as its files say."""
    folder = run_folder(root, rid, f"{FLAG} {root}")
    if not folder.is_dir():
        return "", {}, "missing", "listed in the manifest, not in runs/"
    spec = _read_json(folder / "spec.json")
    result = _read_json(folder / "result.json")
    if not (isinstance(spec, dict) and isinstance(spec.get("spec"), str) and isinstance(spec.get("fields"), dict)):
        return "", {}, "damaged", "spec.json does not read"
    if not (isinstance(result, dict) and isinstance(result.get("status"), str)):
        return spec["spec"], spec["fields"], "damaged", "result.json does not read"
    return spec["spec"], spec["fields"], result["status"], str(result.get("reason") or "")


def list_runs(study_dir: str | Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns that name the runs of ``study_dir`` and one row per run: ``run_id``,
    each column's value (None where the run's spec lacks it), ``status`` and ``reason``."""
    root = _study_root(study_dir)
    runs = [(rid, *_run(root, rid)) for rid in _run_ids(root)]
    columns, names = run_names([(kind, fields) for _, kind, fields, _, _ in runs])
    rows = [{"run_id": rid, **named, "status": status, "reason": reason}
            for (rid, _, _, status, reason), named in zip(runs, names)]
    return columns, rows


def _short(ids: list[str]) -> int:
    """The fewest digits (at least :data:`SHORT_ID`) that tell ``ids`` apart."""
    n = SHORT_ID
    while n < 16 and len({rid[:n] for rid in ids}) < len(ids):
        n += 1
    return n


def runs_text(study_dir: str | Path, full: bool = False, as_json: bool = False, tensorboard: str | None = None) -> str:
    """The listing of :func:`list_runs`: a table with a header row (``--json``: a JSON list of
    the rows, full ids).  ``tensorboard``: first write the runs' stored curves as a
    TensorBoard log in that folder (:mod:`dynlab.app.tensorboard`), its line after the
    table (on stderr with ``--json``, which keeps stdout one JSON document)."""
    columns, rows = list_runs(study_dir)
    wrote = ""
    if tensorboard is not None:
        from dynlab.app.tensorboard import write_tensorboard

        wrote = write_tensorboard(_study_root(study_dir), tensorboard, columns, rows)
    if as_json:
        if wrote:
            print(wrote, file=sys.stderr)
        return json.dumps(rows, indent=1)
    n = 16 if full else _short([r["run_id"] for r in rows])
    table = [["run", *columns, "status"]]
    table += [[r["run_id"][:n], *(shown(r[c]) for c in columns), r["status"]] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    text = "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table)
    return f"{text}\n{wrote}" if wrote else text
