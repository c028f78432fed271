"""A study folder's contract: what dynlab writes there, and what it accepts reading back.

A study folder (``OUT/<study>``) is dynlab's own.  It holds only these names::

    .dynlab-study      the marker, written first: {"dynlab": "study folder", "study": <name>}
    .dynlab.lock       the lock held while a study or ``dynlab analyze`` writes (:func:`study_lock`)
    manifest.json      what the study ran (options, run ids)
    dataset.nc         the study dataset
    runs/<run id>/     one folder per run (:mod:`dynlab.results.store`)
    quarantine/        damaged runs moved aside
    resume/            the training state of long runs while they train (one file per stack;
                       removed when its runs finish; :attr:`dynlab.runner.protocol.Study.resumable`)
    .<name>.<writer>.tmp, runs/.tmp-<run id>-<writer>   writes in progress

The rules, enforced here and nowhere else:

- **A folder dynlab did not make is refused** before anything is written
  (:func:`check_study_folder`): a folder without dynlab's marker that holds any file
  (hidden names aside: ``.DS_Store``, ``.nfs…``, dynlab's lock and temporary files) is
  refused naming the first such file (in sorted order; other names than dynlab's first),
  however much it looks like a study folder: only the marker says dynlab wrote it.  A
  missing or empty folder is fine, and so is a fresh one being made (dynlab's folders in
  it empty: the ``runs/`` a write probe left); so is one with dynlab's marker for the same
  study.
- **Run ids are checked before any path is formed** (:func:`check_run_id`: 16 lowercase
  hex digits, :meth:`dynlab.spec.Spec.spec_hash`); a manifest entry such as
  ``../../victim/runs/x`` is one line of bad input.
- **No path leaves the study**: every path formed from a name read back is resolved and
  checked to lie inside the study folder (:func:`inside`); dynlab's own names in the
  study folder, ``runs/<id>`` folders and the files in them are never symbolic links
  (a link is refused, or is damage of the run, and is never followed).

The same kind of marker guards the output folder of ``dynlab figures``
(:data:`FIGURES_MARKER`, :func:`check_owned_folder`).

This module imports nothing heavy: the command line calls it before loading torch.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from dynlab.errors import DynlabInputError
from dynlab.outputs import VANISHED_RETRIES, is_folder

__all__ = ["FIGURES_MARKER", "LOCK", "MARKER", "RESUME", "RUN_ID", "STUDY_NAMES", "check_owned_folder", "check_run_id",
           "check_study_folder", "claim", "claim_owned_folder", "inside", "run_folder", "study_lock"]

#: The marker file dynlab writes first in a study folder.
MARKER = ".dynlab-study"
#: The lock file of a study folder (:func:`study_lock`).
LOCK = ".dynlab.lock"
#: The marker file of a folder written by ``dynlab figures``.
FIGURES_MARKER = ".dynlab-figures"
#: What a run id is: 16 lowercase hex digits (a spec hash).
RUN_ID = re.compile(r"[0-9a-f]{16}")
#: Every name dynlab writes at the top of a study folder (besides its temporary files).
#: The folder of a study where long runs keep their training state while they train.
RESUME = "resume"
STUDY_NAMES = (MARKER, LOCK, "manifest.json", "dataset.nc", "runs", "quarantine", RESUME)
_DIRS = ("runs", "quarantine", RESUME)
_ALLOWED = "a new or empty folder, or a study folder dynlab wrote"


def check_run_id(run_id: object, where: str = "") -> str:
    """``run_id`` when it is a run id (16 lowercase hex digits); else one line of bad input
    naming ``where`` it was read (e.g. the manifest's path)."""
    if isinstance(run_id, str) and RUN_ID.fullmatch(run_id):
        return run_id
    place = f"{where}: " if where else ""
    raise DynlabInputError(f"{place}{run_id!r} is not a run id; allowed: 16 lowercase hex digits (the run folders' names)")


def inside(root: str | Path, path: str | Path) -> Path:
    """``path`` when, resolved (links followed), it lies inside the resolved ``root``; else
    one line of bad input."""
    base = Path(root).resolve()
    target = Path(path).resolve()
    if target != base and base not in target.parents:
        raise DynlabInputError(f"{path} leads outside the study folder {root}; dynlab reads and writes only inside it")
    return Path(path)


def run_folder(root: str | Path, run_id: str, where: str = "") -> Path:
    """``root/runs/<run_id>``: the id checked (:func:`check_run_id`), the folder neither a
    link nor, resolved, outside ``root``."""
    check_run_id(run_id, where)
    folder = Path(root) / "runs" / run_id
    for p in (folder.parent, folder):
        if p.is_symlink():
            raise DynlabInputError(f"{p} is a symbolic link; dynlab does not follow links in a study folder")
    return inside(root, folder)


def _foreign_names(names: Iterable[str]) -> list[str]:
    """The ``names`` (at the top of a study folder) that dynlab does not write (hidden names
    aside), sorted."""
    return sorted(n for n in names if not n.startswith(".") and n not in STUDY_NAMES)


def _refuse(root: Path, flag: str, what: str) -> DynlabInputError:
    where = f"{flag} {root}" if flag else str(root)
    return DynlabInputError(f"{where} {what}; allowed: {_ALLOWED}")


def _read_marker(root: Path, name: str, flag: str) -> None:
    path = root / MARKER
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:  # removed while read (check_study_folder reads again)
        raise
    except (OSError, ValueError):
        raise _refuse(root, flag, f"has an unreadable {MARKER}") from None
    if not isinstance(doc, dict) or doc.get("study") != name:
        said = doc.get("study") if isinstance(doc, dict) else None
        raise _refuse(root, flag, f"is the folder of study {said!r}, not of {name!r} ({MARKER})")


def check_study_folder(root: str | Path, name: str | None = None, flag: str = "") -> bool:
    """Refuse, before anything is written, a study folder ``root`` (of study ``name``;
    None: of any study) that is not dynlab's (module docstring); one line
    naming the first file dynlab did not write, or the link.  Reads only.  Returns True
    when the folder is a study dynlab wrote (its marker: a study to resume or analyse).

    Another dynlab process may make or remove the folder meanwhile (the write probe of a
    study starting beside this one, :func:`dynlab.outputs.probe_folder`, or the clean-up of
    one that stopped): a name that vanishes while it is read is read again from the top
    (:data:`VANISHED_RETRIES` times), never a ``FileNotFoundError``."""
    root = Path(root).expanduser()
    for _ in range(VANISHED_RETRIES):
        try:
            return _check_study_folder(root, name, flag)
        except FileNotFoundError:  # removed while read: read what is there now
            continue
    return _check_study_folder(root, name, flag)


def _check_study_folder(root: Path, name: str | None, flag: str) -> bool:
    """:func:`check_study_folder` once; a ``FileNotFoundError`` when a name vanished while read."""
    if not os.path.lexists(root):
        return False
    if not is_folder(root):  # missing now: a FileNotFoundError, read again
        raise _refuse(root, flag, "is a file")
    try:
        names = set(os.listdir(root))
    except FileNotFoundError:
        raise
    except OSError:  # a folder that cannot be listed: the probe of the write says why
        return False
    for n in sorted(names & set(STUDY_NAMES)):
        p = root / n
        if p.is_symlink():
            raise _refuse(root, flag, f"holds a symbolic link {n}; dynlab does not follow links in a study folder")
        if (n in _DIRS) != is_folder(p):
            raise _refuse(root, flag, f"holds files dynlab did not write ({n})")
    if "runs" in names:  # a run folder that is a link would be read, probed and written through
        links = sorted(n for n in os.listdir(root / "runs") if (root / "runs" / n).is_symlink())
        if links:
            raise _refuse(root, flag, f"holds a symbolic link runs/{links[0]}; dynlab does not follow links in a "
                                      "study folder")
    if MARKER in names:
        if name is not None:
            _read_marker(root, name, flag)
        return True
    held = _foreign_names(names) or _held_names(root, names)
    if held:  # no marker: not dynlab's, whatever it holds
        raise _refuse(root, flag, f"holds files dynlab did not write ({held[0]})")
    return False


def _held_names(root: Path, names: set[str]) -> list[str]:
    """dynlab's names at the top of ``root`` that hold something, sorted: its files, and
    what its folders hold (``runs/<name>``; hidden names aside)."""
    held = []
    for n in sorted(names & set(STUDY_NAMES) - {MARKER, LOCK}):
        if n not in _DIRS:
            held.append(n)
        else:
            held += [f"{n}/{m}" for m in sorted(os.listdir(root / n)) if not m.startswith(".")][:1]
    return held


def claim(root: str | Path, name: str) -> Path:
    """Make the study folder ``root`` (and its parents) and write its marker first, when
    missing.  Returns the marker's path."""
    from dynlab.results.files import make_dir, write_text_atomic

    root = make_dir(Path(root))
    marker = root / MARKER
    if not marker.is_file():
        write_text_atomic(marker, json.dumps({"dynlab": "study folder", "study": name}) + "\n")
    return marker


@contextmanager
def study_lock(root: str | Path, flag: str = "", make: bool = False) -> Iterator[None]:
    """Hold the lock of study folder ``root`` (``.dynlab.lock``, the ``filelock`` package)
    while a study or an analysis writes there; a folder another process holds is refused
    at once, in one line (its writes would mix with that process's).

    ``make``: make ``root`` (and its parents) first.  Making the folder and taking its lock
    is one step that other dynlab processes cannot undo: a folder that another one removes
    in between (the clean-up of its write probe, or of a study that stopped) is made again,
    up to :data:`VANISHED_RETRIES` times; a folder that cannot be made is one line of bad
    input.  The caller removes what it made while it still holds the lock (never after:
    by then the folder may be another process's)."""
    from filelock import FileLock, Timeout

    root = Path(root)
    lock = FileLock(str(root / LOCK), timeout=0)
    for attempt in range(VANISHED_RETRIES + 1):
        try:
            if make:
                _make_study_dir(root, last=attempt == VANISHED_RETRIES)
            lock.acquire()
            break
        except Timeout:
            where = f"{flag} {root}" if flag else str(root)
            raise DynlabInputError(f"{where} is being written by another dynlab process (it holds {root / LOCK}); "
                                   "allowed: wait until it finishes, or another --out") from None
        except FileNotFoundError:  # the folder was removed between its making and the lock: make it again
            if not make or attempt == VANISHED_RETRIES:
                raise
    try:
        yield
    finally:
        lock.release()


def _make_study_dir(root: Path, last: bool = False) -> None:
    """Make study folder ``root`` and its parents (:func:`study_lock`); a folder that cannot
    be made is one line of bad input (a ``FileNotFoundError``: a folder removed meanwhile,
    to be made again; on the ``last`` try, one that cannot be made)."""
    from dynlab.results.files import make_dir

    try:
        make_dir(root)
    except (FileNotFoundError, FileExistsError) as exc:  # Path.mkdir's: a folder missing, or there and then not
        try:
            if is_folder(root):
                return
        except FileNotFoundError:  # removed meanwhile: made again
            if not last:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(root)) from None
        raise DynlabInputError(f"cannot write the study to {root} ({exc.strerror or exc}); allowed: a writable "
                               "folder") from None
    except OSError as exc:
        raise DynlabInputError(f"cannot write the study to {root} ({exc.strerror or exc}); allowed: a writable "
                               "folder") from None


