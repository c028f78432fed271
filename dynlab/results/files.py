"""Files of the run store and the study writer: written whole or not at all, with the
permissions of the process's umask, in temporary names that say who writes them.

- :func:`write_bytes_atomic` writes bytes to a temporary file in the target's folder
  (``os.write`` until every byte is written, ``fsync``), then ``os.replace``-s it onto the
  target.  A failure (a full disk: ``OSError(ENOSPC)``) removes the temporary file and
  raises one ``OSError`` naming the target; the target is as it was before.
- :func:`netcdf_bytes` serialises a dataset to netCDF-4 (:data:`NETCDF_ENGINE`) in memory, so that the
  file itself is only ever written by :func:`write_bytes_atomic`: the HDF5 library, when
  it meets a full disk while writing a file, reports errors from object destructors and
  can crash the process; in memory it cannot meet one.  :func:`write_netcdf` is the one
  netCDF writer of dynlab (the study dataset and each run's analyses).
- Files are created with mode ``0o666`` and folders with ``0o777``, both reduced by the
  umask (``tempfile.mkstemp``/``mkdtemp`` would make them ``0600``/``0700`` whatever the
  umask).
- A temporary name carries the host and the process id of its writer
  (``.<name>.<random>~<host>~<pid>.tmp``, folders ``.tmp-<run id>-<random>~<host>~<pid>``).
  :func:`writer_gone` tells from the name whether the writer is provably gone: a process
  of this host that no longer runs (or whose pid now belongs to a process started after
  the file was last written).  For another host (a shared folder) or a name without a
  writer, only age tells: :data:`STALE_AFTER_S`.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import xarray as xr

__all__ = [
    "STALE_AFTER_S",
    "TMP_DIR_PREFIX",
    "is_leftover",
    "make_dir",
    "netcdf_bytes",
    "temp_name",
    "write_bytes_atomic",
    "write_bytes_new",
    "write_netcdf",
    "write_text_atomic",
    "writer_gone",
]

#: Age in seconds after which a temporary file or folder whose writer cannot be checked
#: (another host, or a name without a writer) is a leftover of a killed write.
STALE_AFTER_S = 3600.0

#: Prefix of the temporary folders a run is assembled in (hidden).
TMP_DIR_PREFIX = ".tmp-"

_WRITER = re.compile(r"~(?P<host>[^~/]+)~(?P<pid>\d+)(?:\.tmp)?$")


def _host() -> str:
    return re.sub(r"[~/\s]", "_", socket.gethostname() or "localhost")


def _writer_tag() -> str:
    return f"{secrets.token_hex(4)}~{_host()}~{os.getpid()}"


def temp_name(final: Path) -> Path:
    """A fresh temporary file name for ``final`` in its folder (hidden, with the writer)."""
    return final.parent / f".{final.name}.{_writer_tag()}.tmp"


def temp_dir_name(folder: Path, key: str) -> Path:
    """A fresh temporary folder name in ``folder`` for an entry called ``key``."""
    return folder / f"{TMP_DIR_PREFIX}{key}-{_writer_tag()}"


def _pid_started_after(pid: int, when: float) -> bool:
    """True when process ``pid`` of this host started after time ``when`` (so it cannot
    have written a file last modified at ``when``); False when that cannot be told."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time after boot, in clock ticks
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK") > when + 1.0
    except (OSError, ValueError, IndexError, StopIteration):
        return False


def writer_gone(path: Path) -> bool:
    """True when the temporary file or folder ``path`` was written by a process of this
    host that is gone (module docstring).  False for this very process, for another host
    and for a name that does not say who wrote it."""
    m = _WRITER.search(path.name)
    if m is None or m["host"] != _host():
        return False
    pid = int(m["pid"])
    if pid == os.getpid():
        return False  # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    except OSError:
        return False
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    return _pid_started_after(pid, mtime)


def is_leftover(path: Path, now: float | None = None) -> bool:
    """True when the temporary ``path`` belongs to no live writer: its writer is gone
    (:func:`writer_gone`) or it is older than :data:`STALE_AFTER_S`."""
    if writer_gone(path):
        return True
    try:
        return path.stat().st_mtime < (time.time() if now is None else now) - STALE_AFTER_S
    except OSError:
        return False


def make_dir(path: Path) -> Path:
    """Make folder ``path`` (and missing parents) with the umask's permissions."""
    path.mkdir(mode=0o777, parents=True, exist_ok=True)
    return path


