"""The folders a command writes, checked (and probed) before any work: an output folder,
the folders below it, a study folder and its ``runs/``.  Torch-free."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dynlab.errors import DynlabInputError
from dynlab.outputs import VANISHED_RETRIES, path_mode


def folder_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (None when they can): ``"is a file"``,
    ``"is not writable (<reason>)"`` or, when it is missing, ``"cannot be made (<why>)"``
    about the nearest folder above it that exists.

    Writes nothing, not even a probe (folder times stay as they were): asks the system
    whether this process may create entries there (``access`` with the effective ids,
    which also answers for root and for read-only file systems).  A folder that another
    process removes while it is looked at (its write probe) is looked for again."""
    folder = folder.expanduser()
    for _ in range(VANISHED_RETRIES - 1):
        try:
            return _problem_once(folder, last=False)
        except FileNotFoundError:  # removed while looked at (another dynlab process's probe of it): look again
            continue
    return _problem_once(folder, last=True)


def _problem_once(folder: Path, last: bool) -> str | None:
    """:func:`folder_problem` once; a ``FileNotFoundError`` (unless ``last``) when the
    folder it looks at vanished between two of its looks."""
    here = folder
    while not os.path.lexists(here) and here.parent != here:  # lexists: never raises (a name too long is missing)
        here = here.parent
    missing = here != folder
    try:
        mode = path_mode(here)  # one look: two (is_dir, then lexists) race another probe
    except FileNotFoundError:
        if not last:
            raise
        mode = 0
    if not stat.S_ISDIR(mode):
        what = "is a file" if stat.S_ISREG(mode) else "is not a folder"
        return f"cannot be made ({here} {what})" if missing else what
    effective = os.access in os.supports_effective_ids
    if os.access(here, os.W_OK | os.X_OK, effective_ids=effective):
        return None
    if not last and not os.path.lexists(here):
        raise FileNotFoundError(here)
    try:
        why = "read-only file system" if os.statvfs(here).f_flag & os.ST_RDONLY else "permission denied"
    except OSError:
        why = "permission denied"
    return f"cannot be made ({here} is not writable: {why})" if missing else f"is not writable ({why})"


def check_out(out: Path, *below: str, flag: str = "--out") -> None:
    """Refuse an output folder (and the folders ``below`` it that the command writes in)
    that cannot receive files: one line naming it and why, before anything is computed
    or written.  The deepest folder is probed (:func:`dynlab.outputs.probe_folder`: made,
    written in, and removed again), so that what only the system knows (a file system
    that takes no files, a name too long) is found before the work."""
    from dynlab.outputs import probe_folder

    folders = (out, *(out / b for b in below))
    for folder in folders:
        problem = folder_problem(folder)
        if problem is None:
            continue
        allowed = "a folder (made when missing)" if problem == "is a file" else "a writable folder (made when missing)"
        where = f"{flag} {out}" if folder == out else f"{flag} {out}: {folder}"
        raise DynlabInputError(f"{where} {problem}; allowed: {allowed}")
    problem = probe_folder(folders[-1], deep=bool(below))  # what the system says when files are really made there
    if problem is not None:
        where = f"{flag} {out}" if folders[-1] == out else f"{flag} {out}: {folders[-1]}"
        raise DynlabInputError(f"{where} {problem}; allowed: a writable folder (made when missing)")


def check_study_folder(root: Path, probe: bool = True) -> None:
    """Refuse a study folder (``OUT/<study>``) that cannot receive files in itself or its
    ``runs/`` (with ``probe``, probed as a run's files will be written), before a run is
    trained or analysed (a study that cannot store its runs would lose them)."""
    from dynlab.outputs import probe_folder

    for folder in (root, root / "runs"):
        problem = folder_problem(folder)
        if problem is not None:
            raise DynlabInputError(f"cannot write the study: {folder} {problem}; allowed: a writable --out folder")
    problem = probe_folder(root / "runs", deep=True) if probe else None  # a run's files, as they will be written
    if problem is not None:
        raise DynlabInputError(f"cannot write the study: {root / 'runs'} {problem}; allowed: a writable --out folder")
