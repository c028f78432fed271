"""Dataset schema: the vocabulary, provenance and atomic netCDF files shared by every study.

Every variable dynlab writes gets ``long_name`` and ``units`` from the one registry
:data:`dynlab.results.vocabulary.VARIABLES` (re-exported here with :func:`annotate`), so
plots label themselves; :func:`provenance_attrs` records the dynlab version, the git sha
of the source (where available), the study, its preset and the JSON of every run spec.
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import xarray as xr

import dynlab
from dynlab.errors import DynlabInputError
from dynlab.spec import Spec
from dynlab.results.files import NETCDF_ENGINE, float_where_padded, make_dir, write_netcdf  # noqa: F401 (re-exported)
from dynlab.results.vocabulary import VARIABLES, annotate

__all__ = ["CONVENTIONS", "DATASET", "VARIABLES", "annotate", "git_sha", "open_dataset", "provenance_attrs", "write_dataset"]

#: The ``Conventions`` attribute of every dataset dynlab writes (CF metadata: ``long_name`` and
#: ``units`` on every variable, see :mod:`dynlab.results.vocabulary`).
CONVENTIONS = "CF-1.11"

#: The file name of a study's dataset inside its folder.
DATASET = "dataset.nc"
_ALLOWED = f"a study folder holding {DATASET}, or a netCDF .nc file"


def git_sha() -> str:
    """Commit of the dynlab source tree, or '' when not in a git checkout."""
    src = Path(dynlab.__file__).resolve().parent.parent
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def provenance_attrs(study: str, preset: str, specs: Iterable[Spec]) -> dict[str, str]:
    return {
        "dynlab_version": dynlab.__version__,
        "git_sha": git_sha(),
        "study": study,
        "preset": preset,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "specs_json": json.dumps([json.loads(s.canonical_json()) for s in specs]),
    }


def write_dataset(ds: xr.Dataset, path: str | Path) -> Path:
    """Write ``ds`` as netCDF-4 atomically, its folder made when missing: the one
    netCDF writer (:func:`dynlab.results.files.write_netcdf`: serialised in memory, then
    written and renamed into place; a full disk raises one ``OSError`` naming ``path`` and
    leaves any previous file unchanged).  The attrs get ``provenance_json`` (this process's
    :func:`dynlab.results.provenance.provenance`) unless they have one, and ``Conventions``
    (:data:`CONVENTIONS`)."""
    path = Path(path)
    make_dir(path.parent)
    ds = ds.copy(deep=False)
    ds.attrs["Conventions"] = CONVENTIONS
    if "provenance_json" not in ds.attrs:  # the execution path of the process that made it
        from dynlab.results.provenance import provenance

        ds.attrs["provenance_json"] = json.dumps(provenance(), sort_keys=True)
    return write_netcdf(ds, path)


def open_dataset(path: str | Path) -> xr.Dataset:
    """The one opener of the datasets dynlab writes (:func:`write_dataset`): ``path`` is a
    study folder (its :data:`DATASET`) or a ``.nc`` file; the dataset is loaded fully into
    memory and the file closed.
    ``dynlab.open_study`` (:mod:`dynlab.runner.driver`) is this function.  A missing or unreadable file is one line of
    :class:`~dynlab.errors.DynlabInputError` naming the path and what is allowed."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / DATASET
    if not p.is_file():
        raise DynlabInputError(f"no dataset at {p}; allowed: {_ALLOWED} (`dynlab study NAME --out DIR` writes one)")
    try:
        with xr.open_dataset(p, engine=NETCDF_ENGINE) as ds:
            return ds.load()
    except Exception as exc:  # netCDF/HDF5 readers raise their own error types
        why = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise DynlabInputError(f"unreadable dataset {p} ({why}); allowed: {_ALLOWED}, written by dynlab") from None
