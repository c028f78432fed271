"""Run store and runner: atomic runs, resume after a kill, reuse, failed runs recorded."""

import dataclasses
import json
import os
import time

import numpy as np
import pytest
import torch

from dynlab.tracking.spec import RunSpec
from dynlab.results import RunStore
from dynlab.results.store import STALE_AFTER_S
from dynlab.runner.driver import open_study, run_study
from dynlab.runner.protocol import RunOutcome, RunResult, Stacking, StudyOptions
from dynlab.studies import get_study

SMOKE = StudyOptions(preset="smoke", models=("tanh-rnn", "linear-rnn"), extra={"groups": ("C2", "S3")})


class Killed(BaseException):
    """Stands in for SIGKILL/KeyboardInterrupt in the middle of a study."""


def _counting_study(kill_at: int | None = None):
    base = get_study("group-tracking")
    calls = []

    def run_one(spec, device, progress):
        if kill_at is not None and len(calls) == kill_at:
            raise Killed()
        calls.append(spec.spec_hash())
        return base.run_one(spec, device, progress)

    return dataclasses.replace(base, run_one=run_one, analyze_one=None), calls


@pytest.mark.slow
def test_killed_study_resumes_without_redoing_finished_runs(tmp_path):
    study, calls = _counting_study(kill_at=2)
    with pytest.raises(Killed):
        run_study(study, SMOKE, out=tmp_path, device="cpu", analyze=False)
    store = RunStore(tmp_path / "group-tracking")
    specs = study.make_specs(SMOKE)
    assert [store.is_done(s) for s in specs] == [True, True, False, False]
    assert not (tmp_path / "group-tracking" / "dataset.nc").exists()
    first_two = list(calls)

    study2, calls2 = _counting_study()
    path = run_study(study2, SMOKE, out=tmp_path, device="cpu", analyze=False)
    assert calls2 == [s.spec_hash() for s in specs[2:]]  # only the unfinished runs
    assert set(first_two).isdisjoint(calls2)
    ds = open_study(path)
    assert list(ds.run_id.values) == [s.spec_hash() for s in specs]

    # a third invocation trains nothing and yields the same results
    study3, calls3 = _counting_study()
    ds3 = open_study(run_study(study3, SMOKE, out=tmp_path, device="cpu", analyze=False))
    assert calls3 == []
    np.testing.assert_array_equal(ds3.accuracy.values, ds.accuracy.values)


def test_run_folder_contents_and_weights_round_trip(tmp_path):
    study = get_study("group-tracking")
    path = run_study(study, StudyOptions(preset="smoke", models=("mamba",), extra={"groups": ("C6",)}), out=tmp_path, device="cpu", analyze=False)
    spec = study.make_specs(StudyOptions(preset="smoke", models=("mamba",), extra={"groups": ("C6",)}))[0]
    store = RunStore(path.parent)
    run = store.path(spec)
    assert sorted(p.name for p in run.iterdir()) == ["checksums.json", "model.safetensors", "result.json", "spec.json"]
    assert RunSpec.model_validate(json.loads((run / "spec.json").read_text())["fields"]) == spec
    from dynlab.studies.group_tracking import load_model

    model = load_model(spec, store, torch.device("cpu"))
    ds = open_study(path)
    # re-evaluating the reloaded weights reproduces the stored accuracy
    from dynlab.tracking.evaluate import evaluate_lengths
    from dynlab.tracking.groups import get_group
    from dynlab.tracking.task import WordProblem

    ev = spec.eval
    le = evaluate_lengths(model, WordProblem(get_group("C6")), ev.lengths, ev.n_samples, ev.batch_size, ev.chunk, spec.seed + ev.seed_offset)
    np.testing.assert_array_equal(le.acc_final, ds.accuracy.sel(run=0).values)


def test_stale_temporary_folders_are_removed_and_never_count(tmp_path):
    study = get_study("group-tracking")
    spec = study.make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",)}))[0]
    store = RunStore(tmp_path)
    stale = store.runs / f".tmp-{spec.spec_hash()}-dead"
    stale.mkdir(parents=True)
    (stale / "result.json").write_text("{}")
    live = store.runs / ".tmp-other-writer"  # a concurrent writer's folder: young, kept
    live.mkdir()
    old = time.time() - 2 * STALE_AFTER_S
    os.utime(stale, (old, old))
    assert not store.is_done(spec)
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    assert store.is_done(spec) and not stale.exists() and live.exists()


