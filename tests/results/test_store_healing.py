"""A damaged run folder is found by one check, moved to quarantine/, reported in one line
and redone; the study finishes with the numbers an undamaged study gives."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
import torch

from dynlab.errors import DynlabInputError
from dynlab.results.store import CHECKSUMS, QUARANTINE, RunStore, file_digest
from dynlab.runner.driver import analyze_study, open_study, run_study
from dynlab.runner.protocol import StudyOptions
from dynlab.studies import get_study

SMOKE = StudyOptions(preset="smoke", models=("tanh-rnn", "linear-rnn"), extra={"groups": ("C2", "S3")})


def _counting_study():
    """group-tracking, counting the runs it trains and the analyses it computes."""
    base = get_study("group-tracking")
    trained, analysed = [], []

    def run_one(spec, device, progress):
        trained.append(spec.spec_hash())
        return base.run_one(spec, device, progress)

    def analyze_one(spec, store, device, progress, extra):
        analysed.append(spec.spec_hash())
        return base.analyze_one(spec, store, device, progress, extra)

    study = dataclasses.replace(base, run_one=run_one, stacking=None, analyze_one=analyze_one)
    return study, trained, analysed


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """A finished smoke study with analyses (4 runs), made once; tests work on copies."""
    out = tmp_path_factory.mktemp("template")
    study, _, _ = _counting_study()
    run_study(study, SMOKE, out=out, device="cpu")
    return out


def _truncate(path):
    """Keep the first half of the file, at most 4 KiB: a netCDF-4 file written in memory is
    padded with zeros to a multiple of 64 KiB, and a cut inside the padding leaves it whole."""
    data = path.read_bytes()
    path.write_bytes(data[: min(len(data) // 2, 4096)])


def _corrupt_middle(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(b ^ 0xFF for b in data[mid : mid + 64])  # changed bytes, same size: only the checksum can tell
    path.write_bytes(bytes(data))


DAMAGE = {  # file name -> how it is damaged
    "result.json": _truncate,
    "spec.json": _truncate,
    "model.safetensors": lambda p: p.unlink(),
    "analysis.nc": _corrupt_middle,
}


@pytest.mark.slow
def test_each_damaged_file_kind_is_quarantined_reported_and_redone(finished_study, tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(finished_study, out)
    study, trained, analysed = _counting_study()
    specs = study.make_specs(SMOKE)
    root = out / "group-tracking"
    before = open_study(root)
    store = RunStore(root)
    damaged = dict(zip(DAMAGE, [s.spec_hash() for s in specs]))  # one file kind per run
    for name, rid in damaged.items():
        assert store.inspect(rid) is None
        DAMAGE[name](store.runs / rid / name)
        assert store.inspect(rid).files == (name,)

    capsys.readouterr()
    after = open_study(run_study(study, SMOKE, out=out, device="cpu"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4, err  # one line per damaged run
    for name, rid in damaged.items():
        line = next(x for x in err if x.startswith(f"run {rid} damaged ({name}: "))
        assert f"moved to {root / QUARANTINE}" in line
        assert line.endswith("recomputing its analyses" if name == "analysis.nc" else "training it again")
    core = [rid for name, rid in damaged.items() if name != "analysis.nc"]
    assert sorted(trained) == sorted(core)  # the damaged runs only, trained again
    assert sorted(analysed) == sorted(damaged.values())  # their analyses, and the damaged analysis
    assert all(store.inspect(s.spec_hash()) is None for s in specs)

    quarantined = sorted((root / QUARANTINE).iterdir())
    assert len(quarantined) == 4
    for q in quarantined:
        rid = q.name.split("-")[0]
        name = next(n for n, r in damaged.items() if r == rid)
        assert name in (q / "WHY.txt").read_text()
        if name == "analysis.nc":  # only the damaged analysis moved; the run stayed
            assert sorted(p.name for p in q.iterdir()) == ["WHY.txt", "analysis.nc"]
        else:  # the whole run folder moved
            assert (q / CHECKSUMS).is_file() and (q / "WHY.txt").is_file()

    # redone runs reproduce the undamaged study's numbers, bit for bit
    for var in ("accuracy", "accuracy_all", "train_loss", "mp", "q", "T_cross"):
        np.testing.assert_array_equal(after[var].values, before[var].values, err_msg=var)

    capsys.readouterr()
    run_study(study, SMOKE, out=out, device="cpu")  # nothing left to heal or redo
    assert capsys.readouterr().err == "" and sorted(trained) == sorted(core)


@pytest.mark.slow
def test_analyze_on_a_damaged_run_names_the_file_and_the_way_out(finished_study, tmp_path, capsys):
    from dynlab.cli import main

    out = tmp_path / "out"
    shutil.copytree(finished_study, out)
    root = out / "group-tracking"
    rid = get_study("group-tracking").make_specs(SMOKE)[1].spec_hash()
    _truncate(root / "runs" / rid / "spec.json")
    capsys.readouterr()
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 0  # the run moved: said, not bad input
    err = [x for x in capsys.readouterr().err.strip().splitlines() if x.startswith("run ")]
    assert len(err) == 1 and err[0].startswith(f"run {rid} damaged (spec.json: "), err
    assert "left out of the dataset (rerun `dynlab study group-tracking`" in err[0]
    assert not (root / "runs" / rid).exists() and len(list((root / QUARANTINE).iterdir())) == 1
    assert rid not in set(open_study(root).run_id.values)  # the dataset lists the runs runs/ holds
    with pytest.raises(ValueError, match=f"run {rid} is missing \\(moved to "):
        analyze_study(root, get_study, device="cpu")


@pytest.mark.slow
def test_a_stray_file_in_a_run_is_moved_aside_and_the_run_kept(finished_study, tmp_path, capsys):
    """A file the run never wrote (not in its checksums): moved to quarantine, said in one
    line that does not claim a retraining or a recomputation, and nothing is redone."""
    from dynlab.cli import main

    out = tmp_path / "out"
    shutil.copytree(finished_study, out)
    root = out / "group-tracking"
    rid = get_study("group-tracking").make_specs(SMOKE)[0].spec_hash()
    (root / "runs" / rid / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"run {rid} damaged (notes.txt: "), err
    assert err[0].endswith("; the run itself is intact"), err
    assert not (root / "runs" / rid / "notes.txt").exists()


def test_analyze_says_in_one_line_which_analysis_it_quarantines(finished_study, tmp_path, capsys):
    """A damaged analysis.nc alone: analyze moves it to quarantine/, says so in one line
    (as `dynlab study` does) and recomputes it."""
    from dynlab.cli import main

    out = tmp_path / "out"
    shutil.copytree(finished_study, out)
    root = out / "group-tracking"
    rid = get_study("group-tracking").make_specs(SMOKE)[0].spec_hash()
    _truncate(root / "runs" / rid / "analysis.nc")
    capsys.readouterr()
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"run {rid} damaged (analysis.nc: "), err
    assert err[0].endswith("; recomputing its analyses") and f"moved to {root / QUARANTINE}" in err[0]
    assert (root / "runs" / rid / "analysis.nc").is_file()


@pytest.mark.slow
def test_an_output_the_system_refuses_is_refused_before_any_work(finished_study, tmp_path, capsys, monkeypatch):
    """What only a write can tell (a file system that takes no files, a name too long, an
    immutable file) is found by a probe before the work: exit 2, one line, nothing made."""
    import subprocess

    import dynlab.bench
    import dynlab.runner.driver
    from dynlab.cli import main

    monkeypatch.setattr(dynlab.bench, "bench_train", lambda *a, **k: pytest.fail("the benchmark ran"))
    monkeypatch.setattr(dynlab.runner.driver, "run_study", lambda *a, **k: pytest.fail("the study ran"))
    assert main(["bench", "train", "--quick", "--models", "tanh-rnn", "--json", "/proc/b.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --json /proc/b.json cannot be written (") and err.count("\n") == 1, err
    for out in (tmp_path / ("x" * 300), tmp_path.joinpath(*["d" * 200] * 21)):  # a name, a path too long
        assert main(["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke",
                     "--out", str(out), "-q"]) == 2
        err = capsys.readouterr().err
        assert "cannot be written (a name in the path, or the whole path, is longer than this system allows)" in err
        assert err.count("\n") == 1
    assert sorted(tmp_path.iterdir()) == []
    # analyze on a study whose dataset.nc cannot be replaced (immutable): refused before any analysis
    out = tmp_path / "out"
    shutil.copytree(finished_study, out)
    root = out / "group-tracking"
    if subprocess.run(["chattr", "+i", str(root / "dataset.nc")], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs root and a file system that keeps the flag")
    try:
        study, _, analysed = _counting_study()
        monkeypatch.setattr("dynlab.studies.get_study", lambda name: study)
        assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: cannot analyse the study: {root / 'dataset.nc'} cannot be replaced (it is immutable or "
                       "append-only); allowed: a study folder whose files can be rewritten\n")
        assert analysed == []
    finally:
        subprocess.run(["chattr", "-i", str(root / "dataset.nc")], capture_output=True)


def _spec(seed=0):
    return get_study("group-tracking").make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), seeds=(seed,), extra={"groups": ("C2",)}))[0]


def test_checksums_list_every_file_with_size_and_sha256(tmp_path):
    import hashlib

    store = RunStore(tmp_path)
    spec = _spec()
    store.save(spec, {"status": "ok", "x": 1}, {"w": torch.arange(3.0)})
    store.write_json(spec, "extra.json", {"a": 1})
    folder = store.path(spec)
    listed = json.loads((folder / CHECKSUMS).read_text())["files"]
    assert sorted(listed) == ["extra.json", "model.safetensors", "result.json", "spec.json"]
    for name, entry in listed.items():
        data = (folder / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)} == file_digest(folder / name)
    assert hashlib.sha256((folder / "spec.json").read_bytes()).hexdigest()[:16] == spec.spec_hash()


@pytest.mark.parametrize(
    "damage, files, core",
    [
        ("truncate checksums", ("checksums.json", "model.safetensors", "result.json", "spec.json"), True),
        ("stray file", ("notes.txt",), False),
        ("spec of another run", ("spec.json",), True),
        ("edited result", ("result.json",), True),
    ],
)
def test_inspect_finds_damage_the_checksums_do_not_list(tmp_path, damage, files, core):
    store = RunStore(tmp_path)
    spec = _spec()
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    folder = store.path(spec)
    if damage == "truncate checksums":
        _truncate(folder / CHECKSUMS)
    elif damage == "stray file":
        (folder / "notes.txt").write_text("hello")
    elif damage == "spec of another run":  # spec.json and its checksum both replaced
        other = _spec(seed=1).canonical_json()
        (folder / "spec.json").write_text(other)
        sums = json.loads((folder / CHECKSUMS).read_text())
        sums["files"]["spec.json"] = file_digest(folder / "spec.json")
        (folder / CHECKSUMS).write_text(json.dumps(sums))
    else:
        (folder / "result.json").write_text((folder / "result.json").read_text().replace('"ok"', '"OK"'))
    found = store.inspect(spec.spec_hash())
    assert found is not None and found.files == files and found.core is core, found
    assert store.is_done(spec) is not core
    damage_, dest = store.heal(spec.spec_hash())
    assert (dest / "WHY.txt").read_text().strip() == damage_.why
    assert store.inspect(spec.spec_hash()) is None
    assert store.is_done(spec) is not core  # core: the run is gone (to be redone); else it stays


def test_a_folder_from_before_checksums_is_checked_by_reading_and_adopted(tmp_path):
    store = RunStore(tmp_path)
    good, bad = _spec(0), _spec(1)
    for spec in (good, bad):
        store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
        (store.path(spec) / CHECKSUMS).unlink()  # as written by older dynlab versions
    (store.path(bad) / "model.safetensors").write_bytes(b"not a checkpoint")
    assert store.inspect(good.spec_hash()) is None and (store.path(good) / CHECKSUMS).is_file()
    found = store.inspect(bad.spec_hash())
    assert found.files == ("model.safetensors",) and found.core and not (store.path(bad) / CHECKSUMS).exists()


def test_an_interrupted_analysis_write_is_not_damage(tmp_path):
    """Killed after the checksum of a new analysis was entered but before the file was
    renamed into place: the entry is dropped and the analysis simply counts as absent."""
    store = RunStore(tmp_path)
    spec = _spec()
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    folder = store.path(spec)
    sums = json.loads((folder / CHECKSUMS).read_text())
    sums["files"]["analysis.nc"] = {"sha256": "0" * 64, "bytes": 10}
    (folder / CHECKSUMS).write_text(json.dumps(sums))
    assert store.inspect(spec.spec_hash()) is None and not store.has_file(spec, "analysis.nc")
    assert "analysis.nc" not in json.loads((folder / CHECKSUMS).read_text())["files"]


def test_unreadable_analysis_names_its_file(tmp_path):
    import xarray as xr

    store = RunStore(tmp_path)
    spec = _spec()
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    store.write_dataset(spec, "analysis.nc", xr.Dataset({"q": ("t", np.arange(3.0))}))
    _truncate(store.path(spec) / "analysis.nc")
    path = re.escape(str(store.path(spec) / "analysis.nc"))
    with pytest.raises(DynlabInputError, match=f"^run {spec.spec_hash()}: unreadable dataset {path} \\(.*; rerun the study to redo it$"):
        store.read_dataset(spec, "analysis.nc")
    (store.path(spec) / "analysis.nc").unlink()
    with pytest.raises(DynlabInputError, match=f"^run {spec.spec_hash()}: no dataset at {path}; allowed: .*; rerun the study"):
        store.read_dataset(spec, "analysis.nc")


# -- a task study's analyses (made by `dynlab analyze` alone) survive damage and a rerun ----

TASK = StudyOptions(preset="smoke", seeds=(0, 1))


def _task_study_with_cheap_analysis():
    """copying (smoke) whose per-run analysis is a cheap stand-in for the state geometry
    (the real one takes minutes): the same layout (``tested`` rows, a ``distance`` dim, geo_*
    variables), values that depend on the run, and a count of the analyses computed."""
    import xarray as xr

    from dynlab.studies.long_context import _tested_weights

    base = get_study("copying")
    analysed = []

    def analyze_one(spec, store, device, progress, extra):
        analysed.append(spec.spec_hash())
        names = [name for name, _ in _tested_weights(spec, store)]
        q = np.arange(len(names) * 3, dtype=float).reshape(len(names), 3) + spec.seed
        return xr.Dataset({"geo_q": (("tested", "distance"), q), "geo_rho": ("tested", q[:, 0] / 10)},
                          coords={"distance": [4, 8, 16]}, attrs={"tested": json.dumps(names), "geo_tau": 1.0, "geo_accuracy_level": 0.5})

    return dataclasses.replace(base, analyze_one=analyze_one), analysed


@pytest.mark.slow
def test_a_task_studys_damaged_analysis_is_recomputed_by_the_study(tmp_path, capsys):
    """`dynlab study copying` computes no analyses (`dynlab analyze` does); a rerun after an
    analysis.nc was damaged (or a run with one had to be trained again) recomputes the
    analyses that were there, so the dataset keeps every geo_* variable and `distance`."""
    study, analysed = _task_study_with_cheap_analysis()
    run_study(study, TASK, out=tmp_path, device="cpu", analyze=False)  # as `dynlab study copying`
    root = tmp_path / "copying"
    assert analysed == [] and "distance" not in open_study(root).dims
    analyze_study(root, lambda name: study, device="cpu")  # as `dynlab analyze`
    before = open_study(root)
    assert {"geo_q", "geo_rho"} <= set(before.data_vars) and before.sizes["distance"] == 3
    store = RunStore(root)
    spec_analysis, spec_core = study.make_specs(TASK)
    (store.runs / spec_analysis.spec_hash() / "analysis.nc").write_bytes(
        (store.runs / spec_analysis.spec_hash() / "analysis.nc").read_bytes()[:300])  # truncate -s 300
    _truncate(store.runs / spec_core.spec_hash() / "result.json")

    analysed.clear()
    capsys.readouterr()
    after = open_study(run_study(study, TASK, out=tmp_path, device="cpu", analyze=False))
    err = capsys.readouterr().err
    assert f"run {spec_analysis.spec_hash()} damaged (analysis.nc: " in err and "recomputing its analyses" in err
    assert f"run {spec_core.spec_hash()} damaged (result.json: " in err
    assert sorted(analysed) == sorted([spec_analysis.spec_hash(), spec_core.spec_hash()])
    assert all(store.has_file(s, "analysis.nc") and store.inspect(s.spec_hash()) is None for s in (spec_analysis, spec_core))
    assert after.sizes["distance"] == 3
    for var in ("geo_q", "geo_rho"):
        np.testing.assert_allclose(after[var].values, before[var].values, err_msg=var)

    analysed.clear()
    run_study(study, TASK, out=tmp_path, device="cpu", analyze=False)  # nothing damaged: nothing recomputed
    assert analysed == []


# -- a result.json that its study cannot use is damage, with or without checksums -------------

def _lg_spec(seed=0):
    return get_study("length-generalization").make_specs(StudyOptions(preset="smoke", seeds=(seed,)))[0]


@pytest.mark.parametrize("checksums", [False, True])
def test_a_result_its_study_cannot_use_is_damage_of_the_run(tmp_path, checksums):
    """`{"status": "ok"}` parses, but an evaluated length-generalization run holds its
    evaluation: with the study's check the store finds the run damaged (never adopts it)."""
    from dynlab.runner.loop import result_check

    study = get_study("length-generalization")
    spec = _lg_spec()
    store = RunStore(tmp_path, check_result=result_check(study))
    RunStore(tmp_path).save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    if not checksums:
        (store.path(spec) / CHECKSUMS).unlink()  # as written before checksums existed
    found = store.inspect(spec.spec_hash())
    assert found is not None and found.files == ("result.json",) and found.core, found
    assert found.why.startswith("result.json: lacks what a ok run holds (ppl, ppl_binned_t, ppl_binned and ")
    assert not store.is_done(spec) and (store.path(spec) / CHECKSUMS).is_file() is checksums
    _, dest = store.heal(spec.spec_hash())
    assert not store.path(spec).exists() and (dest / "result.json").is_file()
    # a result that does not fit the study's result type, and a diverged run (needs no evaluation)
    RunStore(tmp_path).save(spec, {"status": "ok", "ppl": "high"}, {"w": torch.zeros(2)})
    assert store.inspect(spec.spec_hash()).why.startswith("result.json: does not fit LMResult (ppl: ")
    shutil.rmtree(store.path(spec))
    RunStore(tmp_path).save(spec, {"status": "diverged", "reason": "nan at step 3"}, None)
    assert store.inspect(spec.spec_hash()) is None
    assert RunStore(tmp_path).inspect(spec.spec_hash()) is None  # a store without the check: any status will do


