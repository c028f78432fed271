"""The command line: errors are one line with exit code 2 and write nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynlab.cli import main
from dynlab.runner.driver import open_study

BAD_INPUTS = [
    (["study", "group-tracking", "--models", "lstm9000"], "unknown model 'lstm9000'; allowed: all, mamba"),
    (["study", "group-tracking", "--groups", "Q8"], "unknown group 'Q8'"),
    (["study", "group-tracking", "--groups", "C100000"], "group 'C100000' is too large: its order exceeds 5040"),
    (["study", "group-tracking", "--groups", "C1000000"], "allowed: order ≤ 5040"),
    (["study", "group-tracking", "--groups", "S3,C2xC600"], "allowed: at most 512 points"),
    (["study", "group-tracking", "--preset", "huge"], "unknown preset 'huge'"),
    (["study", "group-tracking", "--seeds", "x"], "seeds must be"),
    (["study", "group-tracking", "--seeds", "-1"], "seeds must be ≥ 0"),
    (["study", "group-tracking", "--seeds", "99999999999999999999"], "seeds must be ≥ 0 and < 2**63"),
    (["study", "group-tracking", "--device", "tpu"], "unknown device 'tpu'"),
    (["study", "nonexistent-study"], "No such command"),
    (["analyze", "{out}/missing"], "not a dynlab study folder"),
]


@pytest.mark.parametrize("argv,message", BAD_INPUTS, ids=[" ".join(a[:3]) for a, _ in BAD_INPUTS])
def test_bad_input_one_line_exit_2_nothing_written(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    argv = [a.replace("{out}", str(out)) for a in argv]
    if argv[0] == "study" and len(argv) > 2:
        argv += ["--out", str(out), "-q"]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_console_script_from_any_folder(tmp_path):
    exe = Path(sys.executable).with_name("dynlab")
    if not exe.exists():
        pytest.skip("console script not installed in this environment")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(exe), "study", "group-tracking", "--models", "nope"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert res.returncode == 2 and res.stderr.startswith("error: unknown model") and "Traceback" not in res.stderr
    res = subprocess.run([str(exe), "models"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert res.returncode == 0
    rows = {line.split()[0]: line.split()[1:] for line in res.stdout.splitlines()[1:]}
    assert rows["tanh-rnn"] == ["state-dependent", "state-dependent"]
    assert rows["mamba"] == ["affine", "affine"]


@pytest.mark.slow
def test_tiny_end_to_end_study_then_analyze(tmp_path, capsys):
    code = main(["study", "group-tracking", "--models", "tanh-rnn,mamba", "--groups", "C2,S3", "--preset", "smoke", "--out", str(tmp_path), "--device", "cpu", "-q"])
    assert code == 0
    study_dir = tmp_path / "group-tracking"
    ds = open_study(study_dir)
    assert ds.sizes["run"] == 4
    assert set(ds.arch.values) == {"tanh-rnn", "mamba"} and set(ds.group.values) == {"C2", "S3"}
    assert ds.q.dims == ("run", "t") and ds.q.sizes["t"] == 60
    assert set(ds.failure_mode.values) <= {"saturation", "climb", "robust"}
    before = ds.q.values.copy()
    assert main(["analyze", str(study_dir), "--device", "cpu", "-q"]) == 0
    again = open_study(study_dir)
    assert (again.q.values == before).all()  # recomputed analyses are deterministic


def test_study_list_and_help(capsys):
    assert main(["study", "list"]) == 0
    out = capsys.readouterr().out
    assert "group-tracking" in out and "quick" in out


def test_broken_study_folders_and_paths_give_one_line(tmp_path, capsys):
    study = tmp_path / "study"
    study.mkdir()
    (study / "manifest.json").write_text("[1]")
    assert main(["analyze", str(study)]) == 2
    assert "broken study manifest" in capsys.readouterr().err
    (study / "manifest.json").write_text('{"study": "group-tracking", "preset": "smoke", "run_ids": ["abc"]}')
    assert main(["analyze", str(study)]) == 2
    assert "'abc' is not a run id; allowed: 16 lowercase hex digits" in capsys.readouterr().err
    _damaged_study(tmp_path)  # its one run is damaged: moved to quarantine/ (a change: exit 1, not 2)
    assert main(["analyze", str(study)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"run {RID} damaged (result.json: missing or unreadable; spec.json: does not hash to "
                             "the run id); moved to ")
    assert err[1].startswith(f"error: study {study}: every run was damaged and moved to ")
    junk = tmp_path / "junk.nc"
    junk.write_bytes(b"not netcdf")
    assert main(["figures", str(junk), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: unreadable dataset {junk} (") and len(err.strip().splitlines()) == 1
    assert "allowed: a study folder holding dataset.nc, or a netCDF .nc file" in err
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "--out", str(a_file), "-q"]) == 2
    assert "cannot write the study" in capsys.readouterr().err
    assert main(["bench", "train", "--quick", "--json", str(a_file / "x.json")]) == 2
    assert "a_file is a file, not a folder; allowed: " in capsys.readouterr().err


# -- an output folder that cannot receive files is bad input, refused before anything runs -----------------------

def _file_parent(tmp_path: Path) -> tuple[Path, str]:
    """An output folder below a regular file: it cannot be made, even by root."""
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    return blocker / "out", f"cannot be made ({blocker} is a file)"


@pytest.fixture
def read_only(tmp_path):
    """An existing folder (holding kept.txt) this process cannot write in; skipped where it
    can (root ignores the permission bits)."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    (folder / "kept.txt").write_text("keep me")
    folder.chmod(0o555)
    try:
        (folder / "probe").write_text("x")
    except PermissionError:
        yield folder
    else:
        (folder / "probe").unlink()
        pytest.skip("this process can write in a 0o555 folder (root): see the file-parent case")
    finally:
        folder.chmod(0o755)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