def test_kill_during_save_leaves_no_finished_run(tmp_path, monkeypatch):
    """A crash while the weights are written: the run is not done and nothing is half-made."""
    import dynlab.results.store as store_mod

    study = get_study("group-tracking")
    spec = study.make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",)}))[0]
    store = RunStore(tmp_path)

    write = store_mod.write_bytes_new

    def dying_write(path, data):
        if path.name == "model.safetensors":
            raise Killed()
        write(path, data)

    monkeypatch.setattr(store_mod, "write_bytes_new", dying_write)
    with pytest.raises(Killed):
        store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    assert not store.is_done(spec) and not store.path(spec).exists()
    assert list(store.runs.iterdir()) == []


def test_broken_checkpoint_gives_clear_error(tmp_path):
    study = get_study("group-tracking")
    spec = study.make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",)}))[0]
    store = RunStore(tmp_path)
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    (store.path(spec) / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="broken checkpoint"):
        store.load_state_dict(spec)
    (store.path(spec) / "result.json").write_text("{truncated")
    with pytest.raises(ValueError, match="unreadable result"):
        store.load_result(spec)


def test_diverged_run_is_recorded_and_study_goes_on(tmp_path):
    base = get_study("group-tracking")

    def run_one(spec, device, progress):
        if spec.model.arch == "linear-rnn":
            return RunOutcome(RunResult(status="diverged", reason="non-finite loss at step 3"), None)
        return base.run_one(spec, device, progress)

    study = dataclasses.replace(base, run_one=run_one, analyze_one=None)
    ds = open_study(run_study(study, SMOKE, out=tmp_path, device="cpu", analyze=False))
    # smoke runs (20 steps) never reach the training length: evaluated, not learned
    assert list(ds.status.values) == ["not-learned", "diverged", "not-learned", "diverged"]
    assert np.isnan(ds.accuracy.sel(run=1)).all() and np.isfinite(ds.accuracy.sel(run=0)).all()
    assert "non-finite" in str(ds.reason.values[1])


def test_dataset_vocabulary_units_and_provenance(tmp_path):
    ds = open_study(run_study(get_study("group-tracking"), SMOKE, out=tmp_path, device="cpu", analyze=False))
    for name in ("accuracy", "accuracy_all", "mp", "curriculum_length"):
        assert ds[name].attrs["long_name"] and "units" in ds[name].attrs
    for coord in ("arch", "family", "group", "seed", "hidden", "nonlinearity"):
        assert ds[coord].dims == ("run",)
    assert ds.accuracy.dims == ("run", "length")
    assert ds.attrs["study"] == "group-tracking" and ds.attrs["dynlab_version"]
    from dynlab.results.vocabulary import check_dataset

    assert check_dataset(ds) == []  # every variable is in the one vocabulary, with its units
    specs = json.loads(ds.attrs["specs_json"])
    assert [RunSpec.model_validate(s["fields"]).spec_hash() for s in specs] == list(ds.run_id.values)
    # mp is consistent with the accuracy table and the stored threshold
    from dynlab.tracking.evaluate import max_pass_length

    for r in range(ds.sizes["run"]):
        mp, cens = max_pass_length(ds.length.values, ds.accuracy.isel(run=r).values, ds.mp.attrs["threshold"])
        assert mp == ds.mp.values[r] and cens == bool(ds.mp_censored.values[r])


def test_spec_hash_is_stable_and_sensitive():
    study = get_study("group-tracking")
    a = study.make_specs(SMOKE)[0]
    b = RunSpec.model_validate_json(a.model_dump_json())
    assert a.spec_hash() == b.spec_hash()
    assert a.model_copy(update={"seed": 1}).spec_hash() != a.spec_hash()
    with pytest.raises(ValueError):
        RunSpec.model_validate({**json.loads(a.model_dump_json()), "bogus": 1})


