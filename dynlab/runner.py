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
from collections.abc import Callable
from pathlib import Path

import xarray as xr

from dynlab.config import Spec
from dynlab.errors import DynlabInputError
from dynlab.executors import Executor, InProcessExecutor
from dynlab.results.schema import annotate, open_dataset, provenance_attrs, write_dataset
from dynlab.results.store import RunStore, atomic_write_text
from dynlab.study import EVALUATED_STATUSES, Study, StudyOptions
from dynlab.train.device import resolve_device
from dynlab.train.engine import train_threads
from dynlab.train.progress import NullProgress, make_progress

__all__ = ["analyze_study", "open_study", "run_study", "study_dir"]

DATASET = "dataset.nc"
MANIFEST = "manifest.json"
ANALYSIS = "analysis.nc"


def study_dir(out: str | Path, study: Study) -> Path:
    return Path(out) / study.name


def _run_specs(
    study: Study,
    specs: list[Spec],
    store: RunStore,
    device,
    progress: NullProgress,
    analyze: bool,
    executor: Executor | None = None,
    force_analysis: bool = False,
) -> dict[str, int]:
    counts = {"trained": 0, "reused": 0, "analyzed": 0, "failed": 0, "not_learned": 0}
    executor = executor or InProcessExecutor()
    for spec in specs:  # one damage check per run; damaged runs are moved aside and redone
        healed = store.heal(spec.spec_hash())
        if healed is not None:
            damage, dest = healed
            then = "training it again" if damage.core else "recomputing its analyses"
            _say(progress, f"run {damage.run_id} damaged ({damage.why}); moved to {dest}; {then}")
    pending = [s for s in specs if not store.is_done(s, check=False)]
    counts["reused"] = len(specs) - len(pending)
    bar = progress.add(f"{study.name}: runs", len(specs))
    progress.update(bar, counts["reused"])

    # Work shipped to other processes must not carry the client's progress bars.
    work_progress = NullProgress() if getattr(executor, "remote", False) else progress

    def work(item: list[Spec]) -> list:
        # The device is resolved where the work runs (a GPU worker of a CPU-only client);
        # the thread count is fixed (RUN_THREADS), not taken from the worker's machine.
        t0 = time.perf_counter()
        dev = resolve_device(device)
        with train_threads(dev):
            outcomes = study.run_item(item, dev, work_progress)
        for o in outcomes:
            o.result.setdefault("wall_time_s", (time.perf_counter() - t0) / len(item))
        return outcomes

    analyze = analyze and study.analyze_one is not None
    local_device = resolve_device(device) if analyze else None
    analysed: set[str] = set()

    def analyse(spec: Spec) -> None:
        with train_threads(local_device):  # same numbers whatever this machine's core count
            ds = study.analyze_one(spec, store, local_device, progress)
        store.write_dataset(spec, ANALYSIS, ds)
        counts["analyzed"] += 1
        analysed.add(spec.spec_hash())

    # With workers in other processes the analyses of finished runs run here while the
    # workers train the next ones (the same calls per run, so the same numbers).  Not with
    # workers that are threads of this process: model initialisation forks torch's global
    # RNG, which an analysis here would reseed under a training thread.
    overlap = analyze and getattr(executor, "remote", False) and not getattr(executor, "shares_process", False)
    for item, outcomes in executor.map_unordered(work, study.work_items(pending)):
        for spec, outcome in zip(item, outcomes):
            store.save(spec, outcome.result, outcome.state_dict)
            counts["trained"] += 1
            progress.update(bar, 1)
        for spec, outcome in zip(item, outcomes):
            if overlap and outcome.result.get("status") in EVALUATED_STATUSES:
                analyse(spec)
    to_analyze = []
    for spec in specs:
        result = store.load_result(spec)
        status = result.get("status")
        if status == "not-learned":  # evaluated and analysed like ok runs; the study says how it counts them
            counts["not_learned"] += 1
            progress.log(f"run {spec.spec_hash()} not-learned: {result.get('reason', '')}")
        elif status != "ok":
            counts["failed"] += 1
            progress.log(f"run {spec.spec_hash()} {status}: {result.get('reason', '')}")
            continue
        if spec.spec_hash() in analysed:
            continue
        if analyze and (force_analysis or not store.has_file(spec, ANALYSIS)):
            to_analyze.append(spec)
    if to_analyze:
        abar = progress.add(f"{study.name}: analyses", len(to_analyze))
        for spec in to_analyze:
            analyse(spec)
            progress.update(abar, 1)
    return counts


