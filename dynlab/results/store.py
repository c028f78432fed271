"""The run store: one folder per run spec hash, written atomically, checked on every use.

Layout under ``root``::

    runs/<run_id>/spec.json          the full spec (canonical JSON; its hash is <run_id>)
    runs/<run_id>/result.json        metrics, status, reason; ``provenance``: the execution path
                                     (:func:`dynlab.results.provenance.provenance`)
    runs/<run_id>/model.safetensors  weights (absent for runs that failed before any)
    runs/<run_id>/analysis.nc        per-run analyses (rewritten by `dynlab analyze`)
    runs/<run_id>/checksums.json     SHA-256 and size of every file above
    quarantine/<run_id>-<UTC time>/  damaged files moved aside, with WHY.txt

A run folder is assembled in a hidden temporary folder and renamed into place in one
step, so a study killed at any moment leaves either a complete run or none.  Files added
later (analyses) are written to a temp file, entered in ``checksums.json`` and
``os.replace``-d.  Every file is written whole by :mod:`dynlab.results.files` (netCDF
serialised in memory first, bytes synced to disk, then renamed), so a full disk raises one
``OSError`` and leaves the previous files as they were; files and folders get the
permissions of the process's umask.

**Leftovers of killed writes.**  A temporary name says which process of which host writes
it.  :meth:`RunStore.sweep` removes the temporary files and folders of given runs (and the
study folder's own) whose writer is provably gone (a dead process of this host), or that
are older than an hour (:data:`STALE_AFTER_S`; a writer on another host sharing the
folder cannot be checked otherwise); a live concurrent writer is never disturbed.  The
runner sweeps every run of a study it finished; :meth:`RunStore.save` sweeps before it
writes.

**One check for damage** (:meth:`RunStore.inspect`): a run folder is intact when
``checksums.json`` reads, every file it lists is there with its size and SHA-256, no other
file is there, and ``spec.json`` hashes to the folder's run id.  Anything else (a
truncated ``result.json`` or ``spec.json``, a corrupt ``analysis.nc``, missing weights, a
file edited by hand) is damage.  :meth:`RunStore.heal` moves damaged files to
``quarantine/``: the whole run when a file of the run itself is damaged (spec, result,
weights, checksums; the run must be trained again), only the analysis files when only
those are (they are recomputed), and returns a one-line report.  Folders written before
checksums existed are checked by reading every file instead, and adopted (their
``checksums.json`` written) when they pass.

**What a result must hold.**  A ``result.json`` that reads as JSON is not yet a result: a
store made with ``check_result`` (the runner passes the study's: validated against its
result type and the fields an evaluated run holds, :func:`dynlab.runner.loop.result_check`)
also treats a result its study cannot use as damage of the run (``result.json: <what is
wrong>``; the run is quarantined and trained again), in both checks above, so that no
folder with such a result is adopted or reused.

Long module: it is one class, RunStore, whose methods share the layout, the atomic-write
protocol and the damage check described above; splitting the class would split that contract.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
import xarray as xr
from safetensors.torch import load_file
from safetensors.torch import save as safetensors_bytes

from dynlab.spec import Spec
from dynlab.errors import DynlabInputError
from dynlab.results.files import (
    STALE_AFTER_S,
    TMP_DIR_PREFIX,
    is_leftover,
    make_dir,
    netcdf_bytes,
    temp_dir_name,
    write_bytes_atomic,
    write_bytes_new,
    write_text_atomic,
)
from dynlab.results.folder import run_folder
from dynlab.results.schema import CONVENTIONS, open_dataset

__all__ = ["ANALYSIS", "CHECKSUMS", "QUARANTINE", "STALE_AFTER_S", "Damage", "RunStore", "bytes_digest",
           "file_digest", "file_problem"]

_TMP_PREFIX = TMP_DIR_PREFIX

#: The per-run manifest: ``{"format": 1, "files": {name: {"sha256": hex, "bytes": n}}}``.
CHECKSUMS = "checksums.json"

#: Folder (under the study folder) that receives damaged runs and files.
QUARANTINE = "quarantine"

#: Files that make a run; damage to any of them means the run is trained again.
CORE_FILES = ("spec.json", "result.json", "model.safetensors")

#: A run's analysis file (added after the run; damage to it means the analyses are recomputed).
ANALYSIS = "analysis.nc"

_FORMAT = 1


@dataclass(frozen=True)
class Damage:
    """What :meth:`RunStore.inspect` found wrong with a run folder.

    Attributes:
        run_id: the run's id (its folder name).
        files: the damaged files (names inside the run folder).
        why: one line, naming each damaged file and what is wrong with it.
        core: True when a file of the run itself is damaged (the run must be redone);
            False when only files added later (analyses) are (they are recomputed).
    """

    run_id: str
    files: tuple[str, ...]
    why: str
    core: bool

    def report(self, dest: Path | str) -> str:
        """The one line a command says about this damage once the files went to ``dest``:
        what is redone (the run, its analyses, or nothing: a stray file of the folder)."""
        then = ("training it again" if self.core else "recomputing its analyses" if ANALYSIS in self.files
                else "the run itself is intact")
        return f"run {self.run_id} damaged ({self.why}); moved to {dest}; {then}"


def file_problem(path: Path, want: dict[str, Any]) -> str | None:
    """What is wrong with the file at ``path`` against its ``checksums.json`` entry
    ``want`` (``{"sha256", "bytes"}``): ``"missing"``, ``"<n> bytes, <m> expected"``,
    ``"checksum mismatch"``, or None when it matches.  Reads only."""
    if not path.is_file():
        return "missing"
    got = file_digest(path)
    if got["bytes"] != want.get("bytes"):
        return f"{got['bytes']} bytes, {want.get('bytes')} expected"
    if got["sha256"] != want.get("sha256"):
        return "checksum mismatch"
    return None


def file_digest(path: Path) -> dict[str, Any]:
    """``{"sha256": hex digest, "bytes": size}`` of the file at ``path``."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return {"sha256": h.hexdigest(), "bytes": size}