def test_run_status_rule_and_summary_counts(tmp_path):
    """ok = curriculum reached the training length, not-learned = it did not (with the
    length), diverged = the engine's verdict; the summary line counts each, and
    not-learned runs are evaluated but stay out of the correlations."""
    from dynlab.studies.group_tracking import run_status
    from dynlab.tracking.train import TrainResult
    from dynlab.runtime import NullProgress

    res = TrainResult(model=None, lengths=[2, 3, 60])  # type: ignore[arg-type]
    assert run_status(res, 60) == ("ok", "")
    res = TrainResult(model=None, lengths=[2, 3, 4, 5])  # type: ignore[arg-type]
    assert run_status(res, 60) == ("not-learned", "curriculum stopped at length 5 of 60")
    res = TrainResult(model=None, status="diverged", reason="non-finite loss at step 3")  # type: ignore[arg-type]
    assert run_status(res, 60) == ("diverged", "non-finite loss at step 3")

    base = get_study("group-tracking")
    logged = []

    class Log(NullProgress):
        def log(self, message: str) -> None:
            logged.append(message)

    def run_one(spec, device, progress):
        if spec.model.arch == "linear-rnn":
            return RunOutcome(RunResult(status="diverged", reason="non-finite loss at step 3"), None)
        return base.run_one(spec, device, progress)

    from dynlab.runner.loop import run_specs

    study = dataclasses.replace(base, run_one=run_one, analyze_one=None)
    specs = study.make_specs(SMOKE)
    counts = run_specs(study, specs, RunStore(tmp_path / "s"), "cpu", Log(), analyze=False)
    assert counts["not_learned"] == 2 and counts["failed"] == 2 and counts["trained"] == 4
    assert sum("not-learned: curriculum stopped at length" in m for m in logged) == 2


@pytest.mark.slow
def test_the_dataset_records_the_invocations_wall_time_runs_trained_and_workers(tmp_path):
    """study_wall_time_s lies within the time measured around the call; study_runs_trained
    counts the runs that invocation trained (all on a fresh study, the missing ones on a
    resumed one, none on a rerun), whatever the study's size."""
    study, calls = _counting_study()
    first = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2", "S3")})
    t0 = time.perf_counter()
    ds = open_study(run_study(study, first, out=tmp_path, device="cpu", analyze=False))
    elapsed = time.perf_counter() - t0
    assert ds.sizes["run"] == len(study.make_specs(first)) == len(calls) == 2
    assert ds.attrs["study_runs_trained"] == 2 and ds.attrs["study_workers"] == 1
    assert ds.attrs["study_invocation"] == "study"
    assert 0 < ds.attrs["study_wall_time_s"] <= elapsed

    t0 = time.perf_counter()
    resumed = open_study(run_study(study, SMOKE, out=tmp_path, device="cpu", analyze=False))  # 2 of 4 runs done
    elapsed = time.perf_counter() - t0
    assert resumed.sizes["run"] == 4 and len(calls) == 4
    assert resumed.attrs["study_runs_trained"] == 2
    assert 0 < resumed.attrs["study_wall_time_s"] <= elapsed

    t0 = time.perf_counter()
    rerun = open_study(run_study(study, SMOKE, out=tmp_path, device="cpu", analyze=False))
    assert rerun.attrs["study_runs_trained"] == 0 and len(calls) == 4
    assert 0 < rerun.attrs["study_wall_time_s"] <= time.perf_counter() - t0


def test_the_study_records_its_training_and_analysis_seconds(tmp_path, capsys):
    """study_train_s and study_analysis_s split the invocation's wall time: each analysis's
    own analysis_seconds (timed inside analyze_run) fits inside study_analysis_s, the two
    phases fit inside study_wall_time_s, the manifest repeats them and the summary says them."""
    from dynlab.runner.loop import phase_line

    opts = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",)})
    ds = open_study(run_study(get_study("group-tracking"), opts, out=tmp_path, device="cpu", progress=True))
    a = ds.attrs
    per_run = sum(float(xr_open(p).attrs["analysis_seconds"])
                  for p in (tmp_path / "group-tracking" / "runs").glob("*/analysis.nc"))
    assert 0 < per_run <= a["study_analysis_s"] + 1e-3
    assert 0 < a["study_train_s"] and a["study_train_s"] + a["study_analysis_s"] <= a["study_wall_time_s"] + 1e-3
    manifest = json.loads((tmp_path / "group-tracking" / "manifest.json").read_text())
    assert manifest["timing"] == {k: a[k] for k in ("study_wall_time_s", "study_train_s", "study_analysis_s")}
    said = capsys.readouterr()
    assert "group-tracking: training " in said.err + said.out
    assert phase_line("g", 349.0, 130.0) == "g: training 5 min 49 s, analyses 2 min 10 s (0.37 of training)"
    assert phase_line("g", 0.0001, 374.0) == "g: training 0.0 s, analyses 6 min 14 s"  # dynlab analyze: no ratio
    assert phase_line("p", 677.0, 0.0) == "p: training 11 min 17 s, analyses 0.0 s"  # nothing analysed: no ratio


