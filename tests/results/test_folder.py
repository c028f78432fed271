"""The study folder's contract (dynlab.results.folder): a marker written first, run ids
checked before any path is formed, no path outside the study touched, no link followed,
someone else's folder refused before anything is written; a rerun with other options
refused naming the option; one writer at a time (the lock); manifests read as untrusted
input (repeated run ids, options that do not make the runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

from dynlab.cli import main
from dynlab.errors import DynlabInputError
from dynlab.results import RunStore
from dynlab.results.folder import LOCK, MARKER, check_owned_folder, check_run_id, check_study_folder, inside
from dynlab.runner.driver import analyze_study, open_study, run_study
from dynlab.runner.protocol import RunOutcome, RunResult, Study, StudyOptions
from dynlab.tracking.spec import ModelSpec, RunSpec, TaskSpec

from helpers.paths import REPO as ROOT


def _spec(seed: int) -> RunSpec:
    return RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=4), seed=seed)


def _make_specs(options: StudyOptions) -> list[RunSpec]:
    default = (0, 1) if options.preset == "smoke" else (0, 1, 2)
    return [_spec(s) for s in (options.seeds if options.seeds is not None else default)]


def _tiny_study() -> Study:
    """Runs that take no training (weights of zeros), an analysis of one variable; the
    ``quick`` preset makes three runs, ``smoke`` two."""

    def run_one(spec, device, progress):
        return RunOutcome(RunResult(status="ok", train_steps=1), {"w": torch.zeros(3)})

    def analyze_one(spec, store, device, progress, extra):
        return xr.Dataset({"q": ("t", np.arange(4.0))})

    def assemble(specs, store, options):
        return xr.Dataset({"seed": ("run", np.array([s.seed for s in specs]))})

    return Study(name="tiny", presets=("smoke", "quick"), make_specs=_make_specs, run_one=run_one,
                 assemble=assemble, analyze_one=analyze_one, spec_type=RunSpec)


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders and links)."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in sorted(folder.rglob("*"))}


def _study(tmp_path: Path, **options) -> Path:
    run_study(_tiny_study(), StudyOptions(preset="smoke", **options), out=tmp_path / "out", device="cpu")
    return tmp_path / "out" / "tiny"


# -- the marker, someone else's folder ---------------------------------------------------

def test_a_study_writes_its_marker_and_without_it_the_folder_is_not_dynlabs(tmp_path):
    root = _study(tmp_path)
    assert json.loads((root / MARKER).read_text())["study"] == "tiny"
    assert sorted(os.listdir(root)) == sorted([MARKER, LOCK, "dataset.nc", "manifest.json", "runs"])
    assert check_study_folder(root, "tiny") is True
    (root / MARKER).unlink()  # dynlab's files, but not the marker: only the marker says dynlab wrote them
    before = _tree(tmp_path)
    refused = rf"^(--out )?{root} holds files dynlab did not write \(dataset.nc\); allowed: a new or empty folder"
    with pytest.raises(DynlabInputError, match=refused):
        check_study_folder(root, "tiny")
    with pytest.raises(DynlabInputError, match=refused):
        run_study(_tiny_study(), StudyOptions(preset="smoke"), out=tmp_path / "out", device="cpu")
    with pytest.raises(DynlabInputError, match=refused):
        analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert _tree(tmp_path) == before


def test_a_fresh_folder_being_made_is_fine(tmp_path):
    """No marker yet, only what making a study leaves before it: the lock, an empty
    ``runs/`` (a write probe's), a probe's hidden temporary folder."""
    root = tmp_path / "out" / "tiny"
    (root / "runs" / f".tmp-{'0' * 64}-host-1").mkdir(parents=True)
    (root / LOCK).write_text("")
    assert check_study_folder(root, "tiny") is False
    run_study(_tiny_study(), StudyOptions(preset="smoke"), out=tmp_path / "out", device="cpu")
    assert json.loads((root / MARKER).read_text())["study"] == "tiny"


@pytest.mark.parametrize("files, first", [
    ({"thesis.tex": "mine"}, "thesis.tex"),
    ({"manifest.json": '{"mine": 1}', "dataset.nc": "mine"}, "dataset.nc"),
    ({"manifest.json": '{"study": "tiny", "preset": "smoke", "run_ids": []}'}, "manifest.json"),
    ({"runs/0123456789abcdef/spec.json": "{}"}, "runs/0123456789abcdef"),
    ({"dataset.nc": "mine"}, "dataset.nc"),
    ({"runs/notes.txt": "mine"}, "runs/notes.txt"),
    ({"b.txt": "mine", "a.txt": "mine"}, "a.txt"),
])
def test_a_folder_of_other_files_is_refused_before_anything_is_written(tmp_path, files, first):
    root = tmp_path / "out" / "tiny"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    before = _tree(tmp_path)
    with pytest.raises(DynlabInputError, match=rf"^--out {root} holds files dynlab did not write \({first}\); "
                                               r"allowed: a new or empty folder"):
        run_study(_tiny_study(), StudyOptions(preset="smoke"), out=tmp_path / "out", device="cpu")
    assert _tree(tmp_path) == before


def test_the_command_line_refuses_a_folder_of_other_files_in_one_line(tmp_path, capsys):
    (tmp_path / "group-tracking").mkdir()
    (tmp_path / "group-tracking" / "thesis.tex").write_text("mine")
    before = _tree(tmp_path)
    argv = ["study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn", "--out", str(tmp_path), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path / 'group-tracking'} holds files dynlab did not write (thesis.tex)")
    assert err.count("\n") == 1 and _tree(tmp_path) == before


def test_an_empty_folder_or_a_marked_one_is_fine_and_another_studys_marker_is_not(tmp_path):
    root = tmp_path / "tiny"
    root.mkdir()
    assert check_study_folder(root, "tiny") is False
    (root / MARKER).write_text(json.dumps({"study": "copying"}))
    with pytest.raises(DynlabInputError, match="is the folder of study 'copying', not of 'tiny'"):
        check_study_folder(root, "tiny")


# -- run ids and paths -------------------------------------------------------------------

def test_a_manifest_entry_outside_the_study_is_refused_and_nothing_outside_is_touched(tmp_path, capsys):
    root = _study(tmp_path)
    victim = tmp_path / "victim" / "runs" / "x"
    victim.mkdir(parents=True)
    (victim / "spec.json").write_text("{}")
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["run_ids"].append("../../victim/runs/x")
    (root / "manifest.json").write_text(json.dumps(manifest))
    before = _tree(tmp_path)
    with pytest.raises(DynlabInputError) as err:
        analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert str(err.value) == (f"broken study manifest {root / 'manifest.json'}: '../../victim/runs/x' is not a run id; "
                              "allowed: 16 lowercase hex digits (the run folders' names)")
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("bad", ["../x", "0123456789ABCDEF", "0123456789abcde", "/etc", "", 7, None, "0123456789abcdef/.."])
def test_run_ids_are_checked_before_a_path_is_formed(tmp_path, bad):
    with pytest.raises(DynlabInputError, match="is not a run id"):
        check_run_id(bad)
    with pytest.raises(DynlabInputError, match="is not a run id"):
        RunStore(tmp_path).inspect(bad)
    assert check_run_id("0123456789abcdef") == "0123456789abcdef"


def test_inside_refuses_a_path_that_resolves_outside(tmp_path):
    (tmp_path / "study").mkdir()
    assert inside(tmp_path / "study", tmp_path / "study" / "runs" / "a") == tmp_path / "study" / "runs" / "a"
    with pytest.raises(DynlabInputError, match="leads outside the study folder"):
        inside(tmp_path / "study", tmp_path / "study" / ".." / "victim")


def test_links_are_never_followed_out_of_a_study(tmp_path):
    root = _study(tmp_path)
    rid = json.loads((root / "manifest.json").read_text())["run_ids"][0]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "analysis.nc").write_bytes(b"precious")
    # a file of a run that is a link: damage of the run, the link moved aside, its target untouched
    (root / "runs" / rid / "analysis.nc").unlink()
    (root / "runs" / rid / "analysis.nc").symlink_to(outside / "analysis.nc")
    damage = RunStore(root).inspect(rid)
    assert damage is not None and damage.why == "analysis.nc: a symbolic link" and not damage.core
    analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert (outside / "analysis.nc").read_bytes() == b"precious" and not (root / "runs" / rid / "analysis.nc").is_symlink()
    # a run folder that is a link, and a runs/ that is one: refused
    os.rename(root / "runs" / rid, outside / rid)
    (root / "runs" / rid).symlink_to(outside / rid)
    with pytest.raises(DynlabInputError, match="is a symbolic link; dynlab does not follow links"):
        RunStore(root).inspect(rid)
    before, stamp = _tree(outside), os.stat(outside / rid).st_mtime_ns
    with pytest.raises(DynlabInputError, match=rf"holds a symbolic link runs/{rid}; dynlab does not follow links"):
        analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert _tree(outside) == before and os.stat(outside / rid).st_mtime_ns == stamp  # not even probed through
    (root / "runs" / rid).unlink()
    os.rename(root / "runs", outside / "runs")
    (root / "runs").symlink_to(outside / "runs")
    before = _tree(outside)
    with pytest.raises(DynlabInputError, match="holds a symbolic link runs"):
        analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert _tree(outside) == before


# -- dynlab figures --out ----------------------------------------------------------------

def test_figures_never_overwrite_a_users_files(tmp_path, capsys):
    from dynlab.app.figures import FIGURE_FILES, figure_notes_of_dynlab

    pics = tmp_path / "mypics"
    pics.mkdir()
    (pics / "NOTES.txt").write_text("my own notes\n")
    (pics / "holiday.png").write_bytes(b"png")
    before = _tree(tmp_path)
    assert main(["figures", str(tmp_path / "nostudy"), "--out", str(pics)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: --out {pics} holds files this command did not write (NOTES.txt, holiday.png); "
                   "allowed: a new or empty folder, or one `dynlab figures` wrote\n")
    assert _tree(tmp_path) == before
    # a figure folder written before the marker existed: its NOTES.txt is dynlab's
    old = tmp_path / "old"
    old.mkdir()
    (old / "accuracy_C2.png").write_bytes(b"png")
    (old / "NOTES.txt").write_text("q_C2: skipped (q curves needs q (absent from the dataset))\n")
    assert figure_notes_of_dynlab(old)
    check_owned_folder(old, ".dynlab-figures", FIGURE_FILES, "--out", "x", legacy=figure_notes_of_dynlab)
    (old / "NOTES.txt").write_text("all panels drawn\n")
    check_owned_folder(old, ".dynlab-figures", FIGURE_FILES, "--out", "x", legacy=figure_notes_of_dynlab)


# -- a rerun with other options ----------------------------------------------------------

@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_without_its_manifest_a_study_still_keeps_its_runs(tmp_path, damage):
    """A missing or unreadable manifest.json: options that leave out a finished run in
    runs/ are refused (the rerun would write a dataset without it); the same or more runs
    resume and rewrite the manifest."""
    root = _study(tmp_path)  # seeds 0 and 1
    if damage == "missing":
        (root / "manifest.json").unlink()
    else:
        (root / "manifest.json").write_text("garbage")
    before = _tree(root)
    with pytest.raises(DynlabInputError, match=r"holds 1 finished runs these options leave out .*manifest.json is "
                                               "missing or unreadable: rerunning would write a dataset without them"):
        run_study(_tiny_study(), StudyOptions(preset="smoke", seeds=(1,)), out=tmp_path / "out", device="cpu")
    assert _tree(root) == before
    run_study(_tiny_study(), StudyOptions(preset="smoke"), out=tmp_path / "out", device="cpu")
    assert sorted(open_study(root)["seed"].values.tolist()) == [0, 1]


def test_a_rerun_with_other_options_is_refused_naming_the_option(tmp_path, capsys):
    root = _study(tmp_path)
    before = _tree(root)
    with pytest.raises(DynlabInputError) as err:
        run_study(_tiny_study(), StudyOptions(preset="smoke", seeds=(5,)), out=tmp_path / "out", device="cpu")
    assert str(err.value) == (f"--out {root} was run with --seeds the preset's default, this run asks --seeds 5: "
                              "rerunning would replace its dataset and manifest; allowed: the same options (resumes "
                              "the study), or another --out")
    with pytest.raises(DynlabInputError, match=r"was run with --seeds the preset's default, this run asks --seeds 0: "):
        run_study(_tiny_study(), StudyOptions(preset="smoke", seeds=(0,)), out=tmp_path / "out", device="cpu")
    assert _tree(root) == before
    # the same runs in other words resume the study
    run_study(_tiny_study(), StudyOptions(preset="smoke", seeds=(1, 0)), out=tmp_path / "out", device="cpu")
    assert sorted(open_study(root)["seed"].values.tolist()) == [0, 1]
    # more runs extend it, with a note: every earlier run stays in the dataset
    capsys.readouterr()
    run_study(_tiny_study(), StudyOptions(preset="quick"), out=tmp_path / "out", device="cpu")
    assert sorted(open_study(root)["seed"].values.tolist()) == [0, 1, 2]
    assert f"note: {root} holds a study of 2 runs; these options add 1 runs to it" in capsys.readouterr().err
    with pytest.raises(DynlabInputError, match=r"was run with --preset quick, this run asks --preset smoke: "):
        run_study(_tiny_study(), StudyOptions(preset="smoke"), out=tmp_path / "out", device="cpu")


@pytest.mark.slow
def test_the_command_line_refuses_a_rerun_with_other_models(tmp_path, capsys):
    base = ["study", "group-tracking", "--preset", "smoke", "--groups", "C2", "--seeds", "0", "--no-analysis", "-q",
            "--device", "cpu", "--out", str(tmp_path)]
    assert main([*base, "--models", "tanh-rnn"]) == 0
    before = _tree(tmp_path)
    capsys.readouterr()
    assert main([*base, "--models", "mamba"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {tmp_path / 'group-tracking'} was run with --models tanh-rnn, this run asks "
                          "--models mamba: ") and err.count("\n") == 1
    assert _tree(tmp_path) == before


# -- one writer at a time ----------------------------------------------------------------

_WRITER = '''
import sys, time
import numpy as np, torch, xarray as xr
from dynlab.runner.driver import run_study
from dynlab.runner.protocol import RunOutcome, RunResult, Study, StudyOptions
from dynlab.tracking.spec import ModelSpec, RunSpec, TaskSpec

def spec(seed):
    return RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=4), seed=seed)

def run_one(s, device, progress):
    time.sleep(0.5)
    return RunOutcome(RunResult(status="ok", train_steps=1), {"w": torch.zeros(3)})

def assemble(specs, store, options):
    return xr.Dataset({"seed": ("run", np.array([s.seed for s in specs]))})

seeds = tuple(int(x) for x in sys.argv[2].split(","))
study = Study(name="tiny", presets=("smoke",), make_specs=lambda o: [spec(s) for s in o.seeds],
              run_one=run_one, assemble=assemble, spec_type=RunSpec)
from dynlab.errors import DynlabInputError
try:
    run_study(study, StudyOptions(preset="smoke", seeds=seeds), out=sys.argv[1], device="cpu")
except DynlabInputError as exc:
    print("refused:", exc, file=sys.stderr)
    sys.exit(2)
'''


def test_two_studies_at_once_into_one_folder_never_lose_a_run_silently(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(textwrap.dedent(_WRITER))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": ""}
    procs = [subprocess.Popen([sys.executable, str(script), str(out), seeds], stderr=subprocess.PIPE, text=True, env=env)
             for seeds in ("0,1,2", "3,4,5")]
    results = [(p.returncode, err) for p in procs for _, err in [p.communicate(timeout=120)]]
    codes = sorted(code for code, _ in results)
    ds = open_study(out / "tiny")
    stored = sorted(ds["seed"].values.tolist())
    if codes == [0, 0]:  # one after the other: then the second saw the first's manifest and was refused... or not
        pytest.fail(f"both wrote into one study folder: {results}")
    assert codes == [0, 2], results
    refused = next(err for code, err in results if code == 2)
    assert refused.startswith("refused: ") and refused.count("\n") == 1
    assert "being written by another dynlab process" in refused or "rerunning would replace" in refused
    winner = next(i for i, (code, _) in enumerate(results) if code == 0)
    assert stored == [[0, 1, 2], [3, 4, 5]][winner]  # every run of the study that wrote is in its dataset


# -- manifests as untrusted input --------------------------------------------------------

def test_a_repeated_run_id_is_used_once_with_a_note(tmp_path, capsys):
    root = _study(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["run_ids"] = manifest["run_ids"] + manifest["run_ids"][:1]
    (root / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    ds = open_study(analyze_study(root, lambda name: _tiny_study(), device="cpu"))
    assert sorted(ds["seed"].values.tolist()) == [0, 1]
    err = capsys.readouterr().err
    assert f"note: study manifest {root / 'manifest.json'} lists run {manifest['run_ids'][0]} 2 times; each is used once" in err


def test_an_edited_preset_in_a_manifest_is_refused(tmp_path):
    root = _study(tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(json.dumps({**manifest, "preset": "quick"}))
    before = _tree(root)
    with pytest.raises(DynlabInputError, match=r"broken study manifest .*: its options \(preset 'quick', .*\) do not "
                                               r"match its runs \(they make 1 runs it lacks\)"):
        analyze_study(root, lambda name: _tiny_study(), device="cpu")
    assert _tree(root) == before


@pytest.mark.parametrize("extra, line", [
    ({"train": {"steps": -3}}, "invalid TrainSpec: steps: Input should be greater than or equal to 1"),
    ({"model": {"hidden": 0}}, "invalid ModelSpec: hidden: Input should be greater than or equal to 1"),
    ({"eval": {"lengths": [0, 5]}}, "invalid EvalSpec: lengths: lengths must be positive integers, got [0, 5]"),
])
def test_a_bad_value_from_the_python_api_is_one_line_of_bad_input(extra, line, tmp_path):
    """run_study with a value its specs refuse: a DynlabInputError of one line (as the command
    line says it), not pydantic's multi-line ValidationError; nothing written."""
    from dynlab.studies import get_study

    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C2",), **extra})
    with pytest.raises(DynlabInputError) as err:
        run_study(get_study("group-tracking"), options, out=tmp_path / "out", device="cpu")
    assert str(err.value) == line
    assert not (tmp_path / "out").exists()