def write_bytes_new(path: Path, data: bytes | memoryview) -> None:
    """Create file ``path`` (it must not exist) holding ``data``: every byte written and
    synced to disk before returning, mode ``0o666`` less the umask.  On failure the
    partial file is removed and the error raised."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(fd, view[: 1 << 24])
            view = view[n:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    os.close(fd)


def _sync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every system can)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first (what a
    command makes, and removes again when it fails: :func:`remove_empty_folders`)."""
    missing = []
    while not os.path.lexists(folder) and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove the ``folders`` (deepest first, :func:`missing_folders`) that are still empty;
    never a folder that holds anything (e.g. what a concurrent command saved meanwhile)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def staging_folder(out: Path) -> Path:
    """The temporary folder beside ``out`` in which a command writes what becomes ``out``
    (:func:`replace_folder`): ``.<name>.tmp-<pid>`` (what an earlier writer of this process
    id left there is removed). An ``out`` that is a symbolic link is staged beside the
    folder it points to (the link is kept, its target replaced)."""
    out = out.resolve() if out.is_symlink() else out
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def replace_folder(tmp: Path, out: Path) -> None:
    """Put the complete folder ``tmp`` (:func:`staging_folder`) in place of ``out``: in one
    rename over a missing or empty ``out``; over a folder holding files by renaming that
    aside first, then deleting it (a failure between the two renames puts it back).  A
    failure before this leaves ``out`` as it was. The hidden entries of ``out`` that ``tmp``
    does not have (``.git``, ``.cache``, ``.gitattributes``: the user's, not the command's)
    are moved into the new folder first, so that nothing but what the command writes is
    replaced. A symbolic link ``out`` keeps pointing where it did, to the new folder."""
    out = out.resolve() if out.is_symlink() else out
    kept = [e.name for e in out.iterdir() if e.name.startswith(".") and not (tmp / e.name).exists()] if out.is_dir() else []
    moved: list[str] = []
    try:
        for name in kept:
            os.rename(out / name, tmp / name)
            moved.append(name)
        _swap(tmp, out)
    except BaseException:
        for name in moved:  # the user's entries go back where they were
            if (tmp / name).exists() and not (out / name).exists():
                os.rename(tmp / name, out / name)
        raise
    _sync_dir(out.parent)


def _swap(tmp: Path, out: Path) -> None:
    """:func:`replace_folder`'s renames: ``tmp`` in place of ``out`` (``out`` renamed aside
    and deleted when it holds anything; put back if the second rename fails)."""
    if out.is_dir() and any(out.iterdir()):
        aside = out.parent / f".{out.name}.old-{os.getpid()}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(out, aside)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(aside, out)
            raise
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(tmp, out)  # an empty folder is replaced in one step


def write_bytes_atomic(path: str | Path, data: bytes | memoryview, before_replace: Callable[[], None] | None = None) -> Path:
    """Replace file ``path`` by one holding ``data``, atomically (module docstring).

    ``before_replace``: called after the temporary file is complete and before it is
    renamed onto ``path`` (the store enters the file in ``checksums.json`` there).  Any
    failure leaves ``path`` as it was and no temporary file; an ``OSError`` is raised as
    one naming ``path`` (its errno kept, e.g. ``ENOSPC`` for a full disk).
    """
    path = Path(path)
    tmp = temp_name(path)
    try:
        write_bytes_new(tmp, data)
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError)):
            code = exc.errno or errno.EIO
            raise OSError(code, f"cannot write {path}: {exc.strerror or os.strerror(code)}") from None
        raise
    _sync_dir(path.parent)
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    return write_bytes_atomic(path, text.encode())


#: The xarray engine that writes and reads every netCDF file of dynlab: netCDF4-python, the
#: netCDF C library (format NETCDF4, an HDF5 file: any netCDF-4 reader opens it, h5netcdf
#: too).  Its cost is per variable; on a run's ``analysis.nc`` (~70 variables) it writes and
#: reads about 6x faster than h5netcdf (docs/performance.md).
NETCDF_ENGINE = "netcdf4"


def float_where_padded(ds: xr.Dataset) -> xr.Dataset:
    """A shallow copy of ``ds`` in which a variable read from an integer file (encoding
    ``dtype`` int) but now holding floats (e.g. padded with NaN by a join of runs with
    different lengths) is written as float: otherwise netCDF casts NaN to a huge
    negative integer."""
    out = ds.copy(deep=False)
    for var in out.variables.values():
        enc = var.encoding.get("dtype")
        if enc is not None and np.dtype(enc).kind in "iub" and var.dtype.kind in "fc":
            var.encoding = {k: v for k, v in var.encoding.items() if k not in ("dtype", "_FillValue", "missing_value")}
    return out


def netcdf_bytes(ds: xr.Dataset) -> memoryview:
    """``ds`` as a netCDF-4 file in memory (:data:`NETCDF_ENGINE`), integer variables that
    now hold NaN padding written as float (:func:`float_where_padded`)."""
    return float_where_padded(ds).to_netcdf(engine=NETCDF_ENGINE)


def write_netcdf(ds: xr.Dataset, path: str | Path, before_replace: Callable[[], None] | None = None) -> Path:
    """Write ``ds`` as netCDF to ``path`` atomically (:func:`netcdf_bytes`, then
    :func:`write_bytes_atomic`)."""
    return write_bytes_atomic(path, netcdf_bytes(ds), before_replace)
