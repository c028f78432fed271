"""The run store: one folder per run spec hash, written atomically.

Layout under ``root``::

    runs/<run_id>/spec.json        the full spec (canonical JSON)
    runs/<run_id>/result.json      metrics, status, reason
    runs/<run_id>/model.safetensors  weights (absent for runs that failed before any)
    runs/<run_id>/analysis.nc      per-run analyses (rewritten by `dynlab analyze`)

A run folder is assembled in a hidden temporary folder and renamed into place in one
step, so a study killed at any moment leaves either a complete run or none; leftovers of
killed writes (older than an hour, so a concurrent writer is never disturbed) are removed
on the next save.  Files added later (analyses) are
written to a temp file and ``os.replace``-d.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xarray as xr
from safetensors.torch import load_file, save_file

from dynlab.config import Spec
from dynlab.results.schema import open_dataset, write_dataset

__all__ = ["RunStore"]

_TMP_PREFIX = ".tmp-"

#: Age in seconds after which a temporary folder or file is a leftover of a killed write.
STALE_AFTER_S = 3600.0


class RunStore:
    """Per-run folders keyed by spec hash, with atomic writes and resume."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs = self.root / "runs"

    def _clean_stale(self) -> None:
        """Remove leftovers of killed writes: temp run folders and ``.*.tmp`` files older
        than :data:`STALE_AFTER_S` (younger ones may belong to a live writer sharing the
        folder).  Leftovers never count as finished runs, so keeping them is harmless."""
        if not self.runs.is_dir():
            return
        cutoff = time.time() - STALE_AFTER_S
        leftovers = [*self.runs.glob(f"{_TMP_PREFIX}*"), *self.runs.glob("*/.*.tmp"), *self.root.glob(".*.tmp")]
        for p in leftovers:
            try:
                if p.stat().st_mtime > cutoff:
                    continue
            except FileNotFoundError:
                continue
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def path(self, spec: Spec) -> Path:
        return self.runs / spec.spec_hash()

    def is_done(self, spec: Spec) -> bool:
        return (self.path(spec) / "result.json").is_file()

    def save(self, spec: Spec, result: dict[str, Any], state_dict: dict[str, torch.Tensor] | None) -> Path:
        """Write a finished run atomically; an existing finished run is left untouched."""
        final = self.path(spec)
        if self.is_done(spec):
            return final
        self.runs.mkdir(parents=True, exist_ok=True)
        self._clean_stale()
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{spec.spec_hash()}-", dir=self.runs))
        try:
            (tmp / "spec.json").write_text(spec.canonical_json())
            if state_dict is not None:
                save_file({k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, str(tmp / "model.safetensors"))
            (tmp / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
            if final.exists():  # a half-made folder from an older layout: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def load_result(self, spec: Spec) -> dict[str, Any]:
        path = self.path(spec) / "result.json"
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"run {spec.spec_hash()}: unreadable result file {path} ({exc})") from None

    def load_state_dict(self, spec: Spec) -> dict[str, torch.Tensor]:
        path = self.path(spec) / "model.safetensors"
        if not path.is_file():
            raise ValueError(f"run {spec.spec_hash()} has no weights at {path}")
        try:
            return load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise ValueError(f"run {spec.spec_hash()}: broken checkpoint {path} ({exc})") from None

    def load_spec_json(self, run_id: str) -> str:
        return (self.runs / run_id / "spec.json").read_text()

    # -- per-run extras written after the run (analyses) ---------------------------
    def has_file(self, spec: Spec, name: str) -> bool:
        return (self.path(spec) / name).is_file()

    def write_dataset(self, spec: Spec, name: str, ds: xr.Dataset) -> Path:
        return write_dataset(ds, self.path(spec) / name)

    def read_dataset(self, spec: Spec, name: str) -> xr.Dataset:
        return open_dataset(self.path(spec) / name)

    def write_json(self, spec: Spec, name: str, payload: Any) -> Path:
        return atomic_write_text(self.path(spec) / name, lambda: json.dumps(payload, indent=1, sort_keys=True))


def atomic_write_text(path: Path, make: Callable[[], str]) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(make())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
