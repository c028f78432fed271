"""Run a study's specs: skip finished runs, never lose one, write the study dataset.

``run_study`` is what ``dynlab study NAME`` calls.  Everything is validated before the
first file is written.  Each finished run is stored atomically (see
:mod:`dynlab.results.store`), so a study killed at any point resumes where it stopped
without redoing finished runs.  A diverged run is stored with its status and reason and
the study goes on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import xarray as xr

from dynlab.spec import Spec, load_spec
from dynlab.errors import DynlabInputError
from dynlab.executors import Executor, InProcessExecutor
from dynlab.results.schema import DATASET, annotate, provenance_attrs, write_dataset
from dynlab.results.schema import open_dataset as open_study  # the public name: dynlab.open_study
from dynlab.results.files import make_dir, write_text_atomic
from dynlab.results.provenance import provenance, recording
from dynlab.results.folder import LOCK, MARKER, RESUME, check_run_id, check_study_folder, claim, run_folder, study_lock
from dynlab.results.store import RunStore
from dynlab.study import RunOutcome, Study, StudyExtra, StudyOptions
from dynlab.runtime import NullProgress, make_progress, resolve_device, train_threads

__all__ = ["analyze_study", "check_analyses_fit", "open_study", "run_study", "study_dir"]

MANIFEST = "manifest.json"
ANALYSIS = "analysis.nc"


#: The folder of a study where long runs keep their training state while they train
#: (:attr:`dynlab.study.Study.resumable`); a file there is removed when its runs finish.
RESUME_DIR = RESUME


def study_dir(out: str | Path, study: Study) -> Path:
    return Path(out) / study.name


def check_analyses_fit(study: Study, specs: list[Spec], analyze: bool) -> None:
    """Refuse, before anything runs, a study whose per-run analyses cannot be done for
    ``specs`` (the study's :attr:`~dynlab.study.Study.check_analyses`, one line)."""
    if analyze and study.analyze_one is not None and study.check_analyses is not None:
        study.check_analyses(study.name, specs)


def _heal(specs: list[Spec], store: RunStore, progress: NullProgress) -> None:
    """One damage check per run: damaged runs (or analyses) are moved to quarantine and
    redone; each is reported in one line."""
    for spec in specs:
        healed = store.heal(spec.spec_hash())
        if healed is not None:
            damage, dest = healed
            then = "training it again" if damage.core else "recomputing its analyses"
            _say(progress, f"run {damage.run_id} damaged ({damage.why}); moved to {dest}; {then}")


def _work(study: Study, device, progress: NullProgress,
          resume_dir: Path | None = None) -> Callable[[list[Spec]], tuple[list[RunOutcome], dict]]:
    """The function an executor runs on a work item: train its specs where it runs; return
    their outcomes and the provenance of that work (what it ran on, recorded there)."""

    def work(item: list[Spec]) -> tuple[list[RunOutcome], dict]:
        # The device is resolved where the work runs (a GPU worker of a CPU-only client);
        # the thread count is fixed (RUN_THREADS), not taken from the worker's machine.
        t0 = time.perf_counter()
        dev = resolve_device(device)
        with recording() as rec, train_threads(dev):
            outcomes = study.run_item(item, dev, progress, resume_dir=resume_dir)
        for o in outcomes:
            if o.result.wall_time_s is None:
                o.result.wall_time_s = (time.perf_counter() - t0) / len(item)
        return outcomes, provenance(rec, device=dev)

    return work


def _tally(study: Study, specs: list[Spec], store: RunStore, progress: NullProgress, counts: dict[str, int],
           announced: set[str] = frozenset()) -> list[Spec]:
    """Count (and log, unless ``announced`` holds their id) the not-learned and failed runs;
    return the evaluated ones."""
    evaluated = []
    for spec in specs:
        result = study.load_result(store, spec)
        said = spec.spec_hash() in announced
        if result.status == "not-learned":  # evaluated and analysed like ok runs; the study says how it counts them
            counts["not_learned"] += 1
            if not said:
                progress.log(f"run {spec.spec_hash()} not-learned: {result.reason}")
        elif result.status != "ok":
            counts["failed"] += 1
            if not said:
                progress.log(f"run {spec.spec_hash()} {result.status}: {result.reason}")
            continue
        evaluated.append(spec)
    return evaluated


def _run_specs(
    study: Study,
    specs: list[Spec],
    store: RunStore,
    device,
    progress: NullProgress,
    analyze: bool,
    executor: Executor | None = None,
    force_analysis: bool = False,
    extra: StudyExtra | None = None,
) -> dict[str, Any]:
    """Train the unfinished runs of ``specs`` (healing damaged ones first), store each as it
    arrives, then analyse the evaluated runs that lack an analysis (all of them with
    ``force_analysis``).  ``extra``: the study's parsed options, handed to ``analyze_one``
    (needed when ``analyze``).  Returns counts: trained, reused, analyzed, failed, not_learned,
    and the seconds (``time.perf_counter``) spent training (``train_s``: the training loop,
    less the analyses run inside it) and analysing (``analysis_s``)."""
    counts = {"trained": 0, "reused": 0, "analyzed": 0, "failed": 0, "not_learned": 0,
              "train_s": 0.0, "analysis_s": 0.0}
    executor = executor or InProcessExecutor()
    remote = getattr(executor, "remote", False)
    _heal(specs, store, progress)
    pending = [s for s in specs if not store.is_done(s, check=False)]
    counts["reused"] = len(specs) - len(pending)
    bar = progress.add(f"{study.name}: runs", len(specs))
    progress.update(bar, counts["reused"])

    analyze = analyze and study.analyze_one is not None
    if analyze and extra is None:
        raise TypeError("_run_specs: analyses need the study's parsed options (extra=)")
    local_device = resolve_device(device) if analyze else None
    analysed: set[str] = set()
    announced: set[str] = set()  # runs whose status a finished-run line has said

    def analyse(spec: Spec) -> None:
        t0 = time.perf_counter()
        with recording() as rec, train_threads(local_device):  # same numbers whatever this machine's core count
            ds = study.analyze_one(spec, store, local_device, progress, extra)
        ds.attrs["provenance_json"] = json.dumps(provenance(rec, device=local_device), sort_keys=True)
        store.write_dataset(spec, ANALYSIS, ds)
        counts["analyzed"] += 1
        analysed.add(spec.spec_hash())
        counts["analysis_s"] += time.perf_counter() - t0

    # With workers in other processes the analyses of finished runs run here while the
    # workers train the next ones (the same calls per run, so the same numbers).  Not with
    # workers that are threads of this process: model initialisation forks torch's global
    # RNG, which an analysis here would reseed under a training thread.
    overlap = analyze and remote and not getattr(executor, "shares_process", False)
    # work shipped to other processes must not carry the client's progress bars
    work = _work(study, device, NullProgress() if remote else progress, store.root / RESUME_DIR)
    loop_started = time.perf_counter()
    for item, (outcomes, made_on) in executor.map_unordered(work, study.work_items(pending)):
        for spec, outcome in zip(item, outcomes):
            store.save(spec, outcome.result.to_json(), outcome.state_dict, provenance=made_on)
            counts["trained"] += 1
            progress.update(bar, 1)
            if progress.finished(_run_line(study, spec, outcome.result, counts["trained"] + counts["reused"], len(specs))):
                announced.add(spec.spec_hash())
        for spec, outcome in zip(item, outcomes):
            if overlap and outcome.result.evaluated:
                analyse(spec)
    counts["train_s"] = time.perf_counter() - loop_started - counts["analysis_s"]  # overlapped analyses left out
    to_analyze = [
        s for s in _tally(study, specs, store, progress, counts, announced)
        if analyze and s.spec_hash() not in analysed
        and (force_analysis or not store.has_file(s, ANALYSIS) or _other_analysis_preset(store, s, extra))
    ]
    if to_analyze:
        abar = progress.add(f"{study.name}: analyses", len(to_analyze))
        for i, spec in enumerate(to_analyze, 1):
            analyse(spec)
            progress.update(abar, 1)
            progress.finished(f"{study.name}: analysis {i}/{len(to_analyze)} {spec.spec_hash()} done")
    return counts


def _run_line(study: Study, spec: Spec, result: Any, done: int, total: int) -> str:
    """One line about a finished run: ``group-tracking: run 3/12 1a2b3c4d5e6f7a8b ok, loss 0.012, 4.2 s``
    (the status's reason when it is not ok)."""
    parts = [result.status]
    if result.train_loss is not None:
        parts.append(f"loss {result.train_loss:.4g}")
    if result.wall_time_s is not None:
        parts.append(f"{result.wall_time_s:.1f} s")
    why = f" ({result.reason})" if result.status != "ok" and result.reason else ""
    return f"{study.name}: run {done}/{total} {spec.spec_hash()} {', '.join(parts)}{why}"


def _other_analysis_preset(store: RunStore, spec: Spec, extra: StudyExtra | None) -> bool:
    """True when the study's options name an analysis preset (``extra.analysis``) and the
    run's stored analysis was made with another one (attr ``analysis_preset``, missing in
    analyses written before it was recorded): that analysis is redone, so the manifest's
    preset is the one every ``analysis.nc`` of the study was made with."""
    want = getattr(extra, "analysis", None)
    if want is None:
        return False
    try:
        with xr.open_dataset(store.path(spec) / ANALYSIS, engine="h5netcdf") as ds:
            return ds.attrs.get("analysis_preset") != want
    except Exception:  # unreadable: redo it (the store's damage check reports real damage)
        return True


def _say(progress: NullProgress, message: str) -> None:
    """One line for the user: through the progress display when there is one, else on stderr."""
    if type(progress) is NullProgress:
        print(message, file=sys.stderr)
    else:
        progress.log(message)


def _executor_workers(executor: Executor | None) -> int | None:
    """How many workers ``executor`` runs work items on now: 1 in process (``None``, the
    default), else its ``n_workers()`` (a Dask cluster's workers); ``None`` when it cannot say."""
    if executor is None:
        return 1
    count = getattr(executor, "n_workers", None)
    try:
        n = count() if callable(count) else None
    except Exception:  # a scheduler that does not answer: the count is unknown, not an error
        return None
    return int(n) if n is not None else None


def _timing_attrs(started: float, trained: int, workers: int | None, invocation: str,
                  train_s: float | None = None, analysis_s: float | None = None) -> dict:
    """The dataset attributes that say how long the invocation that writes it took:

    - ``study_wall_time_s``: seconds (``time.perf_counter``) from the start of that
      invocation (``run_study`` or ``analyze_study``) to the write of the dataset — training,
      analyses and assembly, not the runs reused from an earlier invocation;
    - ``study_runs_trained``: the runs trained by that invocation (a resumed study trained
      fewer than its specs, ``dynlab analyze`` none);
    - ``study_workers``: the executor's workers when the work started (1 in process;
      absent when the executor could not say);
    - ``study_invocation``: ``study`` or ``analyze``;
    - ``study_train_s``, ``study_analysis_s``: the seconds of that wall time spent training
      and analysing (:func:`_run_specs`), measured in the same invocation, so their ratio
      compares the two phases on one machine under one load.
    """
    attrs = {"study_wall_time_s": round(float(time.perf_counter() - started), 3),
             "study_runs_trained": int(trained), "study_invocation": invocation}
    if workers is not None:
        attrs["study_workers"] = int(workers)
    for name, seconds in (("study_train_s", train_s), ("study_analysis_s", analysis_s)):
        if seconds is not None:
            attrs[name] = round(float(seconds), 3)
    return attrs


def phase_line(study_name: str, train_s: float, analysis_s: float) -> str:
    """``group-tracking: training 5 min 49 s, analyses 2 min 10 s (0.37 of training)``."""
    def took(s: float) -> str:
        return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"

    ratio = f" ({analysis_s / train_s:.2f} of training)" if train_s > 0 else ""
    return f"{study_name}: training {took(train_s)}, analyses {took(analysis_s)}{ratio}"


def _finish(study: Study, specs: list[Spec], store: RunStore, options: StudyOptions, extra: StudyExtra,
            timing: dict | None = None) -> Path:
    """Assemble and write the study dataset and the manifest; the manifest records the
    study's options as parsed (``extra``: preset-dependent choices such as the analysis
    preset written out), so ``dynlab analyze`` reuses them.  ``timing``: the arguments of
    :func:`_timing_attrs`, whose attributes the dataset gets (the wall time taken at the write).
    Then the temporary files that killed writes left in the study's runs are removed
    (:meth:`RunStore.sweep`), so a finished study leaves none of its own behind."""
    ds = study.assemble(specs, store, options)
    annotate(ds)
    ds.attrs.update(provenance_attrs(study.name, options.preset, specs))
    if timing is not None:
        ds.attrs.update(_timing_attrs(**timing))
    made = _study_provenance(specs, store)
    ds.attrs["provenance_json"] = json.dumps(made, sort_keys=True)
    path = write_dataset(ds, store.root / DATASET)
    manifest = {
        "study": study.name,
        "preset": options.preset,
        "models": list(options.models) if options.models else None,
        "groups": list(options.groups) if options.groups else None,
        "seeds": list(options.seeds) if options.seeds is not None else None,
        "extra": extra.recorded(),
        "run_ids": [s.spec_hash() for s in specs],
        "provenance": made,
    }
    if timing is not None and timing.get("analysis_s") is not None:
        manifest["timing"] = {k: ds.attrs[k] for k in ("study_wall_time_s", "study_train_s", "study_analysis_s")}
    write_text_atomic(store.root / MANIFEST, json.dumps(manifest, indent=1))
    store.sweep([s.spec_hash() for s in specs])  # leftovers of killed writes to these runs
    return path


def _study_provenance(specs: list[Spec], store: RunStore) -> dict:
    """``{"written_by": provenance of this process, "runs": [{"run_ids": [...],
    "provenance": {...}}, ...]}``: each distinct execution path recorded with the runs
    (:meth:`RunStore.load_provenance`; runs stored before it was recorded are listed with
    ``provenance`` null), with the runs that share it."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        try:
            made = store.load_provenance(spec)
        except DynlabInputError:
            made = None
        groups.setdefault(json.dumps(made, sort_keys=True), []).append(spec.spec_hash())
    runs = [{"run_ids": ids, "provenance": json.loads(key)} for key, ids in groups.items()]
    return {"written_by": provenance(), "runs": runs}


def run_study(
    study: Study,
    options: StudyOptions,
    out: str | Path = "dynlab-runs",
    device: str = "auto",
    progress: bool = False,
    analyze: bool = True,
    executor: Executor | None = None,
) -> Path:
    """Train, evaluate (and analyse) every spec of ``study``; return the dataset path.

    The study folder is ``out/<study name>``; it holds ``runs/``, ``dataset.nc`` and
    ``manifest.json``.  The dataset records this invocation's wall time, runs trained and
    workers (:func:`_timing_attrs`).  Each run's ``result.json``, each ``analysis.nc``, the dataset
    (attr ``provenance_json``) and the manifest (``provenance``) record the execution path
    (:mod:`dynlab.results.provenance`).  ``executor`` decides where work items run (default: in
    process); results are saved here, one run at a time, as they arrive.  A study that
    fails before it stored anything removes the folders it made (a failed run is stored
    as such; a crash, e.g. out of memory in the first run, leaves no empty ``runs/``).
    """
    started = time.perf_counter()
    options = study.prepared(options)  # the study's reading of the selections (group names: canonical)
    study.check_preset(options.preset)
    extra = study.parse_options(options)  # an unknown option is refused in every study
    specs = study.make_specs(options)  # validates everything before anything is written
    check_analyses_fit(study, specs, analyze)
    if not getattr(executor, "remote", False):
        resolve_device(device)  # refuse an unknown or unavailable device before writing
    store = RunStore(study_dir(out, study))
    check_study_folder(store.root, study.name, flag="--out")  # someone else's folder: refused before any write
    check_same_runs(store.root, study, options, extra, specs)
    made = _missing_folders(store.runs)
    try:
        make_dir(store.root)
    except OSError as exc:
        raise DynlabInputError(f"cannot write the study to {store.root} ({exc.strerror or exc}); allowed: a writable folder") from None
    workers = _executor_workers(executor)
    try:
        with study_lock(store.root, flag="--out"):
            # checked again under the lock: another process may have written meanwhile
            check_study_folder(store.root, study.name, flag="--out")
            check_same_runs(store.root, study, options, extra, specs, note=True)
            claim(store.root, study.name)  # the marker first
            try:
                make_dir(store.runs)
            except OSError as exc:
                raise DynlabInputError(f"cannot write the study to {store.root} ({exc.strerror or exc}); "
                                       "allowed: a writable folder") from None
            with make_progress(progress) as prog:
                counts = _run_specs(study, specs, store, device, prog, analyze, executor, extra=extra)
                if counts["trained"] or counts["analyzed"]:  # a rerun that reuses every run: the summary alone
                    prog.log(phase_line(study.name, counts["train_s"], counts["analysis_s"]))
                prog.log(
                    f"{study.name}: {counts['trained']} trained, {counts['reused']} reused, "
                    f"{counts['analyzed']} analysed, {counts['not_learned']} not learned, {counts['failed']} failed"
                )
            timing = {"started": started, "trained": counts["trained"], "workers": workers, "invocation": "study",
                      "train_s": counts["train_s"], "analysis_s": counts["analysis_s"]}
            return _finish(study, specs, store, options, extra, timing)
    except BaseException:
        if store.root in made:  # a study that stored nothing leaves no folders behind (nor its marker and lock)
            _remove_own_files(store.root)
        _remove_if_empty(made)
        raise


def _remove_own_files(root: Path) -> None:
    """Remove the marker and the lock of a study folder this invocation made, when it stored
    nothing there (``runs/`` empty, no manifest)."""
    if (root / MANIFEST).exists() or (root / "runs").is_dir() and any((root / "runs").iterdir()):
        return
    for name in (MARKER, LOCK):
        try:
            (root / name).unlink()
        except OSError:
            pass


#: The option each field of a manifest is set by (the study commands' words).
OPTION_OF = {"preset": "--preset", "models": "--models", "groups": "--groups", "seeds": "--seeds",
             "interventions": "--interventions", "source": "--source", "eval_lengths": "--lengths",
             "depths": "--depths", "babi_kinds": "--kinds", "analysis": "the analysis preset"}


def _said(value: Any) -> str:
    if value is None:
        return "the preset's default"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _options_record(options: StudyOptions, extra: StudyExtra) -> dict[str, Any]:
    """The manifest's record of the options (the fields :func:`_finish` writes)."""
    return {"preset": options.preset, "models": list(options.models) if options.models else None,
            "groups": list(options.groups) if options.groups else None,
            "seeds": list(options.seeds) if options.seeds is not None else None, "extra": extra.recorded()}


def _first_difference(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first option whose recorded value differs between manifests ``old`` and ``new``:
    (option as the command line names it, old value, new value); None when none does."""
    for key in ("preset", "models", "groups", "seeds"):
        if key in old and old[key] != new[key]:
            return OPTION_OF[key], old[key], new[key]
    old_extra, new_extra = old.get("extra"), new.get("extra") or {}
    if not isinstance(old_extra, dict):
        return None
    flat_old = {**{k: v for k, v in old_extra.items() if k != "task"}, **(old_extra.get("task") or {})}
    flat_new = {**{k: v for k, v in new_extra.items() if k != "task"}, **(new_extra.get("task") or {})}
    for key in sorted(set(flat_old) | set(flat_new)):
        if flat_old.get(key) != flat_new.get(key):
            return OPTION_OF.get(key, f"option {key!r}"), flat_old.get(key), flat_new.get(key)
    return None


def check_same_runs(root: Path, study: Study, options: StudyOptions, extra: StudyExtra, specs: list[Spec],
                    note: bool = False) -> None:
    """Refuse a rerun into a study folder whose manifest records runs that ``specs`` lack
    (other options): it would replace that study's dataset and manifest and orphan those
    runs.  One line naming the option that differs, with both values.  The same runs
    (asked in other words too: ``--models all`` or the list) are a resume; more runs (more
    seeds, models, groups) extend the study (with ``note``, one ``note:`` line says so);
    another analysis preset only redoes the analyses.  A folder without a readable manifest
    has nothing to keep."""
    try:
        old = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(old, dict) or not isinstance(old.get("run_ids"), list):
        return
    kept, new = set(map(str, old["run_ids"])), {s.spec_hash() for s in specs}
    if kept <= new:  # the same runs (a resume), or more (an extension): every earlier run stays in the dataset
        if note and new - kept and kept:
            _say(NullProgress(), f"note: {root} holds a study of {len(kept)} runs; these options add "
                                 f"{len(new - kept)} runs to it")
        return
    diff = _first_difference(old, _options_record(options, extra))
    what = (f"was run with {diff[0]} {_said(diff[1])}, this run asks {diff[0]} {_said(diff[2])}" if diff is not None
            else "holds other runs than these options make (written by another dynlab version?)")
    raise DynlabInputError(f"--out {root} {what}: rerunning would replace its dataset and manifest; allowed: the "
                           "same options (resumes the study), or another --out")


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and those of its parents that do not exist yet, deepest first."""
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove the ``folders`` (deepest first) that are still empty (never a folder that
    holds anything, e.g. a run a concurrent study saved meanwhile)."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _load_manifest(path: Path) -> dict:
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
    from dynlab.study import collapse_repeats

    kept, counts = collapse_repeats(tuple(manifest["run_ids"]))
    if counts:
        said = " and ".join(f"{rid} {n} times" for rid, n in counts.items())
        _say(NullProgress(), f"note: study manifest {mpath} lists run {said}; each is used once")
    return {**manifest, "run_ids": list(kept)}


def _check_manifest_runs(path: Path, study: Study, options: StudyOptions, run_ids: list[str]) -> None:
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
                               f"models, groups, seeds, extra) do not match its runs ({which}); allowed: the manifest "
                               f"the study wrote (rerun `dynlab study {study.name}` with the runs' options)")


def _spec_of(store: RunStore, run_id: str, study: Study) -> Spec | None:
    """The spec of run ``run_id`` as its ``spec.json`` says, or None when it does not read
    (the damage check that follows reports that)."""
    try:
        return load_spec(store.load_spec_json(run_id), study.spec_type)
    except (OSError, ValueError):
        return None


def _probe_study_files(path: Path, run_ids: list[str]) -> None:
    """Refuse, before any analysis runs, a study folder whose files analyze rewrites
    cannot be written or replaced (``dataset.nc``, ``manifest.json``, each run's
    ``analysis.nc`` and ``checksums.json``): probed by :func:`dynlab.outputs.probe_file`
    (an immutable file, a read-only folder), one line naming the file."""
    from dynlab.outputs import probe_file

    targets = [path / DATASET, path / MANIFEST]
    for rid in run_ids:
        folder = run_folder(path, rid)  # the id checked; a link is refused, never probed through
        if folder.is_dir():
            targets += [folder / "analysis.nc", folder / "checksums.json"]
    for target in targets:
        problem = probe_file(target)
        if problem is not None:
            raise DynlabInputError(f"cannot analyse the study: {target} {problem}; allowed: a study folder whose "
                                   "files can be rewritten")


def _manifest_specs(path: Path, manifest: dict, study: Study, store: RunStore) -> list[Spec]:
    """The specs of the manifest's runs, read from their ``spec.json`` (:func:`load_spec`)
    after the damage check of run_study (a damaged run needs training: an error)."""
    redo = []
    for rid in manifest["run_ids"]:
        healed = store.heal(rid)
        if healed is not None and healed[0].core:
            redo.append(healed)
        elif healed is not None:  # its analyses only: said in one line, as a study says it, and recomputed
            damage, dest = healed
            _say(NullProgress(), f"run {damage.run_id} damaged ({damage.why}); moved to {dest}; recomputing its analyses")
    if redo:
        (first, dest), more = redo[0], f" and {len(redo) - 1} more" if len(redo) > 1 else ""
        raise DynlabInputError(
            f"study {path}: run {first.run_id} damaged ({first.why}), moved to {dest}{more}; "
            f"rerun `dynlab study {manifest['study']}` with the same options to train it again"
        )
    specs = []
    for rid in manifest["run_ids"]:
        try:
            text = store.load_spec_json(rid)
        except OSError:
            raise DynlabInputError(f"study {path}: run {rid} is missing; rerun the study to finish it") from None
        try:
            specs.append(load_spec(text, study.spec_type))
        except ValueError as exc:
            raise DynlabInputError(f"study {path}: broken spec.json of run {rid} ({exc})") from None
    return specs


def _manifest_options(path: Path, manifest: dict) -> StudyOptions:
    """The study options a manifest records; a one-line :class:`DynlabInputError` naming
    the field when one has the wrong type (``models``/``groups``: a list of names or null,
    ``seeds``: a list of integers ≥ 0 or null, ``extra``: a mapping or null)."""

    def listed(key: str, kind: type, what: str) -> tuple | None:
        value = manifest.get(key)
        if value is None:
            return None
        ok = isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        if not ok or (kind is int and any(v < 0 for v in value)):
            raise DynlabInputError(f"broken study manifest {path / MANIFEST}: {key!r} is {value!r}; allowed: {what} or null")
        return tuple(value)

    extra = manifest.get("extra")
    if extra is not None and not isinstance(extra, dict):
        raise DynlabInputError(f"broken study manifest {path / MANIFEST}: 'extra' is {extra!r}; allowed: a mapping or null")
    return StudyOptions(
        preset=manifest["preset"],
        models=listed("models", str, "a list of names") or None,
        groups=listed("groups", str, "a list of names") or None,
        seeds=listed("seeds", int, "a list of integers >= 0"),
        extra=extra or {},
    )


def analyze_study(
    path: str | Path, get_study: Callable[[str], Study], device: str = "auto", progress: bool = False
) -> Path:
    """Recompute the analyses of an existing study folder without retraining.

    ``get_study`` maps the study name in the folder's manifest to its :class:`Study`
    (``dynlab.studies.get_study``; passed in so the library does not import studies).
    The options are the manifest's; a manifest written before the options were recorded
    gets the preset's defaults (e.g. its analysis preset), and is rewritten with them.

    The manifest's options and ``device`` are checked before anything on disk changes:
    a broken manifest or an unknown device is a one-line :class:`DynlabInputError` that
    leaves every run folder as it was (damaged runs are quarantined only after that).
    """
    started = time.perf_counter()
    path = Path(path)
    manifest = _load_manifest(path)
    study = get_study(manifest["study"])
    options = study.prepared(_manifest_options(path, manifest))
    study.check_preset(options.preset)
    extra = study.parse_options(options)
    resolve_device(device)
    check_study_folder(path, study.name)  # someone else's folder: refused before any write
    _check_manifest_runs(path, study, options, manifest["run_ids"])
    store = RunStore(path)
    check_analyses_fit(study, [_spec_of(store, rid, study) for rid in manifest["run_ids"]], analyze=True)
    _probe_study_files(path, manifest["run_ids"])
    with study_lock(path):
        claim(path, study.name)  # a folder from before the marker: adopted
        specs = _manifest_specs(path, manifest, study, store)  # heals (quarantines) damaged runs
        with make_progress(progress) as prog:
            counts = _run_specs(study, specs, store, device, prog, analyze=True, force_analysis=True, extra=extra)
            prog.log(phase_line(study.name, counts["train_s"], counts["analysis_s"]))
        timing = {"started": started, "trained": counts["trained"], "workers": 1, "invocation": "analyze",
                  "train_s": counts["train_s"], "analysis_s": counts["analysis_s"]}
        return _finish(study, specs, store, options, extra, timing)


def draw_study_figures(study_dir: str | Path, out_dir: Path, studies: Mapping[str, Study]) -> Any:
    """Draw every panel of the study dataset at ``study_dir`` into ``out_dir`` (made when
    missing) with its study's panels (``studies``: name -> Study, as
    ``dynlab.studies.STUDIES``); the :func:`dynlab.figures.write_figures` result.  A dataset
    of a study without figures, or a folder that cannot be made, is one line of bad input."""
    from dynlab.figures import write_figures

    ds = open_study(study_dir)
    name = str(ds.attrs.get("study", ""))
    study = studies.get(name)
    if study is None or study.panels is None:
        drawable = ", ".join(n for n, s in studies.items() if s.panels is not None)
        raise DynlabInputError(f"{study_dir} holds a dataset of study {name!r}, which has no figures; "
                               f"allowed: a dataset of {drawable}")
    from dynlab.results.folder import FIGURES_MARKER, claim_owned_folder

    try:
        claim_owned_folder(out_dir, FIGURES_MARKER)  # the marker first: a later `figures --out` knows the folder
    except OSError as exc:
        raise DynlabInputError(f"--out {out_dir} cannot be made ({exc.strerror or exc}); allowed: a writable folder") from None
    return write_figures(ds, out_dir, study.panels)
