"""Dataset schema: the vocabulary, provenance and atomic netCDF files shared by every study.

Every variable dynlab writes gets ``long_name`` and ``units`` from the one registry
:data:`dynlab.results.vocabulary.VARIABLES` (re-exported here with :func:`annotate`), so
plots label themselves; :func:`provenance_attrs` records the dynlab version, the git sha
of the source (where available), the study, its preset and the JSON of every run spec.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import xarray as xr

import dynlab
from dynlab.config import Spec
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
    """Write ``ds`` as netCDF (h5netcdf) atomically: a temp file, then ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        _float_where_padded(ds).to_netcdf(tmp, engine="h5netcdf")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _float_where_padded(ds: xr.Dataset) -> xr.Dataset:
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


def open_dataset(path: str | Path) -> xr.Dataset:
    """Load a dataset written by :func:`write_dataset` fully into memory (file closed)."""
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return ds.load()