def bytes_digest(data: bytes | memoryview) -> dict[str, Any]:
    """:func:`file_digest` of a file that would hold ``data``."""
    view = memoryview(data).cast("B")
    return {"sha256": hashlib.sha256(view).hexdigest(), "bytes": view.nbytes}


def _spec_text_hash(text: str) -> str:
    """The run id a ``spec.json`` text belongs to (as :meth:`Spec.spec_hash`)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class RunStore:
    """Per-run folders keyed by spec hash, with atomic writes, a damage check and resume."""

    def __init__(self, root: str | Path, check_result: Callable[[dict[str, Any]], str | None] | None = None):
        """``check_result``: what is wrong with a run's parsed ``result.json`` (without the
        store's ``provenance``) for its study (one short phrase), or None when it holds what the study needs (module docstring);
        None: any JSON object with a ``status`` is a result."""
        self.root = Path(root)
        self.runs = self.root / "runs"
        self.quarantine_dir = self.root / QUARANTINE
        self.check_result = check_result
        #: Whether this store has changed the study folder: a run saved, damage moved to
        #: quarantine, a file added to a run (a command that did so no longer ends as bad input).
        self.changed = False

    def _result_problem(self, folder: Path) -> str | None:
        """What is wrong with the content of ``folder/result.json`` (a readable JSON object
        with a ``status``, and what :attr:`check_result` asks), or None."""
        try:
            result = json.loads((folder / "result.json").read_text())
        except (OSError, ValueError):
            return "missing or unreadable"
        if not isinstance(result, dict) or "status" not in result:
            return "no status"
        if self.check_result is None:
            return None
        result.pop("provenance", None)  # the store's own key (load_result's reading)
        try:
            return self.check_result(result)
        except Exception as exc:  # a checker that cannot read the result: the result is not usable
            return f"not a result of this study ({type(exc).__name__})"

    def _temporaries(self, run_ids: list[str] | None) -> list[Path]:
        """Temporary files and folders of the runs ``run_ids`` (None: of every run) and of
        the study folder itself (the dataset's and the manifest's)."""
        found = [*self.root.glob(".*.tmp")]
        if not self.runs.is_dir():
            return found
        if run_ids is None:
            return [*found, *self.runs.glob(f"{TMP_DIR_PREFIX}*"), *self.runs.glob("*/.*.tmp")]
        for rid in run_ids:
            found += [*self.runs.glob(f"{TMP_DIR_PREFIX}{rid}-*"), *(self.runs / rid).glob(".*.tmp")]
        return found

    def sweep(self, run_ids: list[str] | None = None) -> list[Path]:
        """Remove the leftovers of killed writes among the temporary files and folders of
        the runs ``run_ids`` (None: every run) and of the study folder: those whose writer
        is gone or that are older than :data:`STALE_AFTER_S`
        (:func:`dynlab.results.files.is_leftover`; module docstring).  Leftovers never
        count as finished runs, so one kept is harmless.  Returns what was removed."""
        removed = []
        now = time.time()
        for p in self._temporaries(run_ids):
            if not is_leftover(p, now):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
        return removed

    def _clean_stale(self) -> None:
        """:meth:`sweep` of every run (before a run is saved)."""
        self.sweep()

    def path(self, spec: Spec) -> Path:
        return self.runs / spec.spec_hash()

    # -- the damage check ----------------------------------------------------------
    def inspect(self, run_id: str) -> Damage | None:
        """The damage of run folder ``run_id`` (module docstring), or None when it is
        intact or absent.  Reads every file once; changes nothing (except that an intact
        folder from before checksums gets its ``checksums.json``)."""
        folder = run_folder(self.root, run_id)  # the id checked, no link followed out of the study
        if not folder.is_dir():
            return None
        present = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
        links = sorted(n for n in present if (folder / n).is_symlink())
        if links:  # never read through a link: the run is damaged
            return self._damage(run_id, {n: "a symbolic link" for n in links})
        if CHECKSUMS not in present:
            return self._inspect_legacy(run_id, folder, present)
        try:
            listed = json.loads((folder / CHECKSUMS).read_text())["files"]
            if not isinstance(listed, dict) or not {"spec.json", "result.json"} <= set(listed):
                raise ValueError("spec.json or result.json not listed")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            why = f"{CHECKSUMS} unreadable ({type(exc).__name__})"
            return Damage(run_id, tuple(sorted(present)), why, core=True)
        bad: dict[str, str] = {}
        for name, want in listed.items():
            problem = "missing" if name not in present else file_problem(folder / name, want)
            if problem is not None:
                bad[name] = problem
        for name in sorted(present - set(listed) - {CHECKSUMS}):
            bad[name] = "not in checksums.json"
        if "spec.json" not in bad:
            owner = _spec_text_hash((folder / "spec.json").read_text(errors="replace"))
            if owner != run_id:
                bad["spec.json"] = f"belongs to run {owner}"
        if "result.json" not in bad and self.check_result is not None:
            problem = self._result_problem(folder)
            if problem is not None:
                bad["result.json"] = problem
        if not bad:
            return None
        # a listed extra whose file is absent is an interrupted write: nothing to move aside
        if all(why == "missing" and name not in CORE_FILES for name, why in bad.items()):
            self._drop_listed(folder, list(bad))
            return None
        return self._damage(run_id, bad)

    def _inspect_legacy(self, run_id: str, folder: Path, present: set[str]) -> Damage | None:
        """A folder without ``checksums.json`` (written before checksums existed): check
        it by reading every file; adopt it (write its checksums) when it passes."""
        bad: dict[str, str] = {}
        try:
            if _spec_text_hash((folder / "spec.json").read_text()) != run_id:
                bad["spec.json"] = "does not hash to the run id"
        except (OSError, UnicodeDecodeError):
            bad["spec.json"] = "missing or unreadable"
        problem = self._result_problem(folder)
        if problem is not None:
            bad["result.json"] = problem
        for name in sorted(present - {"spec.json", "result.json"}):
            try:
                if name.endswith(".safetensors"):
                    load_file(str(folder / name))
                elif name.endswith(".nc"):
                    open_dataset(folder / name)
                elif name.endswith(".json"):
                    json.loads((folder / name).read_text())
            except Exception:  # safetensors and netCDF readers raise their own error types
                bad[name] = "unreadable"
        if bad:
            return self._damage(run_id, bad)
        self._write_checksums(folder, {name: file_digest(folder / name) for name in sorted(present)})
        return None

    @staticmethod
    def _damage(run_id: str, bad: dict[str, str]) -> Damage:
        why = "; ".join(f"{name}: {what}" for name, what in sorted(bad.items()))
        return Damage(run_id, tuple(sorted(bad)), why, core=any(n in CORE_FILES for n in bad))

    def quarantine(self, damage: Damage) -> Path:
        """Move what ``damage`` names out of the way, into ``quarantine/<run_id>-<UTC
        time>/`` with a ``WHY.txt``: the whole run folder when ``damage.core``, else only
        the damaged files (and their checksums entries).  Returns the quarantine folder."""
        folder = run_folder(self.root, damage.run_id)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        make_dir(self.quarantine_dir)
        self.changed = True
        dest = self.quarantine_dir / f"{damage.run_id}-{stamp}"
        n = 1
        while dest.exists():
            n += 1
            dest = self.quarantine_dir / f"{damage.run_id}-{stamp}-{n}"
        if damage.core:
            os.rename(folder, dest)
        else:
            dest.mkdir(mode=0o777)
            for name in damage.files:
                if (folder / name).exists():
                    os.replace(folder / name, dest / name)
            self._drop_listed(folder, list(damage.files))
        write_bytes_new(dest / "WHY.txt", (damage.why + "\n").encode())
        return dest

    def heal(self, run_id: str) -> tuple[Damage, Path] | None:
        """Check run ``run_id`` (:meth:`inspect`) and quarantine any damage; returns the
        damage and its quarantine folder (None when nothing was wrong).  After a core
        damage the run is absent, so it counts as not done."""
        damage = self.inspect(run_id)
        if damage is None:
            return None
        return damage, self.quarantine(damage)

    def is_done(self, spec: Spec, check: bool = True) -> bool:
        """True when the run's folder holds a finished run that passes the damage check
        (damage to its analyses only does not count).  ``check=False``: only look for the
        result file (for a caller that has just run :meth:`heal`)."""
        if not (self.path(spec) / "result.json").is_file():
            return False
        if not check:
            return True
        damage = self.inspect(spec.spec_hash())
        return damage is None or not damage.core

    # -- writing -------------------------------------------------------------------
    def save(
        self,
        spec: Spec,
        result: dict[str, Any],
        state_dict: dict[str, torch.Tensor] | None,
        provenance: dict[str, Any] | None = None,
    ) -> Path:
        """Write a finished run atomically; an existing intact run is left untouched (a
        damaged one is replaced).  ``result.json`` gets key ``provenance``: ``provenance``
        (what the work that made the run ran on, e.g. recorded on a Dask worker) or, when
        None and ``result`` has none, this process's
        (:func:`dynlab.results.provenance.provenance`)."""
        final = self.path(spec)
        if self.is_done(spec):
            return final
        if provenance is not None or "provenance" not in result:
            from dynlab.results.provenance import provenance as current

            result = {**result, "provenance": provenance if provenance is not None else current()}
        make_dir(self.runs)
        self._clean_stale()
        files: dict[str, bytes | memoryview] = {"spec.json": spec.canonical_json().encode()}
        if state_dict is not None:
            files["model.safetensors"] = safetensors_bytes(
                {k: v.detach().cpu().contiguous() for k, v in state_dict.items()})
        files["result.json"] = json.dumps(result, indent=1, sort_keys=True).encode()
        tmp = temp_dir_name(self.runs, spec.spec_hash())
        os.mkdir(tmp, 0o777)
        try:
            for name, data in files.items():
                write_bytes_new(tmp / name, data)
            self._write_checksums(tmp, {name: bytes_digest(data) for name, data in sorted(files.items())})
            if final.exists():  # a damaged or half-made folder: replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
            self.changed = True
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and not isinstance(exc, (FileNotFoundError, PermissionError)):
                raise OSError(exc.errno, f"cannot write run {final} ({exc.strerror or exc})") from None
            raise
        return final

    @staticmethod
    def _write_checksums(folder: Path, files: dict[str, dict[str, Any]]) -> None:
        payload = {"format": _FORMAT, "files": files}
        write_text_atomic(folder / CHECKSUMS, json.dumps(payload, indent=1, sort_keys=True))

    def _drop_listed(self, folder: Path, names: list[str]) -> None:
        """Remove ``names`` from the folder's checksums (files moved away or never written)."""
        try:
            payload = json.loads((folder / CHECKSUMS).read_text())
        except (OSError, ValueError):
            return
        files = {k: v for k, v in payload.get("files", {}).items() if k not in names}
        self._write_checksums(folder, files)

    def _install(self, spec: Spec, name: str, data: bytes | memoryview) -> Path:
        """Add or replace file ``name`` of a finished run with ``data``: written to a temp
        file, entered in ``checksums.json``, then renamed into place (on failure, e.g. a
        full disk, the run folder is as it was)."""
        folder = self.path(spec)
        if name in (CHECKSUMS, *CORE_FILES):
            raise ValueError(f"{name} is written with the run (RunStore.save), not added later")
        digest = bytes_digest(data)

        def enter() -> None:
            payload = json.loads((folder / CHECKSUMS).read_text())
            payload["files"][name] = digest
            self._write_checksums(folder, payload["files"])

        self.changed = True  # the checksums are entered before the file is in place
        return write_bytes_atomic(folder / name, data, before_replace=enter)

    # -- reading -------------------------------------------------------------------
    def _result_json(self, spec: Spec) -> dict[str, Any]:
        path = self.path(spec) / "result.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DynlabInputError(f"run {spec.spec_hash()}: unreadable result file {path} ({exc})") from None
        if not isinstance(raw, dict):
            raise DynlabInputError(f"run {spec.spec_hash()}: result file {path} holds no JSON object")
        return raw

    def load_result(self, spec: Spec) -> dict[str, Any]:
        """The run's result as the study reported it (``result.json`` without the
        ``provenance`` the store added: :meth:`load_provenance`)."""
        raw = self._result_json(spec)
        raw.pop("provenance", None)
        return raw

    def load_provenance(self, spec: Spec) -> dict[str, Any] | None:
        """The execution path recorded with the run (None for runs stored before it was)."""
        value = self._result_json(spec).get("provenance")
        return value if isinstance(value, dict) else None

    def load_state_dict(self, spec: Spec) -> dict[str, torch.Tensor]:
        path = self.path(spec) / "model.safetensors"
        if not path.is_file():
            raise DynlabInputError(f"run {spec.spec_hash()} has no weights at {path}")
        try:
            return load_file(str(path))
        except Exception as exc:  # safetensors raises its own error types
            raise DynlabInputError(f"run {spec.spec_hash()}: broken checkpoint {path} ({exc})") from None

    def load_spec_json(self, run_id: str) -> str:
        path = run_folder(self.root, run_id) / "spec.json"
        if path.is_symlink():
            raise OSError(f"{path} is a symbolic link")
        return path.read_text()

    # -- per-run extras written after the run (analyses) ---------------------------
    def has_file(self, spec: Spec, name: str) -> bool:
        return (self.path(spec) / name).is_file()

    def write_dataset(self, spec: Spec, name: str, ds: xr.Dataset) -> Path:
        ds = ds.copy(deep=False)
        ds.attrs["Conventions"] = CONVENTIONS
        return self._install(spec, name, netcdf_bytes(ds))

    def read_dataset(self, spec: Spec, name: str) -> xr.Dataset:
        try:
            return open_dataset(self.path(spec) / name)
        except DynlabInputError as exc:  # missing or unreadable: the run's id and what to do
            raise DynlabInputError(f"run {spec.spec_hash()}: {exc}; rerun the study to redo it") from None

    def write_json(self, spec: Spec, name: str, payload: Any) -> Path:
        return self._install(spec, name, json.dumps(payload, indent=1, sort_keys=True).encode())