# -- output folders of other commands (dynlab figures) ---------------------------------

def check_owned_folder(folder: str | Path, marker: str, own: Iterable[str], flag: str, allowed: str,
                       legacy: Callable[[Path], bool] | None = None) -> None:
    """Refuse an output folder that is not empty and holds no ``marker`` (written by
    :func:`claim_owned_folder` when the command first writes there), unless it holds only
    names matching ``own`` and ``legacy(folder)`` says the command wrote it (a folder from
    before the marker existed: e.g. its ``NOTES.txt`` reads as the command's); one line naming the
    first file the command did not write.  A missing or empty folder is fine."""
    folder = Path(folder).expanduser()
    try:
        names = sorted(os.listdir(folder)) if folder.is_dir() else []
    except OSError:
        return
    if marker in names:
        return
    visible = [n for n in names if not n.startswith(".")]
    foreign = [n for n in visible if not any(fnmatch(n, p) for p in own)]
    if not foreign and visible and (legacy is None or not legacy(folder)):
        foreign = visible
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise DynlabInputError(f"{flag} {folder} holds files this command did not write ({listed}); allowed: {allowed}")


def claim_owned_folder(folder: str | Path, marker: str, text: str = "written by dynlab\n") -> None:
    """Make ``folder`` and write its ``marker`` holding ``text`` (first, before the command's
    files; left as it is when it already holds ``text``)."""
    from dynlab.results.files import make_dir, write_text_atomic

    folder = make_dir(Path(folder))
    path = folder / marker
    try:
        if path.read_text(encoding="utf-8", errors="replace") == text:
            return
    except OSError:
        pass  # no marker yet
    write_text_atomic(path, text)