def xr_open(path):
    import xarray as xr

    with xr.open_dataset(path, engine="netcdf4") as d:
        return d.load()


def test_training_seconds_with_analyses_overlapping_it_are_the_time_to_the_last_run(tmp_path):
    """With an executor whose workers are other processes, the client analyses finished runs
    while the next ones train: train_s is the wall time until the last run arrived (the
    analyses that overlapped training inside it), not that time less the analyses."""
    from dynlab.runner.loop import run_specs
    from dynlab.runtime import NullProgress

    base = get_study("group-tracking")
    train_wait, analysis_wait = 0.05, 0.3

    class Remote:
        remote, shares_process, workers = True, False, 2

        def map_unordered(self, fn, items):
            for item in items:
                time.sleep(train_wait)  # the workers' training, elsewhere
                yield item, fn(item)

    def run_one(spec, device, progress):
        return RunOutcome(RunResult(status="ok"), {"w": torch.zeros(1)})

    def analyze_one(spec, store, device, progress, extra):
        time.sleep(analysis_wait)
        import xarray as xr
        return xr.Dataset({"x": ((), 1.0)})

    study = dataclasses.replace(base, run_one=run_one, stacking=None, analyze_one=analyze_one, result_type=RunResult)
    specs = study.make_specs(SMOKE)[:3]
    t0 = time.perf_counter()
    counts = run_specs(study, specs, RunStore(tmp_path / "s"), "cpu", NullProgress(), analyze=True,
                       executor=Remote(), extra=study.parse_options(SMOKE))
    wall = time.perf_counter() - t0
    # two analyses ran before the last run arrived: the loop's wall until then holds them
    assert counts["train_s"] >= 3 * train_wait + 2 * analysis_wait - 0.02
    assert counts["train_s"] <= wall - analysis_wait + 0.02  # the last run's analysis came after
    assert counts["analysis_s"] >= 3 * analysis_wait


def test_an_executor_that_does_not_say_where_it_runs_is_given_what_a_remote_one_is(tmp_path):
    """An executor without ``remote`` gets what Dask gets, as run_study's device rule says
    (executors.runs_here): no progress bars of this process in the work it runs, the device
    resolved where the work runs; analyses overlap training only on an executor that says
    its workers are other processes (``remote = True``, ``shares_process = False``)."""
    import xarray as xr

    from dynlab.runner.loop import run_specs
    from dynlab.runtime import NullProgress

    class Bars(NullProgress):  # this process's progress bars
        pass

    class Unsaid:
        def map_unordered(self, fn, items):
            for item in items:
                yield item, fn(item)

    class Local(Unsaid):
        remote = False

    class RemoteUnsaid(Unsaid):  # remote, but silent on whether its workers share this process
        remote = True

    class Processes(Unsaid):
        remote, shares_process = True, False

    seen, order = [], []

    def run_one(spec, device, progress):
        seen.append((type(progress), device))
        order.append("train")
        return RunOutcome(RunResult(status="ok"), {"w": torch.zeros(1)})

    def analyze_one(spec, store, device, progress, extra):
        order.append("analyse")
        return xr.Dataset({"x": ((), 1.0)})

    base = get_study("group-tracking")
    study = dataclasses.replace(base, run_one=run_one, stacking=None, analyze_one=analyze_one, result_type=RunResult)
    specs = study.make_specs(SMOKE)[:2]
    extra = study.parse_options(SMOKE)
    orders = {}
    for executor in (Unsaid(), Local(), RemoteUnsaid(), Processes()):
        order.clear()
        run_specs(study, specs, RunStore(tmp_path / type(executor).__name__), "cpu", Bars(), analyze=True,
                  executor=executor, extra=extra)
        orders[type(executor).__name__] = list(order)
    cpu = torch.device("cpu")
    assert seen == [(NullProgress, cpu)] * 2 + [(Bars, cpu)] * 2 + [(NullProgress, cpu)] * 4
    after = ["train", "train", "analyse", "analyse"]
    assert orders == {"Unsaid": after, "Local": after, "RemoteUnsaid": after,
                      "Processes": ["train", "analyse", "train", "analyse"]}


def test_a_stack_holds_at_least_one_run():
    from dynlab.runner.protocol import Stacking

    assert Stacking(key=len, run=list, max_size=3).max_size == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_size"):
            Stacking(key=len, run=list, max_size=bad)


