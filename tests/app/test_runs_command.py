"""``dynlab runs STUDY_FOLDER``: one row per run, named by what it is (its arm, the settings
its study sweeps) and its status, as the run folders' spec.json and result.json say; the
progress lines of a study name each run the same way; a folder that is not a study is one
``error:`` line (exit code 2); the listing loads neither torch nor matplotlib."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dynlab.cli import main

TRACKING = ["--models", "tanh-rnn,mamba", "--groups", "C2,S3", "--seeds", "0,2", "--preset", "smoke", "--no-analysis"]


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> tuple[Path, list[str]]:
    """A finished smoke study of 8 runs (2 models x 2 groups x seeds 0 and 2) and the lines
    its progress printed (stderr a pipe: a plain line per finished run), made once."""
    out = tmp_path_factory.mktemp("out")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["study", "group-tracking", *TRACKING, "--out", str(out), "--device", "cpu"]) == 0
    return out / "group-tracking", err.getvalue().splitlines()


def _listed(capsys, *argv: str) -> list[list[str]]:
    """``dynlab runs ARGV`` (exit code 0, nothing on stderr): its table as rows of cells."""
    assert main(["runs", *argv]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    return [line.split() for line in captured.out.splitlines()]


def _files(root: Path) -> dict[str, tuple[dict, dict]]:
    """Each run's spec fields and result, read from its folder: run id -> (fields, result)."""
    return {p.name: (json.loads((p / "spec.json").read_text())["fields"], json.loads((p / "result.json").read_text()))
            for p in (root / "runs").iterdir()}


def _full(short: str, ids) -> str:
    match = [rid for rid in ids if rid.startswith(short)]
    assert len(match) == 1, (short, match)
    return match[0]


def test_the_rows_name_each_run_as_its_spec_json_says(tracking, capsys):
    root, _ = tracking
    files = _files(root)
    rows = _listed(capsys, str(root))
    assert rows[0] == ["run", "arch", "group", "seed", "status"]
    assert len(rows) == 1 + len(files) == 9
    manifest = json.loads((root / "manifest.json").read_text())["run_ids"]
    ids = [_full(row[0], files) for row in rows[1:]]
    assert ids == manifest  # the study's order, each run once
    for rid, (short, arch, group, seed, status) in zip(ids, rows[1:]):
        fields, result = files[rid]
        assert len(short) == 8
        assert (arch, group, int(seed), status) == (fields["model"]["arch"], fields["task"]["group"], fields["seed"],
                                                    result["status"])
    named = {(r[1], r[2], r[3]) for r in rows[1:]}
    assert named == {(a, g, s) for a in ("tanh-rnn", "mamba") for g in ("C2", "S3") for s in ("0", "2")}


