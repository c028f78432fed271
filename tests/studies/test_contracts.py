"""Typed study contracts: options (unknown keys refused in every study), run results
(typed, round-tripping through result.json, old run folders still load), the analysis
preset recorded in the manifest, load_spec on a written run, and the generic stacking of
dynlab.results.assemble."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import xarray as xr

from dynlab.errors import DynlabInputError
from dynlab.manifest import manifest_options
from dynlab.spec import SPEC_VERSION, load_spec
from dynlab.tracking.spec import RunSpec
from dynlab.lm.spec import LMRunSpec
from dynlab.results.assemble import assemble_runs, result_columns, spec_coords, stack_runs
from dynlab.results.folder import MARKER
from dynlab.results.store import RunStore
from dynlab.runner.driver import analyze_study, open_study, run_study
from dynlab.studies import STUDIES, get_study
from dynlab.studies.group_tracking import ANALYSIS_PRESETS, TrackerResult
from dynlab.lm.results import LMResult, TaskResult
from dynlab.runner.protocol import RunResult, StudyOptions

from helpers.paths import DATA

LEGACY = DATA / "legacy"
TINY = {
    "model": {"hidden": 8},
    "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1},
    "eval": {"lengths": (4, 10), "n_samples": 8, "batch_size": 8, "chunk": 8},
}


# -- options -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_unknown_option_is_a_one_line_error_naming_key_and_allowed_keys(name, tmp_path):
    study = get_study(name)
    allowed = list(study.options_type.model_fields)
    assert "train" in allowed
    for make in (study.make_specs, lambda o: run_study(study, o, out=tmp_path, device="cpu")):
        with pytest.raises(ValueError) as err:
            make(StudyOptions(preset=study.presets[0], extra={"trian": {"steps": 3}}))
        msg = str(err.value)
        assert "\n" not in msg and "'trian'" in msg and name in msg, msg
        assert msg.endswith("allowed: " + ", ".join(allowed)), msg
    assert not any(tmp_path.iterdir())  # refused before anything is written


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_mistyped_options_are_one_line_errors(name):
    study = get_study(name)
    preset = study.presets[0]
    with pytest.raises(ValueError, match=r"bad option 'train' \(.*dictionary") as err:
        study.make_specs(StudyOptions(preset=preset, extra={"train": 5}))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"unknown \w+ field 'stesp'; allowed: steps, ") as err:
        study.make_specs(StudyOptions(preset=preset, extra={"train": {"stesp": 3}}))
    assert "\n" not in str(err.value)


def test_analysis_preset_is_the_study_presets_unless_given():
    gt = get_study("group-tracking")
    got = {p: gt.parse_options(StudyOptions(preset=p)).analysis for p in gt.presets}
    assert got == {"smoke": "smoke", "quick": "quick", "sweep": "quick", "groups": "quick", "paper": "paper"}
    # explicit, not guessed from the evaluation size (quick with 8 evaluation samples stays quick)
    assert gt.parse_options(StudyOptions(preset="quick", extra=TINY)).analysis == "quick"
    assert gt.parse_options(StudyOptions(preset="quick", extra={"analysis": "paper"})).analysis == "paper"
    assert get_study("nonlinearity").parse_options(StudyOptions(preset="smoke")).analysis == "smoke"
    with pytest.raises(ValueError, match="bad option 'analysis'.*'smoke', 'quick' or 'paper'"):
        gt.make_specs(StudyOptions(preset="smoke", extra={"analysis": "fast"}))


@pytest.mark.slow
def test_analysis_preset_recorded_in_the_manifest_and_used(tmp_path):
    """quick preset with 8 evaluation samples: the old rule guessed 'smoke' from the sample
    count; the recorded preset decides, and dynlab analyze reuses it."""
    study = get_study("group-tracking")
    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",), **TINY, "analysis": "quick"})
    path = run_study(study, options, out=tmp_path, device="cpu")
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert manifest["extra"]["analysis"] == "quick"
    assert manifest["extra"]["model"] == {"hidden": 8}
    ds = open_study(path)
    assert ds.attrs["analysis_n_samples"] == ANALYSIS_PRESETS["quick"].n_samples == 128
    ds2 = open_study(analyze_study(path.parent, get_study, device="cpu"))
    assert ds2.attrs["analysis_n_samples"] == 128


@pytest.mark.slow
def test_rerun_with_another_analysis_preset_redoes_the_analyses(tmp_path):
    """The analysis preset is not part of the run's hash: a rerun of a finished folder with
    another preset reuses the training but redoes each analysis, so the manifest's preset is
    the one every analysis.nc was made with."""
    study = get_study("group-tracking")
    base = dict(preset="smoke", models=("tanh-rnn",))
    path = run_study(study, StudyOptions(**base, extra={**TINY, "groups": ("C2",), "analysis": "smoke"}), out=tmp_path,
                     device="cpu")
    runs = sorted((path.parent / "runs").iterdir())
    weights = {r: (r / "model.safetensors").read_bytes() for r in runs}
    for r in runs:
        assert xr.open_dataset(r / "analysis.nc", engine="netcdf4").attrs["analysis_preset"] == "smoke"
    path = run_study(study, StudyOptions(**base, extra={**TINY, "groups": ("C2",), "analysis": "quick"}), out=tmp_path,
                     device="cpu")
    for r in runs:
        with xr.open_dataset(r / "analysis.nc", engine="netcdf4") as ds:
            assert ds.attrs["analysis_preset"] == "quick"
        assert (r / "model.safetensors").read_bytes() == weights[r]  # training reused
    assert open_study(path).attrs["analysis_n_samples"] == ANALYSIS_PRESETS["quick"].n_samples


def test_a_manifest_with_the_groups_beside_extra_still_reads_and_resumes(tmp_path):
    """Manifests written before the groups were the word-problem studies' own option
    (``extra["groups"]``) kept them at their top level: such a manifest reads back to the
    options that make its runs, a rerun into its folder trains nothing and records the
    groups in ``extra``, and a rerun with fewer groups is refused naming ``--groups``."""
    study = get_study("group-tracking")
    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={**TINY, "groups": ("c2", "S3")})
    root = run_study(study, options, out=tmp_path, device="cpu", analyze=False).parent
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["extra"]["groups"] == ["C2", "S3"] and "groups" not in manifest  # canonical spelling
    extra = {k: v for k, v in manifest["extra"].items() if k != "groups"}
    legacy = {**manifest, "groups": ["C2", "S3"], "extra": extra}  # as dynlab wrote it before
    (root / "manifest.json").write_text(json.dumps(legacy))
    read = study.prepared(manifest_options(root, legacy, study))
    assert read.extra["groups"] == ("C2", "S3")
    assert [s.spec_hash() for s in study.make_specs(read)] == manifest["run_ids"]
    weights = {p: p.read_bytes() for p in (root / "runs").glob("*/model.safetensors")}
    assert len(weights) == 2
    rerun = open_study(run_study(study, options, out=tmp_path, device="cpu", analyze=False))
    assert rerun.attrs["study_runs_trained"] == 0
    assert {p: p.read_bytes() for p in weights} == weights
    assert json.loads((root / "manifest.json").read_text())["extra"]["groups"] == ["C2", "S3"]
    (root / "manifest.json").write_text(json.dumps(legacy))
    fewer = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={**TINY, "groups": ("C2",)})
    with pytest.raises(DynlabInputError, match=r"was run with --groups C2,S3, this run asks --groups C2: "):
        run_study(study, fewer, out=tmp_path, device="cpu", analyze=False)
    broken = {**legacy, "groups": "C2"}  # not a list: refused as the option is, in one line
    with pytest.raises(DynlabInputError, match=r"^study group-tracking: bad option 'groups'"):
        study.parse_options(manifest_options(root, broken, study))


# -- typed results -----------------------------------------------------------------------


@pytest.mark.regression_pin
@pytest.mark.parametrize("result_type, path", [
    (TrackerResult, LEGACY / "group-tracking" / "runs" / "59b9bfcd5475deae" / "result.json"),
    (LMResult, LEGACY / "length-generalization-result.json"),
    (TaskResult, LEGACY / "passkey-result.json"),
])
def test_results_written_before_typing_load_and_round_trip(result_type, path):
    """Pins: result.json files dynlab wrote before typed results (tests/data/legacy/, commit
    8ac8417's parent) load and are written back key for key.  Regenerate: never from the
    current code (that would erase what they pin); add a new fixture when the format changes
    on purpose (``git log -- tests/data/legacy``)."""
    raw = json.loads(path.read_text())
    r = result_type.model_validate(raw)
    assert r.status == raw["status"] and r.train_loss == raw["train_loss"] and r.evaluated
    assert r.to_json() == raw  # same JSON on disk, key for key
    assert result_type.model_validate(json.loads(json.dumps(r.to_json()))) == r


def test_typed_result_rules():
    raw = json.loads((LEGACY / "group-tracking" / "runs" / "59b9bfcd5475deae" / "result.json").read_text())
    diverged = TrackerResult(status="diverged", reason="non-finite loss at step 3")
    assert not diverged.evaluated and diverged.to_json() == {"status": "diverged", "reason": "non-finite loss at step 3"}
    with pytest.raises(ValueError):
        TrackerResult.model_validate({**raw, "acuracy": [1.0]})
    with pytest.raises(TypeError, match="must be a RunResult"):
        from dynlab.runner.protocol import RunOutcome

        RunOutcome({"status": "ok"}, None)  # type: ignore[arg-type]


def test_result_that_does_not_fit_is_a_one_line_error(tmp_path):
    root = tmp_path / "group-tracking"
    shutil.copytree(LEGACY / "group-tracking", root)
    study = get_study("group-tracking")
    spec = load_spec((root / "runs" / "59b9bfcd5475deae" / "spec.json").read_text(), RunSpec)
    path = root / "runs" / "59b9bfcd5475deae" / "result.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "mp": "far"}))
    with pytest.raises(ValueError, match=r"run 59b9bfcd5475deae: result.json does not fit TrackerResult \(mp: ") as err:
        study.load_result(RunStore(root), spec)
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.regression_pin
def test_old_study_folder_is_reused_assembled_and_reanalysed(tmp_path):
    """A study folder written before typed results and recorded options: nothing is
    retrained, the dataset holds the stored numbers, analyze records the analysis preset.

    Pins: tests/data/legacy/group-tracking/ (written by dynlab before typed results): its run
    id 59b9bfcd5475deae is the one today's smoke options make, and its stored numbers come
    through unchanged (the folder, from before the study-folder marker, gets one here: dynlab
    takes no folder without it).  Regenerate: as the other legacy fixtures, never from the
    current code."""
    root = tmp_path / "group-tracking"
    shutil.copytree(LEGACY / "group-tracking", root)
    (root / MARKER).write_text(json.dumps({"dynlab": "study folder", "study": "group-tracking"}))
    base = get_study("group-tracking")
    trained = []

    def run_one(spec, device, progress):
        trained.append(spec)
        return base.run_one(spec, device, progress)

    study = dataclasses.replace(base, run_one=run_one, stacking=None)
    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",), **TINY})
    ds = open_study(run_study(study, options, out=tmp_path, device="cpu"))
    assert trained == []
    raw = json.loads((root / "runs" / "59b9bfcd5475deae" / "result.json").read_text())
    assert list(ds.run_id.values) == ["59b9bfcd5475deae"]
    np.testing.assert_array_equal(ds.accuracy.sel(length=raw["lengths"]).values[0], raw["accuracy"])
    assert ds.mp.values[0] == raw["mp"] and str(ds.status.values[0]) == raw["status"] == "not-learned"
    assert "q" in ds and ds.attrs["analysis_n_samples"] == ANALYSIS_PRESETS["smoke"].n_samples

    shutil.copy(LEGACY / "group-tracking" / "manifest.json", root / "manifest.json")  # the old manifest
    assert "analysis" not in json.loads((root / "manifest.json").read_text())["extra"]
    analyze_study(root, get_study, device="cpu")
    assert json.loads((root / "manifest.json").read_text())["extra"]["analysis"] == "smoke"


# -- load_spec ---------------------------------------------------------------------------


def test_load_spec_reads_a_written_run(tmp_path):
    study = get_study("group-tracking")
    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",), **TINY})
    run_study(study, options, out=tmp_path, device="cpu", analyze=False)
    (spec,) = study.make_specs(options)
    store = RunStore(tmp_path / "group-tracking")
    text = store.load_spec_json(spec.spec_hash())
    loaded = load_spec(text, RunSpec)
    assert loaded == spec and loaded.spec_hash() == spec.spec_hash()
    assert load_spec(json.loads(text)["fields"], RunSpec) == spec  # the bare fields, too
    with pytest.raises(ValueError, match="spec.json holds a 'RunSpec', not a LMRunSpec"):
        load_spec(text, LMRunSpec)
    doc = json.loads(text)
    with pytest.raises(ValueError, match=f"spec.json has version 99; allowed: {SPEC_VERSION}"):
        load_spec(json.dumps({**doc, "version": 99}), RunSpec)
    with pytest.raises(ValueError, match="invalid RunSpec: not JSON"):
        load_spec(text[:-5], RunSpec)
    with pytest.raises(ValueError, match="invalid RunSpec: model.hidden"):
        load_spec({**doc, "fields": {**doc["fields"], "model": {**doc["fields"]["model"], "hidden": -1}}}, RunSpec)


# -- generic stacking --------------------------------------------------------------------


def _run(t: list[int], value: float, mode: str, crossed: bool) -> xr.Dataset:
    return xr.Dataset(
        {"q": ("t", np.full(len(t), value)), "mode": ((), mode), "crossed": ((), crossed), "n": ((), 3)},
        coords={"t": t},
        attrs={"source": "first" if value == 1.0 else "other"},
    )


def test_stack_runs_fills_missing_runs_by_type_and_joins_axes():
    a, b = _run([1, 2], 1.0, "blowup", True), _run([2, 3], 2.0, "collapse", False)
    ds = stack_runs([a, None, b])
    assert ds is not None and ds.sizes["run"] == 3 and list(ds.t.values) == [1, 2, 3]
    np.testing.assert_array_equal(ds.q.values, [[1, 1, np.nan], [np.nan] * 3, [np.nan, 2, 2]])
    assert list(ds["mode"].values) == ["blowup", "", "collapse"] and ds["mode"].dtype.kind == "U"
    assert list(ds["crossed"].values) == [True, False, False] and ds["crossed"].dtype == bool
    np.testing.assert_array_equal(ds["n"].values, [3, np.nan, 3])  # integers become floats with NaN
    assert ds.attrs == {"source": "first"}
    ds = stack_runs([None, a], missing={"q": -1.0, "mode": "none"})
    assert list(ds.q.values[0]) == [-1.0, -1.0] and ds["mode"].values[0] == "none"
    assert stack_runs([None, None]) is None


def test_result_columns_and_coords_of_typed_results():
    class R(RunResult):
        mp: int | None = None
        censored: bool | None = None
        family: str | None = None

    results = [R(status="ok", mp=7, censored=True, family="dense"), R(status="diverged", reason="nan")]
    cols = result_columns(results, ["status", "reason", "mp", "censored", "family", "train_loss"])
    assert list(cols["status"][1]) == ["ok", "diverged"] and list(cols["reason"][1]) == ["", "nan"]
    np.testing.assert_array_equal(cols["mp"][1], [7.0, np.nan])
    assert cols["censored"][1].dtype == bool and list(cols["censored"][1]) == [True, False]
    assert list(cols["family"][1]) == ["dense", ""]
    assert np.isnan(cols["train_loss"][1]).all()
    # all-missing columns keep their declared type
    assert result_columns([results[1]], ["censored"])["censored"][1].dtype == bool

    specs = [RunSpec.model_validate({"task": {"group": "C2"}, "model": {"arch": "tanh-rnn"}, "seed": s}) for s in (0, 1)]
    coords = spec_coords(specs, seed=lambda s: s.seed, arch=lambda s: s.model.arch)
    assert list(coords["run"]) == [0, 1] and list(coords["run_id"][1]) == [s.spec_hash() for s in specs]
    ds = assemble_runs(specs, results, lambda s, r: _run([1], float(s.seed + 1), "m", False) if r.evaluated else None,
                       columns=("status", "mp"), coords={"arch": lambda s: s.model.arch}, result_coords=("family",))
    assert ds.q.dims == ("run", "t") and np.isnan(ds.q.values[1]).all() and ds.q.values[0, 0] == 1.0
    assert list(ds.family.values) == ["dense", ""] and "family" in ds.coords and list(ds.arch.values) == ["tanh-rnn"] * 2


def test_group_tracking_keeps_its_names_and_is_a_recipe():
    """Every name group-tracking exported before the run work moved to dynlab.tracking.run
    still imports from it, and is the library's object (one definition)."""
    import inspect

    import dynlab.tracking.run as runs
    from dynlab.studies import group_tracking as gt

    before = {"ANALYSIS_PRESETS", "PRESETS", "STUDY", "TrackerResult", "TrackingOptions", "analyze_one", "assemble",
              "ensemble_group_key", "load_model", "make_specs", "not_learned_horizon", "run_many", "run_one"}
    assert before <= set(gt.__all__) and all(hasattr(gt, name) for name in gt.__all__)
    for name in runs.__all__:
        if hasattr(gt, name):
            assert getattr(gt, name) is getattr(runs, name), name
    assert gt.STUDY.run_one is runs.run_one and gt.STUDY.stacking.key is runs.ensemble_group_key
    assert len(inspect.getsource(gt).splitlines()) <= 250


def test_not_learned_horizon_rule():
    from dynlab.studies.group_tracking import not_learned_horizon

    assert not_learned_horizon(1000, 60, 7) == 120  # 2 × the training length
    assert not_learned_horizon(1000, 60, 90) == 180  # never below 2 × its own mp
    assert not_learned_horizon(100, 60, None) == 100  # never beyond the evaluated lengths


@pytest.mark.slow
def test_a_not_learned_runs_q_stops_at_its_shorter_horizon(tmp_path):
    """A not-learned run's q(t) is followed to 2 × the training length, a learned run's to
    the longest evaluated length; the run variable ``horizon`` says which."""
    common = dict(preset="smoke", models=("mamba",))
    study = get_study("group-tracking")
    runs = {}
    for name, curriculum in (("stuck", {"min_length": 2, "max_length": 40}), ("reached", {"min_length": 2, "max_length": 2})):
        extra = {"groups": ("C2",), "eval": {"lengths": [5, 20, 200]}, "train": {"steps": 3, "curriculum": curriculum}}
        path = run_study(study, StudyOptions(**common, extra=extra), out=tmp_path / name, device="cpu")
        runs[name] = xr.open_dataset(path, engine="netcdf4").load()
    stuck, reached = runs["stuck"].isel(run=0), runs["reached"].isel(run=0)
    assert str(stuck["status"].values) == "not-learned" and str(reached["status"].values) == "ok"
    assert int(stuck["horizon"]) == 80 and int(reached["horizon"]) == 200
    assert stuck.sizes["t"] == 80 and np.isfinite(stuck["R"].values).all()
    assert reached.sizes["t"] == 200 and np.isfinite(reached["R"].values).all()
    # an analysis written before the run variable existed followed q(t) to every length
    (afile,) = (tmp_path / "stuck" / "group-tracking" / "runs").glob("*/analysis.nc")
    with xr.open_dataset(afile, engine="netcdf4") as old:
        legacy = old.load().drop_vars("horizon")
    legacy.to_netcdf(afile, engine="netcdf4")
    options = StudyOptions(**common, extra={"groups": ("C2",), "eval": {"lengths": [5, 20, 200]},
                                            "train": {"steps": 3, "curriculum": {"min_length": 2, "max_length": 40}}})
    ds = study.assemble(study.make_specs(options), RunStore(tmp_path / "stuck" / "group-tracking"), options)
    assert float(ds["horizon"].isel(run=0)) == 200.0


def test_integer_variables_padded_with_nan_are_written_as_nan(tmp_path):
    """Runs analysed to different horizons are joined with NaN padding; a variable read back
    from an integer file (k_U, n_present) must keep that NaN on disk, not a huge negative
    integer."""
    from dynlab.results.schema import open_dataset, write_dataset

    parts = []
    for i, t in enumerate((3, 5)):
        one = xr.Dataset({"k_U": ("t", np.arange(1, t + 1, dtype=np.int64))}, coords={"t": np.arange(1, t + 1)})
        one.to_netcdf(tmp_path / f"a{i}.nc", engine="netcdf4")
        with xr.open_dataset(tmp_path / f"a{i}.nc", engine="netcdf4") as back:
            parts.append(back.load())
    assert parts[0]["k_U"].encoding["dtype"] == np.int64  # what the runs' files hand on
    table = stack_runs(parts)
    back = open_dataset(write_dataset(table, tmp_path / "study.nc"))
    assert back["k_U"].values[0, :3].tolist() == [1, 2, 3] and np.isnan(back["k_U"].values[0, 3:]).all()
    assert back["k_U"].values[1].tolist() == [1, 2, 3, 4, 5]