def test_a_work_item_reaches_run_one_alone_and_the_stack_together_with_resume_dir_for_a_resumable_study(tmp_path):
    """A work item of one spec goes to the study's run_one, one of several to its stacking.run;
    a resumable study's calls get the study folder's resume/ (where a cut-off stack resumes),
    another study's do not."""
    from dynlab.runner.loop import RESUME_DIR, run_specs
    from dynlab.runtime import NullProgress

    calls = []

    def run_one(spec, device, progress, **kw):
        calls.append(("one", 1, kw))
        return RunOutcome(RunResult(status="ok"), {"w": torch.zeros(1)})

    def run_many(specs, device, progress, **kw):
        calls.append(("many", len(specs), kw))
        return [RunOutcome(RunResult(status="ok"), {"w": torch.zeros(1)}) for _ in specs]

    base = get_study("group-tracking")
    specs = base.make_specs(SMOKE)[:3]
    for resumable in (False, True):
        study = dataclasses.replace(base, run_one=run_one, analyze_one=None, result_type=RunResult, resumable=resumable,
                                    stacking=Stacking(key=lambda s: 0, run=run_many, max_size=2))
        store = RunStore(tmp_path / str(resumable))
        run_specs(study, specs, store, "cpu", NullProgress(), analyze=False)
        kw = {"resume_dir": store.root / RESUME_DIR} if resumable else {}
        sizes = sorted(len(item) for item in study.work_items(specs))
        assert sizes == [1, 2]  # one item alone, one of two
        assert sorted((what, n) for what, n, _ in calls) == sorted(("one" if n == 1 else "many", n) for n in sizes)
        assert all(got == kw for _, _, got in calls), calls
        calls.clear()


class _Started:
    """An in-process executor that records its start (the call of the factory) and its close."""

    def __init__(self, log: list[str]) -> None:
        from dynlab.executors import InProcessExecutor

        self.log, self.inner, self.remote = log, InProcessExecutor(), False
        log.append("started")

    def map_unordered(self, fn, items):
        return self.inner.map_unordered(fn, items)

    def close(self) -> None:
        self.log.append("closed")


def test_run_study_starts_the_executor_it_is_given_only_once_the_specs_and_folder_are_checked(tmp_path):
    """Refusals (an option, a foreign folder, a rerun that would orphan runs) start no executor;
    one run_study starts closes it; an executor given as such is left to its caller."""
    from dynlab.errors import DynlabInputError

    log: list[str] = []
    bad = dataclasses.replace(SMOKE, extra={"groups": ("C2",), "analysis": "nope"})
    with pytest.raises(DynlabInputError):
        run_study(get_study("group-tracking"), bad, out=tmp_path, device="cpu", executor=lambda: _Started(log))
    (tmp_path / "foreign" / "group-tracking").mkdir(parents=True)
    (tmp_path / "foreign" / "group-tracking" / "notes.txt").write_text("someone else's")
    one = dataclasses.replace(SMOKE, models=("linear-rnn",), extra={"groups": ("C2",)})
    with pytest.raises(DynlabInputError, match="--out"):
        run_study(get_study("group-tracking"), one, out=tmp_path / "foreign", device="cpu",
                  executor=lambda: _Started(log))
    assert log == [] and not (tmp_path / "group-tracking").exists()  # refused: no executor, no folder
    path = run_study(get_study("group-tracking"), one, out=tmp_path, device="cpu", analyze=False,
                     executor=lambda: _Started(log))
    assert log == ["started", "closed"] and path.is_file()
    other = dataclasses.replace(one, models=("tanh-rnn",))  # would orphan the stored run: refused
    with pytest.raises(DynlabInputError, match="rerunning would replace"):
        run_study(get_study("group-tracking"), other, out=tmp_path, device="cpu", analyze=False,
                  executor=lambda: _Started(log))
    assert log == ["started", "closed"]
    given = _Started(log)  # an executor, not a function: its caller closes it
    assert run_study(get_study("group-tracking"), one, out=tmp_path, device="cpu", analyze=False,
                     executor=given) == path
    assert log == ["started", "closed", "started"]

    class Logged(_Started):  # a class is a function that makes one
        def __init__(self) -> None:
            super().__init__(log)

    assert run_study(get_study("group-tracking"), one, out=tmp_path, device="cpu", analyze=False,
                     executor=Logged) == path
    assert log == ["started", "closed", "started", "started", "closed"]
