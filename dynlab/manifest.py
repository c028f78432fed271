"""A study folder's manifest (``manifest.json``): the options a study was run with and its
runs.  Reading it back for ``dynlab analyze`` (checked field by field, against the runs it
lists and the files it will rewrite), and the check before a rerun into a folder that it
would orphan runs of (:func:`check_same_runs`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.results.folder import run_folder, check_run_id
from dynlab.results.schema import DATASET
from dynlab.results.store import ANALYSIS, QUARANTINE, RunStore
from dynlab.runtime import NullProgress, say
from dynlab.spec import Spec, load_spec
from dynlab.runner.protocol import Study, StudyExtra, StudyOptions

__all__ = ["MANIFEST", "check_manifest_runs", "check_runs_present", "check_same_runs", "load_manifest", "manifest_options",
           "manifest_specs", "options_record", "probe_study_files", "recorded_extra", "spec_of"]

MANIFEST = "manifest.json"


#: The option each common field of a manifest is set by (the study commands' words); a
#: study's own options name theirs (:attr:`dynlab.runner.protocol.StudyExtra.option_words`).
OPTION_OF = {"preset": "--preset", "models": "--models", "seeds": "--seeds"}


def _said(value: Any) -> str:
    if value is None:
        return "the preset's default"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def options_record(options: StudyOptions, extra: StudyExtra) -> dict[str, Any]:
    """The manifest's record of the options (the fields :func:`dynlab.runner.driver.run_study` writes in it)."""
    return {"preset": options.preset, "models": list(options.models) if options.models else None,
            "seeds": list(options.seeds) if options.seeds is not None else None, "extra": extra.recorded()}


def recorded_extra(manifest: dict[str, Any], options_type: type[StudyExtra]) -> Any:
    """The study options a manifest records (its ``extra``, None when absent), with the
    fields that manifests of earlier versions kept at the top level
    (:attr:`~dynlab.runner.protocol.StudyExtra.manifest_top_level`, a null one left out) read back
    into it; ``extra``'s own value wins.  Not a mapping: returned as it is."""
    extra = manifest.get("extra")
    moved = {k: manifest[k] for k in options_type.manifest_top_level if manifest.get(k) is not None}
    if not moved or (extra is not None and not isinstance(extra, dict)):
        return extra
    return {**moved, **(extra or {})}


def _first_difference(old: dict[str, Any], new: dict[str, Any], options_type: type[StudyExtra]) -> tuple[str, Any, Any] | None:
    """The first option whose recorded value differs between manifests ``old`` and ``new``:
    (option as the command line names it, old value, new value); None when none does."""
    for key in ("preset", "models", "seeds"):
        if key in old and old[key] != new[key]:
            return OPTION_OF[key], old[key], new[key]
    old_extra, new_extra = recorded_extra(old, options_type), new.get("extra") or {}
    if not isinstance(old_extra, dict):
        return None
    flat_old = {**{k: v for k, v in old_extra.items() if k != "task"}, **(old_extra.get("task") or {})}
    flat_new = {**{k: v for k, v in new_extra.items() if k != "task"}, **(new_extra.get("task") or {})}
    words = {**options_type.option_words, **OPTION_OF}
    for key in sorted(set(flat_old) | set(flat_new)):
        if flat_old.get(key) != flat_new.get(key):
            return words.get(key, f"option {key!r}"), flat_old.get(key), flat_new.get(key)
    return None


def check_same_runs(root: Path, study: Study, options: StudyOptions, extra: StudyExtra, specs: list[Spec],
                    note: bool = False) -> None:
    """Refuse a rerun into a study folder whose manifest records runs that ``specs`` lack
    (other options): it would replace that study's dataset and manifest and orphan those
    runs.  One line naming the option that differs, with both values.  The same runs
    (asked in other words too: ``--models all`` or the list) are a resume; more runs (more
    seeds, models or a study's other selections) extend the study (with ``note``, one ``note:`` line says so);
    another analysis preset only redoes the analyses.  A folder whose manifest is missing or
    unreadable is judged by the finished runs in its ``runs/`` (:func:`_check_runs_kept`)."""
    try:
        old = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict) or not isinstance(old.get("run_ids"), list):
        _check_runs_kept(root, {s.spec_hash() for s in specs})
        return
    kept, new = set(map(str, old["run_ids"])), {s.spec_hash() for s in specs}
    if kept <= new:  # the same runs (a resume), or more (an extension): every earlier run stays in the dataset
        if note and new - kept and kept:
            say(NullProgress(), f"note: {root} holds a study of {len(kept)} runs; these options add "
                                 f"{len(new - kept)} runs to it")
        return
    diff = _first_difference(old, options_record(options, extra), type(extra))
    what = (f"was run with {diff[0]} {_said(diff[1])}, this run asks {diff[0]} {_said(diff[2])}" if diff is not None
            else "holds other runs than these options make (written by another dynlab version?)")
    raise DynlabInputError(f"--out {root} {what}: rerunning would replace its dataset and manifest; allowed: the "
                           "same options (resumes the study), or another --out")


