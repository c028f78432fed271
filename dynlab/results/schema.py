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
from dynlab.spec import Spec
from dynlab.results.files import float_where_padded, make_dir, write_netcdf  # noqa: F401 (re-exported)
from dynlab.results.vocabulary import VARIABLES, annotate

__all__ = ["VARIABLES", "annotate", "git_sha", "open_dataset", "provenance_attrs", "write_dataset"]


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
    """Write ``ds`` as netCDF (h5netcdf) atomically, its folder made when missing: the one
    netCDF writer (:func:`dynlab.results.files.write_netcdf`: serialised in memory, then
    written and renamed into place; a full disk raises one ``OSError`` naming ``path`` and
    leaves any previous file unchanged).  The attrs get ``provenance_json`` (this process's
    :func:`dynlab.results.provenance.provenance`) unless they have one."""
    path = Path(path)
    make_dir(path.parent)
    if "provenance_json" not in ds.attrs:  # the execution path of the process that made it
        from dynlab.results.provenance import provenance

        ds = ds.copy(deep=False)
        ds.attrs["provenance_json"] = json.dumps(provenance(), sort_keys=True)
    return write_netcdf(ds, path)


def open_dataset(path: str | Path) -> xr.Dataset:
    """Load a dataset written by :func:`write_dataset` fully into memory (file closed)."""
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()