OUT_COMMANDS = {
    "figures": ["figures", "{tmp}/no-study", "--out", "{out}"],
    "post-train": ["lm", "post-train", "--checkpoint", "{tmp}/no-checkpoint", "--out", "{out}"],
}


@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_out_below_a_file_is_one_line_exit_2(command, tmp_path, capsys):
    out, why = _file_parent(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{out}", str(out)) for a in OUT_COMMANDS[command]]
    before = _listing(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {out} {why}; allowed: a writable folder (made when missing)"
    assert _listing(tmp_path) == before


@pytest.mark.parametrize("command", sorted(OUT_COMMANDS))
def test_read_only_out_is_one_line_exit_2_and_keeps_its_files(command, tmp_path, read_only, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{out}", str(read_only)) for a in OUT_COMMANDS[command]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --out {read_only} is not writable (") and len(err.splitlines()) == 1, err
    assert _listing(read_only) == {"kept.txt": b"keep me"}


def test_study_out_below_a_file_or_read_only_is_one_line_exit_2(tmp_path, capsys):
    argv = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "-q", "--out"]
    out, why = _file_parent(tmp_path)
    assert main([*argv, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: cannot write the study: {out / 'group-tracking'} {why}; "
                   "allowed: a writable --out folder")
    assert _listing(tmp_path) == {"a_file": b"keep me"}


def test_study_and_analyze_in_a_read_only_folder_are_one_line_exit_2(tmp_path, read_only, capsys):
    argv = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "-q", "--out"]
    assert main([*argv, str(read_only)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot write the study: {read_only / 'group-tracking'} cannot be made "
                          f"({read_only} is not writable: ")
    study = read_only / "study"
    read_only.chmod(0o755)
    (study / "runs").mkdir(parents=True)
    (study / "manifest.json").write_text('{"study": "group-tracking", "preset": "smoke", "run_ids": []}')
    study.chmod(0o555)
    read_only.chmod(0o555)
    try:
        assert main(["analyze", str(study), "-q"]) == 2
    finally:
        study.chmod(0o755)
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot write the study: {study} is not writable (") and len(err.splitlines()) == 1
    assert (study / "manifest.json").read_text().startswith('{"study": "group-tracking"')


# -- analyze checks the manifest's options (and the device) before it heals anything -----------------------------

def _snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every path under ``folder``: (bytes for a file, None for a folder) and mtime in ns."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


#: The one run of the manifest of :func:`_damaged_study` (its options make it); its groups sit
#: beside ``extra``, as manifests were written before they were the study's own option.
SOUND = {"study": "group-tracking", "preset": "smoke", "models": ["tanh-rnn"], "groups": ["C2"], "seeds": [0]}
RID = "6f20a8bc8e64ed1c"


def _damaged_study(tmp_path: Path, **manifest) -> Path:
    """A study folder whose one run is damaged (analyze would quarantine it) and whose
    manifest holds ``manifest`` on top of valid study/preset/run_ids."""
    import json

    from dynlab.results.folder import MARKER

    study = tmp_path / "study"
    (study / "runs" / RID).mkdir(parents=True, exist_ok=True)
    (study / MARKER).write_text(json.dumps({"dynlab": "study folder", "study": "group-tracking"}))
    (study / "runs" / RID / "spec.json").write_text('{"no": "fields"}')
    (study / "manifest.json").write_text(json.dumps({**SOUND, "run_ids": [RID], **manifest}))
    return study


@pytest.mark.regression_pin
def test_the_sound_manifest_makes_its_run():
    """Pins: RID, the run id (spec hash) dynlab makes for the smoke preset's tanh-rnn on C2,
    seed 0, which this file's damaged study folders and REAL_ID in
    tests/results/test_folder_properties.py use.  Regenerate (only when run ids change on
    purpose): print the ``spec_hash()`` this test computes and update both constants."""
    from dynlab.studies import get_study
    from dynlab.runner.protocol import StudyOptions

    options = StudyOptions(preset="smoke", models=("tanh-rnn",), seeds=(0,), extra={"groups": ("C2",)})
    assert [s.spec_hash() for s in get_study("group-tracking").make_specs(options)] == [RID]


@pytest.mark.parametrize("manifest,argv,message", [
    ({"extra": {"no_such_option": 1}}, [], "study group-tracking: unknown option 'no_such_option'; allowed: "),
    ({"extra": {"analysis": "huge"}}, [], "study group-tracking: bad option 'analysis'"),
    ({"extra": [1]}, [], "'extra' is [1]; allowed: a mapping or null"),
    ({"models": "tanh-rnn"}, [], "'models' is 'tanh-rnn'; allowed: a list of names or null"),
    ({"groups": "C2"}, [], "study group-tracking: bad option 'groups'"),
    ({"seeds": [0, -1]}, [], "'seeds' is [0, -1]; allowed: a list of integers >= 0 or null"),
    ({"preset": "huge"}, [], "unknown preset 'huge' for study group-tracking"),
    ({}, ["--device", "tpu"], "unknown device 'tpu'"),
], ids=["unknown-option", "bad-option", "extra-not-a-mapping", "models-not-a-list", "groups-not-a-list", "negative-seed", "preset",
        "device"])
def test_analyze_refuses_a_broken_manifest_before_it_heals_a_run(tmp_path, capsys, manifest, argv, message):
    study = _damaged_study(tmp_path, **manifest)
    before = _snapshot(study)
    assert main(["analyze", str(study), "-q", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and message in err, err
    assert _snapshot(study) == before  # the damaged run is where it was: no quarantine/, nothing rewritten
    # with a sound manifest and device the same folder is healed (the run moved to quarantine/): exit 1, not 2
    _damaged_study(tmp_path)
    assert main(["analyze", str(study), "-q"]) == 1
    assert f"run {RID} damaged" in capsys.readouterr().err
    assert not (study / "runs" / RID).exists() and len(list((study / "quarantine").iterdir())) == 1