@pytest.mark.slow
def test_a_bad_result_without_checksums_is_quarantined_and_trained_again(tmp_path, capsys):
    """The old-format check no longer adopts a result.json that holds none of what the study
    needs: one line, the run to quarantine/, trained again; the dataset as an undamaged one."""
    from dynlab.cli import main

    study = get_study("length-generalization")
    options = StudyOptions(preset="smoke")
    before = open_study(run_study(study, options, out=tmp_path, device="cpu"))
    root = tmp_path / "length-generalization"
    rid = study.make_specs(options)[0].spec_hash()
    (root / "runs" / rid / "result.json").write_text('{"status": "ok"}\n')
    (root / "runs" / rid / CHECKSUMS).unlink()
    capsys.readouterr()
    after = open_study(run_study(study, options, out=tmp_path, device="cpu"))
    err = capsys.readouterr().err.splitlines()
    line = next(x for x in err if x.startswith(f"run {rid} damaged (result.json: lacks what a ok run holds ("))
    assert line.endswith("; training it again") and f"moved to {root / QUARANTINE}" in line
    assert len(list((root / QUARANTINE).iterdir())) == 1
    for var in ("ppl", "ppl_binned", "lg_passed", "train_loss"):
        np.testing.assert_allclose(after[var].values, before[var].values, err_msg=var)
    capsys.readouterr()
    assert main(["study", "length-generalization", "--preset", "smoke", "--out", str(tmp_path), "-q"]) == 0
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 0
    assert "damaged" not in capsys.readouterr().err