def _check_runs_kept(root: Path, new: set[str]) -> None:
    """Without a readable manifest, refuse options that leave out a finished run of
    ``root/runs`` (a folder with its ``result.json``): the rerun would write a dataset and a
    manifest without it.  Its options are unknown, so the line names how many runs."""
    try:
        done = {p.name for p in (root / "runs").iterdir() if p.is_dir() and (p / "result.json").is_file()}
    except OSError:  # no runs/ (a new study), or one that cannot be listed (the store's checks say why)
        return
    left = sorted(done - new)
    if left:
        raise DynlabInputError(f"--out {root} holds {len(left)} finished runs these options leave out (e.g. {left[0]}), "
                               f"and its {MANIFEST} is missing or unreadable: rerunning would write a dataset without "
                               "them; allowed: options that make those runs too (the command that made the study), "
                               "or another --out")


def load_manifest(path: Path) -> dict:
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise DynlabInputError(f"{path} is not a dynlab study folder (no {MANIFEST}); run `dynlab study ...` first") from None
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8 text (UnicodeDecodeError)
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise DynlabInputError(f"unreadable study manifest {mpath} ({why}); allowed: the manifest.json a study "
                               "writes (rerun `dynlab study ...` with the same --out)") from None
    ok = (
        isinstance(manifest, dict)
        and isinstance(manifest.get("study"), str)
        and isinstance(manifest.get("preset"), str)
        and isinstance(manifest.get("run_ids"), list)
        and all(isinstance(r, str) for r in manifest["run_ids"])
    )
    if not ok:
        raise DynlabInputError(f"broken study manifest {mpath}: needs 'study', 'preset' and a list of 'run_ids'")
    for rid in manifest["run_ids"]:  # before any path is formed from one
        check_run_id(rid, f"broken study manifest {mpath}")
    from dynlab.runner.protocol import collapse_repeats

    kept, counts = collapse_repeats(tuple(manifest["run_ids"]))
    if counts:
        said = " and ".join(f"{rid} {n} times" for rid, n in counts.items())
        say(NullProgress(), f"note: study manifest {mpath} lists run {said}; each is used once")
    return {**manifest, "run_ids": list(kept)}


def check_manifest_runs(path: Path, study: Study, options: StudyOptions, run_ids: list[str]) -> None:
    """Refuse a manifest whose options (preset, selections) do not make the runs it lists:
    the dataset would record options the runs were not trained with.  A manifest whose
    options cannot make specs here (e.g. a text file that moved) is not checked."""
    try:
        made = {s.spec_hash() for s in study.make_specs(options)}
    except (DynlabInputError, ValueError, OSError):
        return
    if made != set(run_ids):
        alien = sorted(set(run_ids) - made)
        which = f"run {alien[0]} was not made by them" if alien else f"they make {len(made - set(run_ids))} runs it lacks"
        raise DynlabInputError(f"broken study manifest {path / MANIFEST}: its options (preset {options.preset!r}, "
                               f"models, seeds, extra) do not match its runs ({which}); allowed: the manifest "
                               f"the study wrote (rerun `dynlab study {study.name}` with the runs' options)")


def spec_of(store: RunStore, run_id: str, study: Study) -> Spec | None:
    """The spec of run ``run_id`` as its ``spec.json`` says, or None when it does not read
    (the damage check that follows reports that)."""
    try:
        return load_spec(store.load_spec_json(run_id), study.spec_type)
    except (OSError, ValueError):
        return None


