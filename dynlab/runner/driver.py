"""Run a study's specs: skip finished runs, never lose one, write the study dataset.

``run_study`` is what ``dynlab study NAME`` calls.  Everything is validated before the
first file is written.  Each finished run is stored atomically (see
:mod:`dynlab.results.store`), so a study killed at any point resumes where it stopped
without redoing finished runs.  A diverged run is stored with its status and reason and
the study goes on.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dynlab.spec import Spec
from dynlab.errors import (DynlabInputError, DynlabStoppedError, format_validation_error, in_option_words,
                           stopping_after_changes)
from dynlab.executors import Executor, InProcessExecutor, runs_here
from dynlab.manifest import (MANIFEST, check_manifest_runs, check_runs_present, check_same_runs, load_manifest,
                             manifest_options, manifest_specs, options_record, probe_study_files, spec_of)
from dynlab.results.schema import DATASET, annotate, provenance_attrs, write_dataset
from dynlab.results.schema import open_dataset as open_study  # the public name: dynlab.open_study
from dynlab.results.files import make_dir, missing_folders, remove_empty_folders, write_text_atomic
from dynlab.results.provenance import provenance
from dynlab.results.folder import LOCK, MARKER, check_study_folder, claim, study_lock
from dynlab.results.store import RunStore
from dynlab.runner.loop import RunLoop, phase_line, result_check, run_specs
from dynlab.runner.protocol import Study, StudyExtra, StudyOptions
from dynlab.runtime import NullProgress, make_progress, resolve_device

__all__ = ["analyze_study", "check_analyses_fit", "check_work_items", "open_study", "run_study", "study_dir"]


def study_dir(out: str | Path, study: Study) -> Path:
    """The folder of ``study`` under ``out`` (``~`` expanded, as the checks of the folder read it)."""
    return Path(out).expanduser() / study.name


def check_analyses_fit(study: Study, specs: list[Spec], analyze: bool) -> None:
    """Refuse, before anything runs, a study whose per-run analyses cannot be done for
    ``specs`` (the study's :attr:`~dynlab.runner.protocol.Study.check_analyses`, one line)."""
    if analyze and study.analyze_one is not None and study.check_analyses is not None:
        study.check_analyses(study.name, specs)



def check_work_items(study: Study, specs: list[Spec]) -> None:
    """Refuse, before anything runs, a study whose work items (specs run at once: a stack,
    :meth:`~dynlab.runner.protocol.Study.work_items`) cannot run together (their spec class's
    :meth:`~dynlab.spec.Spec.check_work_item`, one line)."""
    for item in study.work_items(specs):
        type(item[0]).check_work_item(item)  # Spec's: no check; a spec class with one overrides it


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
      and analysing (:class:`dynlab.runner.loop.RunLoop`), measured in the same invocation, so their ratio
      compares the two phases on one machine under one load (with Dask workers in other
      processes the analyses run while the workers train: the phases overlap, and
      ``study_train_s`` is the wall time until the last trained run arrived).
    """
    attrs = {"study_wall_time_s": round(float(time.perf_counter() - started), 3),
             "study_runs_trained": int(trained), "study_invocation": invocation}
    if workers is not None:
        attrs["study_workers"] = int(workers)
    for name, seconds in (("study_train_s", train_s), ("study_analysis_s", analysis_s)):
        if seconds is not None:
            attrs[name] = round(float(seconds), 3)
    return attrs


def _finish(study: Study, specs: list[Spec], store: RunStore, options: StudyOptions, extra: StudyExtra,
            timing: dict | None = None, run_ids: list[str] | None = None) -> Path:
    """Assemble and write the study dataset of ``specs`` and the manifest; the manifest
    records the study's options as parsed (``extra``: preset-dependent choices such as the
    analysis preset written out), so ``dynlab analyze`` reuses them, and its runs
    (``run_ids``; None: those of ``specs``; ``dynlab analyze`` keeps the runs it left out
    of the dataset).  ``timing``: the arguments of
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
    ids = [s.spec_hash() for s in specs] if run_ids is None else list(run_ids)
    manifest = {"study": study.name, **options_record(options, extra), "run_ids": ids, "provenance": made}
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


def _checked_specs(study: Study, options: StudyOptions, words: Mapping[str, str] | None = None) -> list[Spec]:
    """``study.make_specs(options)``; a value its specs refuse (e.g. ``extra={"train":
    {"steps": -3}}`` from the Python API) is one :class:`DynlabInputError` line naming the
    field and why, not pydantic's own error; with ``words`` (field -> the option that sets
    it), as that option (:func:`dynlab.errors.in_option_words`: the command line's wording)."""
    from pydantic import ValidationError

    if words is not None:
        with in_option_words(words):
            return study.make_specs(options)
    try:
        return study.make_specs(options)
    except ValidationError as exc:
        raise DynlabInputError(f"invalid {exc.title}: {format_validation_error(exc)}") from None


