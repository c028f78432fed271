"""The command line: errors are one line with exit code 2 and write nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynlab.cli import main
from dynlab.runner import open_study

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
    (study / "runs" / "abc").mkdir(parents=True)
    (study / "runs" / "abc" / "spec.json").write_text('{"no": "fields"}')
    assert main(["analyze", str(study)]) == 2
    err = capsys.readouterr().err
    assert "run abc damaged (result.json: missing or unreadable; spec.json: does not hash to the run id)" in err
    assert len(err.strip().splitlines()) == 1
    junk = tmp_path / "junk.nc"
    junk.write_bytes(b"not netcdf")
    assert main(["figures", str(junk), "--out", str(tmp_path / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unreadable study dataset") and len(err.strip().splitlines()) == 1
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert main(["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "--out", str(a_file), "-q"]) == 2
    assert "cannot write the study" in capsys.readouterr().err
    assert main(["bench", "train", "--quick", "--json", str(a_file / "x.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