def _say(progress: NullProgress, message: str) -> None:
    """One line for the user: through the progress display when there is one, else on stderr."""
    if type(progress) is NullProgress:
        print(message, file=sys.stderr)
    else:
        progress.log(message)


def _finish(study: Study, specs: list[Spec], store: RunStore, options: StudyOptions) -> Path:
    ds = study.assemble(specs, store, options)
    annotate(ds)
    ds.attrs.update(provenance_attrs(study.name, options.preset, specs))
    path = write_dataset(ds, store.root / DATASET)
    manifest = {
        "study": study.name,
        "preset": options.preset,
        "models": list(options.models) if options.models else None,
        "groups": list(options.groups) if options.groups else None,
        "seeds": list(options.seeds) if options.seeds is not None else None,
        "extra": dict(options.extra),
        "run_ids": [s.spec_hash() for s in specs],
    }
    atomic_write_text(store.root / MANIFEST, lambda: json.dumps(manifest, indent=1))
    return path


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
    ``manifest.json``.  ``executor`` decides where work items run (default: in
    process); results are saved here, one run at a time, as they arrive.
    """
    study.check_preset(options.preset)
    specs = study.make_specs(options)  # validates everything before anything is written
    if not getattr(executor, "remote", False):
        resolve_device(device)  # refuse an unknown or unavailable device before writing
    store = RunStore(study_dir(out, study))
    try:
        store.runs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DynlabInputError(f"cannot write the study to {store.root} ({exc.strerror or exc}); allowed: a writable folder") from None
    with make_progress(progress) as prog:
        counts = _run_specs(study, specs, store, device, prog, analyze, executor)
        prog.log(
            f"{study.name}: {counts['trained']} trained, {counts['reused']} reused, "
            f"{counts['analyzed']} analysed, {counts['not_learned']} not learned, {counts['failed']} failed"
        )
    return _finish(study, specs, store, options)


def _load_manifest(path: Path) -> dict:
    mpath = path / MANIFEST
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise DynlabInputError(f"{path} is not a dynlab study folder (no {MANIFEST}); run `dynlab study ...` first") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise DynlabInputError(f"unreadable study manifest {mpath} ({exc})") from None
    ok = (
        isinstance(manifest, dict)
        and isinstance(manifest.get("study"), str)
        and isinstance(manifest.get("preset"), str)
        and isinstance(manifest.get("run_ids"), list)
        and all(isinstance(r, str) for r in manifest["run_ids"])
    )
    if not ok:
        raise DynlabInputError(f"broken study manifest {mpath}: needs 'study', 'preset' and a list of 'run_ids'")
    return manifest


def analyze_study(
    path: str | Path, get_study: Callable[[str], Study], device: str = "auto", progress: bool = False
) -> Path:
    """Recompute the analyses of an existing study folder without retraining.

    ``get_study`` maps the study name in the folder's manifest to its :class:`Study`
    (``dynlab.studies.get_study``; passed in so the library does not import studies).
    """
    path = Path(path)
    manifest = _load_manifest(path)
    study = get_study(manifest["study"])
    store = RunStore(path)
    redo = []
    for rid in manifest["run_ids"]:  # the damage check of run_study; damaged runs need training
        healed = store.heal(rid)
        if healed is not None and healed[0].core:
            redo.append(healed)
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
            specs.append(study.spec_type.model_validate(json.loads(text)["fields"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise DynlabInputError(f"study {path}: broken spec.json of run {rid} ({type(exc).__name__})") from None
    options = StudyOptions(
        preset=manifest["preset"],
        models=tuple(manifest["models"]) if manifest.get("models") else None,
        groups=tuple(manifest["groups"]) if manifest.get("groups") else None,
        seeds=tuple(manifest["seeds"]) if manifest.get("seeds") is not None else None,
        extra=manifest.get("extra") or {},
    )
    with make_progress(progress) as prog:  # _run_specs refuses a bad device before writing
        _run_specs(study, specs, store, device, prog, analyze=True, force_analysis=True)
    return _finish(study, specs, store, options)


def open_study(path: str | Path) -> xr.Dataset:
    """Open a study's dataset: ``path`` is the study folder or the ``.nc`` file itself."""
    p = Path(path)
    if p.is_dir():
        p = p / DATASET
    if not p.is_file():
        raise DynlabInputError(f"no study dataset at {p}; run `dynlab study NAME --out DIR` first")
    try:
        return open_dataset(p)
    except (OSError, ValueError) as exc:
        raise DynlabInputError(f"unreadable study dataset {p} ({type(exc).__name__}: {exc})".splitlines()[0]) from None
