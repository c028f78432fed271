"""Where a command writes, checked before any work: probed, and never a folder it does not own.

A command that would fail to write its output only after minutes of work (a file system
that refuses new files, such as ``/proc``; a name longer than the system allows; a file
that cannot be replaced, such as an immutable ``dataset.nc``) is refused before it starts,
in one line (:class:`~dynlab.errors.DynlabInputError`, exit code 2), by trying what the
write will do:

- :func:`probe_folder` makes the folder when it is missing, creates and removes in it a
  temporary file named as the real writes name theirs (with ``deep``: inside a temporary
  folder named as a run's), then removes every folder it made: nothing is left behind;
- :func:`probe_file` creates and removes a temporary file beside the file and, when the
  file exists, checks that it can be replaced (an immutable or append-only file cannot:
  not even a hard link to it can be made).

A command never writes into a folder it did not make for its kind of output
(:func:`refuse_foreign_folder`): a dynlab run folder or study folder, or a folder that
holds other files than the command's own (a previous export may be replaced; a run's
weights may not).

This module imports nothing heavy: the command line calls it before loading torch.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from dynlab.errors import DynlabInputError

__all__ = ["RUN_FILES", "STUDY_FILES", "VANISHED_RETRIES", "check_json_path", "current_umask", "is_folder", "path_mode", "probe_file", "probe_folder", "refuse_foreign_folder",
           "refuse_inside_dynlab_folder"]

#: Files that make a folder a dynlab run folder (any one of them).
RUN_FILES = ("spec.json", "checksums.json")
#: Files that make a folder a dynlab study folder.
STUDY_FILES = ("manifest.json", ".dynlab-study")  # dynlab.results.folder.MARKER


def current_umask() -> int:
    """The process's umask (read from /proc when it can be; else set and set back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _tag() -> str:
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in (socket.gethostname() or "localhost"))
    return f"{secrets.token_hex(4)}~{host}~{os.getpid()}"