def check_kernel_backend() -> None:
    """Refuse a kernel backend ``DYNLAB_KERNEL_BACKEND`` forces that this machine cannot run
    (:func:`dynlab.kernels.dispatch.forced_backend_problem`), before anything is written."""
    from dynlab.kernels.dispatch import forced_backend_problem

    problem = forced_backend_problem()
    if problem is not None:
        raise DynlabInputError(problem)


def run_study(
    study: Study,
    options: StudyOptions,
    out: str | Path = "dynlab-runs",
    device: str = "auto",
    progress: bool = False,
    analyze: bool = True,
    executor: Executor | Callable[[], Executor] | None = None,
    words: Mapping[str, str] | None = None,
) -> Path:
    """Train, evaluate (and analyse) every spec of ``study``; return the dataset path.

    The study folder is ``out/<study name>``; it holds ``runs/``, ``dataset.nc`` and
    ``manifest.json``.  The dataset records this invocation's wall time, runs trained and
    workers (:func:`_timing_attrs`).  Each run's ``result.json``, each ``analysis.nc``, the dataset
    (attr ``provenance_json``) and the manifest (``provenance``) record the execution path
    (:mod:`dynlab.results.provenance`).  ``executor`` decides where work items run: an
    executor, or a function that starts one (``make_executor``), called once every spec and the
    folder are checked, so a refusal starts no cluster; default: in process.  Results are saved
    here, one run at a time, as they arrive.  ``words``: :func:`_checked_specs`'s.  A study that
    fails before it stored anything removes the folders it made (a failed run is stored
    as such; a crash, e.g. out of memory in the first run, leaves no empty ``runs/``).
    Bad input found only after runs were stored or moved to quarantine is a
    :class:`~dynlab.errors.DynlabStoppedError` (exit code 1: something was written).
    """
    started = time.perf_counter()
    options = study.prepared(options)  # the study's reading of the selections (e.g. names in canonical spelling)
    study.check_preset(options.preset)
    extra = study.parse_options(options)  # an unknown option is refused in every study
    specs = _checked_specs(study, options, words)  # validates everything before anything is written
    check_analyses_fit(study, specs, analyze)
    check_work_items(study, specs)  # and what runs together (a stack's memory)
    store = RunStore(study_dir(out, study), check_result=result_check(study))  # a result the study cannot use is damage
    check_study_folder(store.root, study.name, flag="--out")  # someone else's folder: refused before any write
    check_same_runs(store.root, study, options, extra, specs)
    with _started(executor) as ex:
        workers = _executor_workers(ex)
        if runs_here(ex):  # resolved once, here: the work and the analyses run in this process
            device = resolve_device(device)  # an unknown or unavailable device is refused before writing
            check_kernel_backend()  # and a kernel backend this machine cannot run
        made = missing_folders(store.runs)
        # the folder is made and locked in one step (another process's clean-up cannot take it
        # away in between); refused here, this process removes nothing: the folder is the other one's
        with study_lock(store.root, flag="--out", make=True):
            try:
                with stopping_after_changes(f"the study stopped after it had changed {store.root} (its stored runs are "
                                            "kept: the same command resumes)", lambda: store.changed):
                    _claim(study, options, extra, specs, store)
                    with make_progress(progress) as prog:  # heal, train where ex runs, store, analyse
                        loop = RunLoop(study, specs, store, device, prog, analyze, ex, extra=extra)
                        for item, result in ex.map_unordered(loop.work, loop.items()):
                            loop.arrived(item, result)
                        counts = loop.finish()
                        _say_counts(prog, study.name, counts)
                    timing = {"started": started, "trained": counts["trained"], "workers": workers,
                              "invocation": "study", "train_s": counts["train_s"], "analysis_s": counts["analysis_s"]}
                    return _finish(study, specs, store, options, extra, timing)
            except BaseException:  # cleaned up while the lock is held: after it, the folder may be another process's
                if store.root in made:  # a study that stored nothing leaves no folders behind (nor its marker and lock)
                    _remove_own_files(store.root)
                remove_empty_folders(made)
                raise


@contextmanager
def _started(executor: Executor | Callable[[], Executor] | None) -> Iterator[Executor]:
    """The executor :func:`run_study` runs on: ``executor`` itself when it is one (its caller
    closes it), else the one that ``executor`` (a function or a class; default: the in-process
    executor) makes, closed (when it can be) as the study ends, however it ends."""
    if executor is None:
        executor = InProcessExecutor
    if hasattr(executor, "map_unordered") and not inspect.isclass(executor):
        yield executor
        return
    ex = executor()
    try:
        yield ex
    finally:
        close = getattr(ex, "close", None)
        if callable(close):
            close()


