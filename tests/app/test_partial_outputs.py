"""A command that fails midway (a full disk, simulated by a write raising ENOSPC) leaves no
partial output: ``lm export`` writes beside its folder and renames at the end (a fresh
export leaves nothing, a re-export leaves the earlier one whole); a failed ``lm
post-train`` leaves no run folder and no empty ``post-train/runs/``; a post-training run
left without its evaluation is made again, not reused.  ``lm post-train --out`` naming the
``post-train/`` folder of an earlier ``--out`` is refused instead of nesting a second one."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from helpers.lm_runs import smoke_lm_run
from helpers.optional import need_transformers

from dynlab.cli import main

POST = ["--steps", "2", "--batch-size", "2", "--eval-multiple", "2", "--samples", "2", "--device", "cpu"]


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    return smoke_lm_run(tmp_path_factory.mktemp("lg"), steps=3)


def test_a_fresh_export_that_fails_midway_leaves_nothing(lm_run, tmp_path, capsys, monkeypatch):
    need_transformers()
    import transformers.modeling_utils

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _enospc)  # the weights' write: a full disk
    dest = tmp_path / "a" / "hf"
    assert main(["lm", "export", str(lm_run), str(dest)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no folder with the marker and config but no weights, no folder made


def test_a_reexport_that_fails_midway_leaves_the_earlier_export_whole(lm_run, tmp_path, capsys, monkeypatch):
    need_transformers()
    import transformers.modeling_utils

    dest = tmp_path / "hf"
    assert main(["lm", "export", str(lm_run), str(dest)]) == 0
    before = _tree(tmp_path)
    assert "hf/model.safetensors" in before
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", _enospc)
    assert main(["lm", "export", str(lm_run), str(dest), "--dtype", "float64"]) == 1
    capsys.readouterr()
    assert _tree(tmp_path) == before  # the float32 export, every file as it was; no temporary folder beside it
    monkeypatch.undo()
    assert main(["lm", "export", str(lm_run), str(dest), "--dtype", "float64"]) == 0  # replaced once it can be
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (dest / "model.safetensors").is_file()


@pytest.mark.parametrize("where", ["run", "dataset"])
def test_a_post_training_that_fails_midway_leaves_no_folders(lm_run, tmp_path, capsys, monkeypatch, where):
    import dynlab.results.schema
    import dynlab.results.store

    if where == "run":  # the run's own files cannot be written
        monkeypatch.setattr(dynlab.results.store, "write_bytes_new", _enospc)
    else:  # the run is stored, its evaluation (dataset.nc) cannot be written
        monkeypatch.setattr(dynlab.results.schema, "write_netcdf", _enospc)
    out = tmp_path / "out"
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(out)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    # no empty post-train/runs/, no run without its evaluation: only the training state, kept so
    # that the rerun does not train again
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left and all(p.startswith("out/post-train/resume/") for p in left), left
    assert not (out / "post-train" / "runs").exists()
    monkeypatch.undo()
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(out)]) == 0
    (run,) = (out / "post-train" / "runs").iterdir()
    assert (run / "dataset.nc").is_file()
    assert not (out / "post-train" / "resume").exists()  # removed once the run is stored


def test_a_post_training_run_left_without_its_evaluation_is_made_again(lm_run, tmp_path, capsys):
    """A run a killed post-training stored but never evaluated is not reused as finished."""
    out = tmp_path / "out"
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(out)]) == 0
    (run,) = (out / "post-train" / "runs").iterdir()
    (run / "dataset.nc").unlink()
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(out)]) == 0
    assert (run / "dataset.nc").is_file()


def test_out_naming_a_post_train_folder_is_refused_not_nested(lm_run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(out)]) == 0
    capsys.readouterr()
    before = _tree(tmp_path)
    for inner in (out / "post-train", out / "post-train" / "runs"):
        assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(inner)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --out {inner} "), err
        assert f"the post-train folder of --out {out}: a post-training writes OUT/post-train/runs/<id>" in err[0]
        assert err[0].endswith(f"allowed: --out {out} (its runs are reused)")
        assert _tree(tmp_path) == before  # no post-train/post-train/
    shutil.copytree(out / "post-train", tmp_path / "renamed")  # a folder of post-training runs under another name
    assert main(["lm", "post-train", "--checkpoint", str(lm_run), *POST, "--out", str(tmp_path / "renamed")]) == 2
    assert capsys.readouterr().err.strip().endswith("allowed: another --out, not a folder of post-training runs")
