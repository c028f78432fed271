"""The loop over a study's runs (:class:`RunLoop`, whose steps :func:`dynlab.runner.driver.run_study`
takes under the study's lock, and :func:`run_specs`, all of them in one call, for
:func:`dynlab.runner.driver.analyze_study`): heal damaged runs, train the unfinished ones where
the executor runs them, store each as it arrives, then analyse the evaluated runs; with the
one line per finished run and the phases' times."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xarray as xr

from dynlab.executors import Executor, InProcessExecutor, in_other_processes, runs_here
from dynlab.results.files import NETCDF_ENGINE
from dynlab.results.folder import RESUME
from dynlab.results.naming import arm_label, run_names
from dynlab.results.provenance import provenance, recording
from dynlab.results.store import ANALYSIS, RunStore
from dynlab.runtime import NullProgress, resolve_device, say, train_threads
from dynlab.spec import Spec
from dynlab.runner.protocol import RunOutcome, Study, StudyExtra, parse_result

__all__ = ["ANALYSIS", "RunLoop", "phase_line", "result_check", "run_specs"]


#: The folder of a study where long runs keep their training state while they train
#: (:attr:`dynlab.runner.protocol.Study.resumable`); a file there is removed when its runs finish.
RESUME_DIR = RESUME


def result_check(study: Study) -> Callable[[dict[str, Any]], str | None]:
    """What is wrong with a stored ``result.json`` (parsed) for ``study``, or None: it must
    fit the study's ``result_type`` and, for an evaluated run, hold every field the study's
    dataset is made of (the result type's ``missing_fields()``, where it has one).  The
    store treats a result that does not as damage of its run (:class:`RunStore`)."""
    def check(raw: dict[str, Any]) -> str | None:
        result, why = parse_result(study.result_type, raw)
        if result is None:
            return why
        missing = getattr(result, "missing_fields", None)
        lacking = list(missing()) if callable(missing) else []
        if lacking:
            more = f" and {len(lacking) - 3} more" if len(lacking) > 3 else ""
            return f"lacks what a {result.status} run holds ({', '.join(lacking[:3])}{more})"
        return None

    return check


def _heal(specs: list[Spec], store: RunStore, progress: NullProgress) -> set[str]:
    """One damage check per run: damaged runs (or analyses) are moved to quarantine and
    redone; each is reported in one line.  Returns the ids of the runs whose
    ``analysis.nc`` went to quarantine (alone, or with its run): their analyses are
    computed again, whether or not this invocation computes analyses otherwise, so that
    nothing a study had before is lost."""
    lost_analysis: set[str] = set()
    for spec in specs:
        folder = store.path(spec)
        had_analysis = (folder / ANALYSIS).is_file() and not (folder / ANALYSIS).is_symlink()
        healed = store.heal(spec.spec_hash())
        if healed is not None:
            damage, dest = healed
            if ANALYSIS in damage.files or (damage.core and had_analysis):
                lost_analysis.add(damage.run_id)
            say(progress, damage.report(dest))
    return lost_analysis


def _work(study: Study, device, progress: NullProgress,
          resume_dir: Path | None = None) -> Callable[[list[Spec]], tuple[list[RunOutcome], dict]]:
    """The function an executor runs on a work item: train its specs where it runs (together,
    through the study's ``stacking.run``, when there are several; else through ``run_one``; a
    ``resumable`` study's get ``resume_dir`` too); return their outcomes and the provenance of
    that work (what it ran on, recorded there)."""

    def work(item: list[Spec]) -> tuple[list[RunOutcome], dict]:
        # The device is resolved where the work runs (a GPU worker of a CPU-only client);
        # the thread count is fixed (RUN_THREADS), not taken from the worker's machine.
        t0 = time.perf_counter()
        dev = resolve_device(device)
        kw = {"resume_dir": resume_dir} if study.resumable else {}  # where its long runs keep their training state
        with recording() as rec, train_threads(dev):
            if study.stacking is not None and len(item) > 1:
                outcomes = study.stacking.run(item, dev, progress, **kw)
            else:
                outcomes = [study.run_one(s, dev, progress, **kw) for s in item]
        for o in outcomes:
            if o.result.wall_time_s is None:
                o.result.wall_time_s = (time.perf_counter() - t0) / len(item)
        return outcomes, provenance(rec, device=dev)

    return work


def _tally(study: Study, specs: list[Spec], store: RunStore, progress: NullProgress, counts: dict[str, int],
           announced: set[str] = frozenset(), named: Callable[[Spec], str] = lambda spec: "") -> list[Spec]:
    """Count (and log, unless ``announced`` holds their id; ``named``: :func:`_run_labels`'s)
    the not-learned and failed runs; return the evaluated ones."""
    evaluated = []
    for spec in specs:
        result = study.load_result(store, spec)
        said = spec.spec_hash() in announced
        if result.status == "not-learned":  # evaluated and analysed like ok runs; the study says how it counts them
            counts["not_learned"] += 1
            if not said:
                progress.log(f"run {spec.spec_hash()}{named(spec)} not-learned: {result.reason}")
        elif result.status != "ok":
            counts["failed"] += 1
            if not said:
                progress.log(f"run {spec.spec_hash()}{named(spec)} {result.status}: {result.reason}")
            continue
        evaluated.append(spec)
    return evaluated


class RunLoop:
    """One pass over the runs of ``specs``, in the steps its driver takes
    (:func:`dynlab.runner.driver.run_study`, :func:`run_specs`)::

        loop = RunLoop(study, specs, store, device, progress, analyze, executor, extra=extra)
        for item, result in executor.map_unordered(loop.work, loop.items()):
            loop.arrived(item, result)
        counts = loop.finish()

    Made, it heals damaged runs (:func:`_heal`) and finds the unfinished ones;
    :meth:`items` are their work items, :attr:`work` what the executor runs on each (where it
    runs: :func:`_work`), :meth:`arrived` stores a finished item's runs as they arrive and
    says each in one line, :meth:`finish` analyses the evaluated runs that lack an analysis
    (all of them with ``force_analysis``) and, even without ``analyze``, those whose analysis
    was damaged (a rerun must not lose what ``dynlab analyze`` made), and returns the counts.

    ``extra``: the study's parsed options, handed to ``analyze_one`` (needed when ``analyze``).
    ``device``: a ``torch.device`` (workers in other processes: the option, resolved where
    each runs). Counts: trained, reused, analyzed, failed, not_learned, and the seconds
    (``time.perf_counter``) spent training (``train_s``) and analysing (``analysis_s``).
    ``train_s`` is the wall time from :meth:`items` (the work items made, then handed out)
    to the storing of the last run. With workers in other processes the analyses of finished
    runs run here while the workers train (``overlap``): the two phases then overlap and
    ``train_s`` counts the time until the workers' last run arrived, analyses included;
    otherwise no analysis runs inside the loop and the two add up.
    """

    def __init__(self, study: Study, specs: list[Spec], store: RunStore, device, progress: NullProgress, analyze: bool,
                 executor: Executor | None = None, force_analysis: bool = False, extra: StudyExtra | None = None):
        self.study, self.specs, self.store, self.progress, self.extra = study, specs, store, progress, extra
        self.force_analysis = force_analysis
        self.counts = {"trained": 0, "reused": 0, "analyzed": 0, "failed": 0, "not_learned": 0,
                       "train_s": 0.0, "analysis_s": 0.0}
        executor = executor or InProcessExecutor()
        lost = _heal(specs, store, progress)
        # analyses lost to quarantine are made again (they need the study's options)
        self.redo = lost if study.analyze_one is not None and extra is not None else set()
        self.pending = [s for s in specs if not store.is_done(s, check=False)]
        self.counts["reused"] = len(specs) - len(self.pending)
        self.bar = progress.add(f"{study.name}: runs", len(specs))
        progress.update(self.bar, self.counts["reused"])
        self.named = _run_labels(specs)  # what names each run in the lines: its arm, the settings the study sweeps
        self.analyze = analyze and study.analyze_one is not None
        if self.analyze and extra is None:
            raise TypeError("RunLoop: analyses need the study's parsed options (extra=)")
        self.local_device = resolve_device(device) if self.analyze or self.redo else None
        self.analysed: set[str] = set()
        self.announced: set[str] = set()  # runs whose status a finished-run line has said
        # With workers in other processes the analyses of finished runs run here while the
        # workers train the next ones (the same calls per run, so the same numbers).  Not with
        # workers that are threads of this process, nor with an executor that does not say:
        # model initialisation forks torch's global RNG, which an analysis here would reseed
        # under a training thread.
        self.overlap = self.analyze and in_other_processes(executor)
        # work shipped elsewhere must not carry the client's progress bars
        self.work = _work(study, device, progress if runs_here(executor) else NullProgress(), store.root / RESUME_DIR)
        self.started = self.trained_until = time.perf_counter()  # items() starts the clock again, as training begins

    def items(self) -> list[list[Spec]]:
        """The work items of the unfinished runs; training starts now (``train_s``)."""
        self.started = self.trained_until = time.perf_counter()
        return self.study.work_items(self.pending)

    def arrived(self, item: list[Spec], result: tuple[list[RunOutcome], dict]) -> None:
        """Store the runs of a finished work item (``result``: :attr:`work`'s), one line each;
        with ``overlap``, analyse the evaluated ones now."""
        outcomes, made_on = result
        counts, done = self.counts, self.counts["reused"]
        for spec, outcome in zip(item, outcomes):
            self.store.save(spec, outcome.result.to_json(), outcome.state_dict, provenance=made_on)
            counts["trained"] += 1
            self.progress.update(self.bar, 1)
            at = counts["trained"] + done
            if self.progress.finished(_run_line(self.study, spec, self.named(spec), outcome.result, at, len(self.specs))):
                self.announced.add(spec.spec_hash())
        self.trained_until = time.perf_counter()
        for spec, outcome in zip(item, outcomes):
            if self.overlap and outcome.result.evaluated:
                self._analyse(spec)

    def finish(self) -> dict[str, Any]:
        """Training is over (the analyses after the last arrival are not training): count the
        not-learned and failed runs, analyse what lacks an analysis; the counts."""
        counts = self.counts
        counts["train_s"] = self.trained_until - self.started
        evaluated = _tally(self.study, self.specs, self.store, self.progress, counts, self.announced, self.named)
        to_analyze = [s for s in evaluated if s.spec_hash() not in self.analysed
                      and (s.spec_hash() in self.redo
                           or self.analyze and _lacks_analysis(self.store, s, self.extra, self.force_analysis))]
        if to_analyze:
            abar = self.progress.add(f"{self.study.name}: analyses", len(to_analyze))
            for i, spec in enumerate(to_analyze, 1):
                self._analyse(spec)
                self.progress.update(abar, 1)
                self.progress.finished(f"{self.study.name}: analysis {i}/{len(to_analyze)} {spec.spec_hash()}"
                                       f"{self.named(spec)} done")
        return counts

    def _analyse(self, spec: Spec) -> None:
        t0, device = time.perf_counter(), self.local_device
        with recording() as rec, train_threads(device):  # same numbers whatever this machine's core count
            ds = self.study.analyze_one(spec, self.store, device, self.progress, self.extra)
        ds.attrs["provenance_json"] = json.dumps(provenance(rec, device=device), sort_keys=True)
        self.store.write_dataset(spec, ANALYSIS, ds)
        self.counts["analyzed"] += 1
        self.analysed.add(spec.spec_hash())
        self.counts["analysis_s"] += time.perf_counter() - t0


def run_specs(study: Study, specs: list[Spec], store: RunStore, device, progress: NullProgress, analyze: bool,
              executor: Executor | None = None, force_analysis: bool = False,
              extra: StudyExtra | None = None) -> dict[str, Any]:
    """Train the unfinished runs of ``specs`` on ``executor`` (default: in this process),
    store each, analyse: the steps of a :class:`RunLoop` in one call; its counts."""
    executor = executor or InProcessExecutor()
    loop = RunLoop(study, specs, store, device, progress, analyze, executor, force_analysis, extra)
    for item, result in executor.map_unordered(loop.work, loop.items()):
        loop.arrived(item, result)
    return loop.finish()


def _lacks_analysis(store: RunStore, spec: Spec, extra: StudyExtra | None, force: bool) -> bool:
    """Whether a study that computes analyses must analyse ``spec``'s run: always with
    ``force``, else when it has no analysis or one of another analysis preset."""
    return force or not store.has_file(spec, ANALYSIS) or _other_analysis_preset(store, spec, extra)


def _run_labels(specs: list[Spec]) -> Callable[[Spec], str]:
    """Spec -> `` [its names]``, what names each of ``specs`` among them
    (:func:`dynlab.results.naming.run_names`: its arm, the settings they sweep); '' for a
    spec that nothing names."""
    _, rows = run_names([(type(s).__name__, s.hashed_fields()) for s in specs])
    labels = {s.spec_hash(): arm_label(row) for s, row in zip(specs, rows)}
    return lambda spec: f" [{labels[spec.spec_hash()]}]" if labels.get(spec.spec_hash()) else ""


def _run_line(study: Study, spec: Spec, label: str, result: Any, done: int, total: int) -> str:
    """One line about a finished run: ``group-tracking: run 3/12 1a2b3c4d5e6f7a8b [tanh-rnn, C2, seed 1] ok,
    loss 0.012, 4.2 s`` (``label``: :func:`_run_labels`'s; the status's reason when it is not ok)."""
    parts = [result.status]
    if result.train_loss is not None:
        parts.append(f"loss {result.train_loss:.4g}")
    if result.wall_time_s is not None:
        parts.append(f"{result.wall_time_s:.1f} s")
    why = f" ({result.reason})" if result.status != "ok" and result.reason else ""
    return f"{study.name}: run {done}/{total} {spec.spec_hash()}{label} {', '.join(parts)}{why}"


def _other_analysis_preset(store: RunStore, spec: Spec, extra: StudyExtra | None) -> bool:
    """True when the study's options name an analysis preset (``extra.analysis``) and the
    run's stored analysis was made with another one (attr ``analysis_preset``, missing in
    analyses written before it was recorded): that analysis is redone, so the manifest's
    preset is the one every ``analysis.nc`` of the study was made with."""
    want = getattr(extra, "analysis", None)
    if want is None:
        return False
    try:
        with xr.open_dataset(store.path(spec) / ANALYSIS, engine=NETCDF_ENGINE) as ds:
            return ds.attrs.get("analysis_preset") != want
    except Exception:  # unreadable: redo it (the store's damage check reports real damage)
        return True


def phase_line(study_name: str, train_s: float, analysis_s: float) -> str:
    """``group-tracking: training 5 min 49 s, analyses 2 min 10 s (0.37 of training)``; the
    ratio only where this invocation trained for at least a second (``dynlab analyze``
    trains nothing: its ratio would divide by the bookkeeping of reused runs) and analysed
    something (a task study's state geometry is ``dynlab analyze``'s, not the study's)."""
    def took(s: float) -> str:
        return f"{s:.1f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"

    ratio = f" ({analysis_s / train_s:.2f} of training)" if train_s >= 1.0 and analysis_s > 0 else ""
    return f"{study_name}: training {took(train_s)}, analyses {took(analysis_s)}{ratio}"
