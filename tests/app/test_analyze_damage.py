"""Exit code 2 means nothing changed: ``dynlab analyze`` on a study with a damaged run
moves it to quarantine/, says so in one line, and writes the dataset of the runs that
``runs/`` still holds (exit 0); a command that stops on bad input after it changed files
exits 1 saying what changed."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

from dynlab.cli import main
from dynlab.errors import DynlabInputError, DynlabStoppedError, exit_status
from dynlab.runner.driver import open_study, run_study
from dynlab.studies import get_study
from dynlab.runner.protocol import StudyOptions

OPTIONS = ["--models", "tanh-rnn", "--groups", "C2", "--seeds", "0,1", "--preset", "smoke"]
SMOKE = StudyOptions(preset="smoke", models=("tanh-rnn",), seeds=(0, 1), extra={"groups": ("C2",)})


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished smoke study of two runs with analyses, made once; tests work on copies."""
    out = tmp_path_factory.mktemp("study")
    assert main(["study", "group-tracking", *OPTIONS, "--out", str(out), "--device", "cpu", "-q"]) == 0
    return out / "group-tracking"


def _copy(finished: Path, tmp_path: Path) -> Path:
    root = tmp_path / "group-tracking"
    shutil.copytree(finished, root)
    return root


def _damage(run: Path, how: str, checksums: bool) -> None:
    """Replace the run's result.json (a JSON list, or an mp that is NaN or a string); with
    ``checksums`` its checksums.json is made to match, so only the study's check of the
    result can tell."""
    result = json.loads((run / "result.json").read_text())
    text = {"list": "[1, 2]", "nan": json.dumps({**result, "mp": float("nan")}),
            "string": json.dumps({**result, "mp": "many"})}[how]
    (run / "result.json").write_text(text)
    if checksums:
        listed = json.loads((run / "checksums.json").read_text())
        listed["files"]["result.json"] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "bytes": len(text)}
        (run / "checksums.json").write_text(json.dumps(listed))


def _run_ids(root: Path) -> list[str]:
    return sorted(str(r) for r in open_study(root).run_id.values)


@pytest.mark.parametrize("checksums", [False, True], ids=["checksum", "result-check"])
@pytest.mark.parametrize("how", ["list", "nan", "string"])
def test_analyze_quarantines_a_damaged_run_says_it_and_leaves_it_out_of_the_dataset(finished, tmp_path, capsys, how,
                                                                                     checksums):
    root = _copy(finished, tmp_path)
    runs = sorted(p.name for p in (root / "runs").iterdir())
    damaged, intact = runs
    manifest = json.loads((root / "manifest.json").read_text())
    _damage(root / "runs" / damaged, how, checksums)
    capsys.readouterr()

    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 0  # a move is a change: not "bad input"
    captured = capsys.readouterr()
    lines = [x for x in captured.err.strip().splitlines() if x.startswith(("run ", "error"))]
    assert len(lines) == 1 and lines[0].startswith(f"run {damaged} damaged (result.json: "), lines
    assert f"moved to {root / 'quarantine'}/{damaged}-" in lines[0]
    assert lines[0].endswith("left out of the dataset (rerun `dynlab study group-tracking` with the same options to "
                             "train it again)")
    assert captured.out.strip().endswith(f"dataset: {root / 'dataset.nc'}")
    assert sorted(p.name for p in (root / "runs").iterdir()) == [intact]
    assert _run_ids(root) == [intact]  # the dataset lists what runs/ holds
    assert json.loads((root / "manifest.json").read_text())["run_ids"] == manifest["run_ids"]  # the study's runs

    # analysed again: the missing run is refused before anything changes (exit 2, nothing written)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: study {root}: run {damaged} is missing (moved to "), err
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before

    # the study, rerun with its options, trains it again: the dataset is whole
    assert main(["study", "group-tracking", *OPTIONS, "--out", str(root.parent), "--device", "cpu", "-q"]) == 0
    assert _run_ids(root) == runs


def test_analyze_with_every_run_damaged_removes_the_dataset_and_exits_1(finished, tmp_path, capsys):
    root = _copy(finished, tmp_path)
    runs = sorted(p.name for p in (root / "runs").iterdir())
    for rid in runs:
        _damage(root / "runs" / rid, "list", checksums=False)
    capsys.readouterr()
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert [x.split(" damaged")[0] for x in err[:-1]] == [f"run {rid}" for rid in runs]
    assert err[-1].startswith(f"error: study {root}: every run was damaged and moved to {root / 'quarantine'}; its "
                              "dataset.nc (which listed them) was removed")
    assert not (root / "dataset.nc").exists() and list((root / "runs").iterdir()) == []


def test_bad_input_found_after_analyze_changed_the_folder_is_exit_1(finished, tmp_path, capsys, monkeypatch):
    """A refusal raised once a damaged run was moved is said with what changed, exit 1."""
    import dynlab.studies

    root = _copy(finished, tmp_path)
    damaged = sorted(p.name for p in (root / "runs").iterdir())[0]
    _damage(root / "runs" / damaged, "list", checksums=False)
    base = get_study("group-tracking")

    def analyze_one(*args, **kwargs):
        raise DynlabInputError("an analysis refused its run")

    monkeypatch.setattr(dynlab.studies, "get_study", lambda name: dataclasses.replace(base, analyze_one=analyze_one))
    capsys.readouterr()
    assert main(["analyze", str(root), "--device", "cpu", "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: an analysis refused its run; dynlab analyze stopped after it had changed {root} (runs "
                       "moved to quarantine/ stay there)")


def test_bad_input_found_after_a_study_stored_a_run_is_exit_1(tmp_path):
    """The second run refuses (e.g. its text changed meanwhile) after the first was stored:
    the study stops with exit 1 and keeps the stored run; refused at the first run, nothing
    is left and it is bad input (exit 2)."""
    base = get_study("group-tracking")
    seen: list[str] = []

    def run_one(spec, device, progress):
        seen.append(spec.spec_hash())
        if len(seen) == refuse_at:
            raise DynlabInputError("this run refuses")
        return base.run_one(spec, device, progress)

    study = dataclasses.replace(base, run_one=run_one, stacking=None)
    refuse_at = 2
    with pytest.raises(DynlabStoppedError) as info:
        run_study(study, SMOKE, out=tmp_path / "a", device="cpu", analyze=False)
    assert exit_status(info.value) == (1, f"error: this run refuses; the study stopped after it had changed "
                                          f"{tmp_path / 'a' / 'group-tracking'} (its stored runs are kept: the same "
                                          "command resumes)")
    assert [p.name for p in (tmp_path / "a" / "group-tracking" / "runs").iterdir()] == [seen[0]]

    seen.clear()
    refuse_at = 1
    with pytest.raises(DynlabInputError) as info:
        run_study(study, SMOKE, out=tmp_path / "b", device="cpu", analyze=False)
    assert exit_status(info.value)[0] == 2 and not (tmp_path / "b").exists()