def test_full_ids_and_json(tracking, capsys):
    root, _ = tracking
    files = _files(root)
    rows = _listed(capsys, str(root), "--full")
    assert {row[0] for row in rows[1:]} == set(files)
    assert main(["runs", str(root), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in listed] == [row[0] for row in rows[1:]]
    for r in listed:
        fields, result = files[r["run_id"]]
        assert r == {"run_id": r["run_id"], "arch": fields["model"]["arch"], "group": fields["task"]["group"],
                     "seed": fields["seed"], "status": result["status"], "reason": result.get("reason", "")}


def test_the_progress_lines_name_each_finished_run(tracking):
    """A plain progress line per finished run: ``run i/8 <id> [arch, group, seed s] status, ...``."""
    root, lines = tracking
    files = _files(root)
    said = {}
    for line in lines:
        m = re.match(r"group-tracking: run \d/8 ([0-9a-f]{16}) \[(.+?)\] (ok|not-learned|diverged)", line)
        if m:
            said[m.group(1)] = m.group(2)
    assert set(said) == set(files)
    for rid, label in said.items():
        fields, _ = files[rid]
        assert label == f"{fields['model']['arch']}, {fields['task']['group']}, seed {fields['seed']}"


def test_a_missing_or_damaged_run_is_said_in_its_status(tracking, tmp_path, capsys):
    root = tmp_path / "group-tracking"
    shutil.copytree(tracking[0], root)
    gone, broken = json.loads((root / "manifest.json").read_text())["run_ids"][:2]
    shutil.rmtree(root / "runs" / gone)
    (root / "runs" / broken / "result.json").write_text("{")
    rows = {row[0]: row for row in _listed(capsys, str(root), "--full")[1:]}
    assert rows[gone] == [gone, "-", "-", "-", "missing"]
    assert rows[broken][-1] == "damaged" and rows[broken][1] in ("tanh-rnn", "mamba")
    assert sum(row[-1] == "not-learned" or row[-1] == "ok" for row in rows.values()) == 6


def test_a_sweep_shows_the_settings_that_differ_between_runs(tmp_path, capsys):
    """A study folder of the context preset's specs (d_model x training length x seeds):
    the columns add what the runs sweep, named as the dataset names them."""
    from dynlab.studies import get_study
    from dynlab.runner.protocol import StudyOptions

    study = get_study("length-generalization")
    specs = study.make_specs(StudyOptions(preset="context"))
    root = tmp_path / "length-generalization"
    for spec in specs:
        (root / "runs" / spec.spec_hash()).mkdir(parents=True)
        (root / "runs" / spec.spec_hash() / "spec.json").write_text(spec.canonical_json())
        (root / "runs" / spec.spec_hash() / "result.json").write_text('{"status": "ok"}')
    (root / "manifest.json").write_text(json.dumps({"study": study.name, "preset": "context",
                                                    "run_ids": [s.spec_hash() for s in specs]}))
    rows = _listed(capsys, str(root))
    assert rows[0] == ["run", "arch", "intervention", "seed", "d_model", "train_length", "steps", "status"]
    for spec, row in zip(specs, rows[1:]):
        assert spec.spec_hash().startswith(row[0])
        assert row[1:-1] == [spec.model.mixer, spec.intervention.kind, str(spec.seed), str(spec.model.d_model),
                             str(spec.train.seq_len), str(spec.train.steps)]
    assert len({tuple(r[1:]) for r in rows[1:]}) == len(specs)  # the names tell every run apart


@pytest.mark.slow
def test_a_language_model_study_is_named_by_mixer_intervention_and_seed(tmp_path, capsys):
    assert main(["study", "length-generalization", "--preset", "smoke", "--seeds", "0,2", "--out", str(tmp_path),
                 "--device", "cpu", "-q"]) == 0
    capsys.readouterr()
    root = tmp_path / "length-generalization"
    files = _files(root)
    rows = _listed(capsys, str(root), "--full")
    assert rows[0] == ["run", "arch", "intervention", "seed", "status"] and len(rows) == 5
    for rid, arch, intervention, seed, status in rows[1:]:
        fields, result = files[rid]
        assert (arch, intervention, int(seed), status) == (fields["model"]["mixer"], fields["intervention"]["kind"],
                                                           fields["seed"], result["status"])


def _refused(capsys, *argv: str) -> str:
    assert main(["runs", *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert captured.out == "" and len(err) == 1 and err[0].startswith("error: "), captured
    return err[0]


def test_a_folder_that_is_not_a_study_is_one_line_and_exit_code_2(tracking, tmp_path, capsys):
    assert "does not exist" in _refused(capsys, str(tmp_path / "nowhere"))
    (tmp_path / "notes.txt").write_text("x")
    assert "is not a folder" in _refused(capsys, str(tmp_path / "notes.txt"))
    assert "is not a study folder (no manifest.json, no runs/)" in _refused(capsys, str(tmp_path))
    assert "empty path" in _refused(capsys, "")
    out = tracking[0].parent  # the --out folder, not the study's: the line names the study in it
    assert _refused(capsys, str(out)).endswith(f"allowed: one of the study folders in it, {out / 'group-tracking'}")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("not json")
    assert "unreadable manifest.json" in _refused(capsys, str(broken))
    (broken / "manifest.json").write_text('{"run_ids": ["../../elsewhere"]}')
    assert "'../../elsewhere' is not a run id" in _refused(capsys, str(broken))


#: Lists a study's runs through dynlab.cli.main in a fresh process; prints its exit code and
#: whether torch or matplotlib is loaded by then.
PROBE = r"""
import contextlib, io, json, sys
from dynlab.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(["runs", sys.argv[1]])
print(json.dumps([code, len(out.getvalue().splitlines()), "torch" in sys.modules, "matplotlib" in sys.modules]))
"""


def test_the_listing_loads_neither_torch_nor_matplotlib(tracking, tmp_path):
    res = subprocess.run([sys.executable, "-c", PROBE, str(tracking[0])], capture_output=True, text=True, cwd=tmp_path,
                         check=True)
    assert json.loads(res.stdout) == [0, 9, False, False]


def test_settings_that_share_a_name_are_named_by_their_path():
    """Two swept fields with one last name are shown by their paths; a spec class without an
    arm is named by what its runs sweep; a setting its runs share is no column."""
    from dynlab.results.naming import arm_label, run_names

    runs = [("ToySpec", {"seed": s, "lr": 0.1, "train": {"steps": n}, "post": {"steps": m}})
            for s, n, m in ((0, 1, 2), (1, 3, 2.5))]
    columns, rows = run_names(runs)
    assert columns == ["post.steps", "seed", "train.steps"]
    assert [arm_label(r) for r in rows] == ["post.steps 2, seed 0, train.steps 1", "post.steps 2.5, seed 1, train.steps 3"]


def test_every_study_names_its_runs_as_its_dataset_does():
    """Each study's spec class has an arm, each arm's field is in its specs, and each value is
    the one the study dataset gives the coordinate of that name (its SPEC_COORDS)."""
    from dynlab.lm.dataset import SPEC_COORDS as LM_COORDS
    from dynlab.results.naming import ARM_FIELDS, flat_fields
    from dynlab.studies import CATALOG, get_study
    from dynlab.runner.protocol import StudyOptions
    from dynlab.tracking.dataset import SPEC_COORDS as TRACKING_COORDS

    for name in CATALOG:
        study = get_study(name)
        for spec in study.make_specs(study.prepared(StudyOptions(preset="smoke"))):
            arm = ARM_FIELDS[type(spec).__name__]
            flat = flat_fields(spec.hashed_fields())
            coords = TRACKING_COORDS if type(spec).__name__ == "RunSpec" else LM_COORDS
            for coord, path in arm.items():
                assert flat[path] == coords[coord](spec), (name, coord)