def _claim(study: Study, options: StudyOptions, extra: StudyExtra, specs: list[Spec], store: RunStore) -> None:
    """:func:`run_study` once it holds the study folder's lock: the folder's checks again
    (another process may have written meanwhile), then the marker and ``runs/``."""
    check_study_folder(store.root, study.name, flag="--out")
    check_same_runs(store.root, study, options, extra, specs, note=True)
    claim(store.root, study.name)  # the marker first
    try:
        make_dir(store.runs)
    except OSError as exc:
        raise DynlabInputError(f"cannot write the study to {store.root} ({exc.strerror or exc}); "
                               "allowed: a writable folder") from None


def _say_counts(prog: NullProgress, name: str, counts: dict[str, Any]) -> None:
    """The study's closing lines: its phases' times (when it trained or analysed anything; a
    rerun that reuses every run says the summary alone) and what became of its runs."""
    if counts["trained"] or counts["analyzed"]:
        prog.log(phase_line(name, counts["train_s"], counts["analysis_s"]))
    prog.log(f"{name}: {counts['trained']} trained, {counts['reused']} reused, {counts['analyzed']} analysed, "
             f"{counts['not_learned']} not learned, {counts['failed']} failed")


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


def analyze_study(
    path: str | Path, get_study: Callable[[str], Study], device: str = "auto", progress: bool = False
) -> Path:
    """Recompute the analyses of an existing study folder without retraining.

    ``get_study`` maps the study name in the folder's manifest to its :class:`Study`
    (``dynlab.studies.get_study``; passed in so the library does not import studies).
    The options are the manifest's; a manifest written before the options were recorded
    gets the preset's defaults (e.g. its analysis preset), and is rewritten with them.

    The manifest's options, its runs (each present in ``runs/``) and ``device`` are checked
    before anything on disk changes: a broken manifest, a missing run or an unknown device
    is a one-line :class:`DynlabInputError` that leaves every run folder as it was.  Then a
    damaged run (it would need training) is moved to ``quarantine/``, said in one line and
    left out: the dataset is written from the intact runs, so that it lists only runs that
    ``runs/`` holds; the manifest keeps every run, so that rerunning the study trains it
    again.  When no intact run is left, the dataset (which listed them) is removed and a
    :class:`~dynlab.errors.DynlabStoppedError` says so (exit code 1); bad input found once
    the folder began to change is one too (:func:`~dynlab.errors.stopping_after_changes`).
    """
    started = time.perf_counter()
    path = Path(path)
    manifest = load_manifest(path)
    study = get_study(manifest["study"])
    options = study.prepared(manifest_options(path, manifest, study))
    study.check_preset(options.preset)
    extra = study.parse_options(options)
    device = resolve_device(device)  # once: the analyses run in this process
    check_kernel_backend()
    check_study_folder(path, study.name)  # someone else's folder: refused before any write
    check_manifest_runs(path, study, options, manifest["run_ids"])
    store = RunStore(path, check_result=result_check(study))
    check_analyses_fit(study, [spec_of(store, rid, study) for rid in manifest["run_ids"]], analyze=True)
    check_runs_present(path, manifest)
    probe_study_files(path, manifest["run_ids"])
    changed = f"dynlab analyze stopped after it had changed {path} (runs moved to quarantine/ stay there)"
    with study_lock(path), stopping_after_changes(changed, lambda: store.changed):
        specs = manifest_specs(path, manifest, study, store)  # heals (quarantines and leaves out) damaged runs
        if not specs:  # every run went to quarantine: no dataset can list them
            (path / DATASET).unlink(missing_ok=True)
            raise DynlabStoppedError(f"study {path}: every run was damaged and moved to {path / 'quarantine'}; its "
                                     f"{DATASET} (which listed them) was removed; rerun `dynlab study {study.name}` "
                                     "with the same options to train them again")
        with make_progress(progress) as prog:
            counts = run_specs(study, specs, store, device, prog, analyze=True, force_analysis=True, extra=extra)
            prog.log(phase_line(study.name, counts["train_s"], counts["analysis_s"]))
        timing = {"started": started, "trained": counts["trained"], "workers": 1, "invocation": "analyze",
                  "train_s": counts["train_s"], "analysis_s": counts["analysis_s"]}
        return _finish(study, specs, store, options, extra, timing, run_ids=manifest["run_ids"])