def _why(exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return "a name in the path, or the whole path, is longer than this system allows"
    return exc.strerror or type(exc).__name__


def probe_folder(folder: str | Path, deep: bool = False) -> str | None:
    """Why files cannot be written in ``folder`` (None when they can), found by writing:
    the folder is made when missing, a temporary file is created in it (with ``deep``, in
    a temporary folder named as a run's, ``.tmp-<64 characters>-<writer>``) and everything
    made is removed again.

    Processes that probe the same new folder at once (the ranks of a ``torchrun``, two
    studies started together) race: one may remove a folder it made while another writes
    its probe there. A probe that finds its folder gone, or made by another meanwhile, is
    tried again (a few times) before the folder is called unwritable. A folder one probe
    made while another was writing in it stays, empty: the command that probes goes on to
    write there."""
    folder = Path(folder).expanduser().absolute()
    for attempt in range(VANISHED_RETRIES):
        try:
            return _probe_once(folder, deep)
        except _Raced as exc:
            raced = exc
            time.sleep(0.005 * (attempt + 1))  # the other probe takes milliseconds
    return f"cannot be written ({_why(raced.error)})"


#: How many times a folder that another dynlab process made or removed while this one
#: probed, read or locked it is looked at again (:func:`probe_folder`,
#: :func:`dynlab.results.folder.check_study_folder`, :func:`dynlab.results.folder.study_lock`,
#: :func:`dynlab.app.folders.folder_problem`): each time needs another process's whole probe
#: or clean-up between two steps of this one.
VANISHED_RETRIES = 8


class _Raced(Exception):
    """A folder of the probe appeared or vanished under it: another process probes too."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _probe_once(folder: Path, deep: bool) -> str | None:
    made: list[Path] = []
    probe_dir: Path | None = None
    probe: Path | None = None
    try:
        missing = []
        here = folder
        while not os.path.lexists(here) and here.parent != here:
            missing.append(here)
            here = here.parent
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o777)
            except FileExistsError as exc:  # another process made it a moment ago
                raise _Raced(exc) from None
            made.append(d)
        if not is_folder(folder):  # one look: two (is_dir, then lexists) race another probe
            return "is not a folder"
        where = folder
        if deep:
            probe_dir = folder / f".tmp-{'0' * 64}-{_tag()}"
            os.mkdir(probe_dir, 0o777)
            where = probe_dir
        probe = where / f".model.safetensors.{_tag()}.tmp"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileNotFoundError as exc:  # a folder made by another process was removed by it meanwhile
        raise _Raced(exc) from None
    except OSError as exc:
        return f"cannot be written ({_why(exc)})"
    finally:
        for path, remove in ((probe, os.unlink), (probe_dir, os.rmdir), *((d, os.rmdir) for d in reversed(made))):
            if path is not None:
                try:
                    remove(path)
                except OSError:
                    pass
    return None


def path_mode(path: str | Path) -> int:
    """The ``st_mode`` of ``path`` from one ``stat`` (a link followed): one look, where
    ``is_dir()`` and then ``lexists()`` may see two states of a folder that other processes
    remove and make again in between.  A ``FileNotFoundError`` when it is missing (made,
    then removed by another process's probe); 0 (neither folder nor file) for a link that
    points nowhere and for what cannot be looked at (a loop of links, a name too long)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return 0
        raise
    except OSError:
        return 0


def is_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder, from one look (:func:`path_mode`: a ``FileNotFoundError``
    when it is missing)."""
    return stat.S_ISDIR(path_mode(path))


def probe_file(path: str | Path) -> str | None:
    """Why file ``path`` cannot be written or replaced (None when it can): a temporary file
    named as the atomic write names its own is created and removed beside it; an existing
    ``path`` must also be replaceable (not immutable or append-only: a hard link to it is
    made and removed, which such a file refuses, as it refuses to be replaced)."""
    path = Path(path).expanduser().absolute()
    if not path.parent.is_dir():
        above = path.parent
        while not os.path.lexists(above) and above.parent != above:
            above = above.parent
        return f"cannot be written ({above} is a file)" if above.is_file() else f"cannot be written ({path.parent} does not exist)"
    tmp = path.parent / f".{path.name}.{_tag()}.tmp"
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(tmp)
    except OSError as exc:
        return f"cannot be written ({_why(exc)})"
    if path.is_file() and not os.access(path, os.W_OK):
        link = path.parent / f".{path.name}.{_tag()}.link"
        try:
            os.link(path, link)
            os.unlink(link)
        except OSError as exc:
            if exc.errno == errno.EPERM:
                return "cannot be replaced (it is immutable or append-only)"
    return None


def refuse_foreign_folder(folder: str | Path, what: str, own: Iterable[str] | None = None, allowed: str = "") -> None:
    """Refuse to write into ``folder`` when it is a dynlab run or study folder, or lies
    inside one (:func:`refuse_inside_dynlab_folder`: ``study/runs/x`` too), or, with ``own``
    (the names the command writes there, ``*.png`` patterns allowed), when it holds anything
    else (hidden temporary files aside): one line naming ``what`` (the option as typed) and
    what is allowed.  A missing or empty folder outside dynlab's folders is fine."""
    folder = Path(folder).expanduser()
    allowed = allowed or "a new or empty folder"
    refuse_inside_dynlab_folder(folder, what, allowed)
    try:
        names = {p.name for p in folder.iterdir()} if os.path.isdir(folder) else set()
    except OSError:  # a folder that cannot be listed or named: the probe of the write says why
        return
    where = f"{what} {folder}"
    if names & set(RUN_FILES):
        raise DynlabInputError(f"{where} is a dynlab run folder: writing there would replace its files; allowed: {allowed}")
    if names & set(STUDY_FILES):
        raise DynlabInputError(f"{where} is a dynlab study folder: writing there would mix with its files; "
                               f"allowed: {allowed}")
    if own is None:
        return
    from fnmatch import fnmatch

    patterns = tuple(own)
    foreign = sorted(n for n in names if not n.startswith(".") and not any(fnmatch(n, p) for p in patterns))
    if foreign:
        listed = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise DynlabInputError(f"{where} holds files this command did not write ({listed}); allowed: {allowed}")


def refuse_inside_dynlab_folder(folder: str | Path, what: str, allowed: str) -> None:
    """Refuse a target ``folder`` that lies inside a dynlab run or study folder (a folder
    above it holds a run's or a study's files): a study would take it for damage or
    someone else's files.  One line naming ``what`` (the option as typed) and the folder."""
    here = Path(os.path.realpath(Path(folder).expanduser()))  # '..' and links resolved
    for above in here.parents:
        try:
            names = set(os.listdir(above))
        except OSError:
            continue
        kind = _dynlab_folder_kind(above, names)
        if kind is not None:
            raise DynlabInputError(f"{what} {folder} is inside the dynlab {kind} folder {above}: a study would take it "
                                   f"for damage or someone else's files; allowed: {allowed}")


def _dynlab_folder_kind(folder: Path, names: set[str]) -> str | None:
    """``"run"`` or ``"study"`` when ``folder`` (holding ``names``) is one, else None; on
    evidence that a stray file does not give: a run's spec.json with its checksums.json,
    result.json or weights; a study's marker, or its manifest.json (naming a study and its
    runs) beside runs/."""
    if "spec.json" in names and names & {"checksums.json", "result.json", "model.safetensors"}:
        return "run"
    if ".dynlab-study" in names:
        return "study"
    if "manifest.json" in names and (folder / "runs").is_dir():
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if isinstance(manifest, dict) and {"study", "run_ids"} <= manifest.keys():
            return "study"
    return None


def check_json_path(path: str | Path) -> Path:
    """Refuse a ``--json`` path the results could not be written to, before any benchmark
    runs: a folder, a file in a folder that does not exist, a place that is not writable
    (permissions, a read-only file system, or a file system that takes no files: a file is
    created and removed beside it, :func:`dynlab.outputs.probe_file`), a file in a run or
    study folder, and an existing file that is not a benchmark result dynlab wrote (it
    would be replaced).  Returns the path."""
    path = Path(path).expanduser()
    allowed = "allowed: a file path in an existing, writable folder"
    if path.is_dir():
        raise DynlabInputError(f"--json {path} is a folder; {allowed}")
    folder = path.parent
    if not folder.is_dir():
        above = folder
        while not (above.exists() or above.is_symlink()) and above.parent != above:
            above = above.parent
        if above.exists() and not above.is_dir():
            raise DynlabInputError(f"--json {path}: {above} is a file, not a folder; {allowed}")
        raise DynlabInputError(f"--json {path}: folder {folder} does not exist; {allowed}")
    refuse_foreign_folder(folder, "--json", allowed="a file outside dynlab's run and study folders")
    if path.exists() and not _is_bench_json(path):
        raise DynlabInputError(f"--json {path} exists and is not a benchmark file dynlab wrote; allowed: a new file, "
                               "or one that `dynlab bench` wrote (it is replaced)")
    effective = os.access in os.supports_effective_ids
    target = path if path.exists() else folder
    need = os.W_OK if target is path else os.W_OK | os.X_OK
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only or not os.access(target, need, effective_ids=effective):
        why = "read-only file system" if read_only else "permission denied"
        raise DynlabInputError(f"--json {path} is not writable ({why}); {allowed}")
    problem = probe_file(path)  # what the system says when the file is really written (e.g. /proc takes no files)
    if problem is not None:
        raise DynlabInputError(f"--json {path} {problem}; {allowed}")
    return path


def _is_bench_json(path: Path) -> bool:
    """Whether ``path`` holds a benchmark result dynlab wrote (:func:`write_bench_json`: a
    JSON object with the ``machine`` it ran on)."""
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(payload, dict) and "machine" in payload