def probe_study_files(path: Path, run_ids: list[str]) -> None:
    """Refuse, before any analysis runs, a study folder whose files analyze rewrites
    cannot be written or replaced (``dataset.nc``, ``manifest.json``, each run's
    ``analysis.nc`` and ``checksums.json``): probed by :func:`dynlab.outputs.probe_file`
    (an immutable file, a read-only folder), one line naming the file."""
    from dynlab.outputs import probe_file

    targets = [path / DATASET, path / MANIFEST]
    for rid in run_ids:
        folder = run_folder(path, rid)  # the id checked; a link is refused, never probed through
        if folder.is_dir():
            targets += [folder / ANALYSIS, folder / "checksums.json"]
    for target in targets:
        problem = probe_file(target)
        if problem is not None:
            raise DynlabInputError(f"cannot analyse the study: {target} {problem}; allowed: a study folder whose "
                                   "files can be rewritten")


def check_runs_present(path: Path, manifest: dict) -> None:
    """Refuse, before anything in the study folder changes, a manifest that lists a run
    missing from ``runs/`` (one moved to ``quarantine/`` by an earlier check, or never
    finished): one line naming it and the way out."""
    for rid in manifest["run_ids"]:
        if not run_folder(path, rid).is_dir():
            moved = sorted((path / QUARANTINE).glob(f"{rid}-*"))
            where = f" (moved to {moved[-1]})" if moved else ""
            raise DynlabInputError(f"study {path}: run {rid} is missing{where}; rerun `dynlab study "
                                   f"{manifest['study']}` with the same options to train it again")


def manifest_specs(path: Path, manifest: dict, study: Study, store: RunStore) -> list[Spec]:
    """The specs of the manifest's intact runs, read from their ``spec.json``
    (:func:`load_spec`) after the damage check of run_study.  A damaged run (a file of the
    run itself: it needs training) is moved to ``quarantine/``, said in one line and left
    out: the dataset is written without it, the manifest keeps it (rerunning the study
    trains it again).  Damage to its analyses or a stray file is said as a study says it."""
    kept = []
    for rid in manifest["run_ids"]:
        healed = store.heal(rid)
        if healed is not None and healed[0].core:
            damage, dest = healed
            say(NullProgress(), f"run {rid} damaged ({damage.why}); moved to {dest}; left out of the dataset (rerun "
                                f"`dynlab study {manifest['study']}` with the same options to train it again)")
            continue
        if healed is not None:  # its analyses (recomputed) or a stray file: said in one line, as a study says it
            say(NullProgress(), healed[0].report(healed[1]))
        kept.append(rid)
    specs = []
    for rid in kept:
        try:
            text = store.load_spec_json(rid)
        except OSError:
            raise DynlabInputError(f"study {path}: run {rid} is missing; rerun the study to finish it") from None
        try:
            specs.append(load_spec(text, study.spec_type))
        except ValueError as exc:
            raise DynlabInputError(f"study {path}: broken spec.json of run {rid} ({exc})") from None
    return specs


def manifest_options(path: Path, manifest: dict, study: Study) -> StudyOptions:
    """The options of ``study`` that a manifest records (:func:`recorded_extra`: a field
    that an earlier version kept at the top level is read into ``extra``); a one-line
    :class:`DynlabInputError` naming the field when one has the wrong type (``models``: a
    list of names or null, ``seeds``: a list of integers ≥ 0 or null, ``extra``: a mapping
    or null; a study's field of the top level: what ``extra`` allows)."""

    def listed(key: str, kind: type, what: str) -> tuple | None:
        value = manifest.get(key)
        if value is None:
            return None
        ok = isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        if not ok or (kind is int and any(v < 0 for v in value)):
            raise DynlabInputError(f"broken study manifest {path / MANIFEST}: {key!r} is {value!r}; allowed: {what} or null")
        return tuple(value)

    extra = recorded_extra(manifest, study.options_type)
    if extra is not None and not isinstance(extra, dict):
        raise DynlabInputError(f"broken study manifest {path / MANIFEST}: 'extra' is {extra!r}; allowed: a mapping or null")
    return StudyOptions(
        preset=manifest["preset"],
        models=listed("models", str, "a list of names") or None,
        seeds=listed("seeds", int, "a list of integers >= 0"),
        extra=extra or {},
    )
