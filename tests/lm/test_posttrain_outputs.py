"""dynlab's own LM outputs are first-class: a run written by `lm post-train` is accepted by
`lm post-train --checkpoint` and `lm export`; `lm export` never writes inside a run or a
study folder."""

from __future__ import annotations

import pytest
import torch
from helpers.optional import need_transformers
from safetensors.torch import load_file

from dynlab.cli import main
from dynlab.lm.train.posttrain import load_checkpoint

TINY = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 4, "head_dim": 8, "d_state": 4, "chunk_size": 8},
        "train": {"steps": 2, "batch_size": 2, "seq_len": 16},
        "eval": {"length_multiple": 2, "n_samples": 2, "chunk_len": 16, "bin_width": 8, "effrem_points": 2,
                 "effrem_samples": 2, "state_points": 2}, "interventions": ["zero"]}
POST = ["--steps", "2", "--batch-size", "2", "--eval-multiple", "2", "--samples", "2", "--lr", "1e-2", "--device", "cpu"]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    from dynlab.runner.driver import run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    out = tmp_path_factory.mktemp("lg")
    options = StudyOptions(preset="quick", models=("mamba2",), extra=TINY)
    run_study(STUDY, options, out=out, device="cpu")
    return out / "length-generalization" / "runs" / STUDY.make_specs(options)[0].spec_hash()


@pytest.fixture(scope="module")
def post_trained(run_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("pt")
    assert main(["lm", "post-train", "--checkpoint", str(run_folder), "--intervention", "zero", *POST,
                 "--out", str(out)]) == 0
    (run,) = (out / "post-train" / "runs").iterdir()
    return run


def test_a_post_trained_run_loads_with_its_post_trained_weights(run_folder, post_trained):
    model, meta = load_checkpoint(post_trained)
    saved = load_file(str(post_trained / "model.safetensors"))
    got = model.state_dict()
    assert set(got) == set(saved) and all(torch.equal(got[k], saved[k]) for k in saved)
    original = load_file(str(run_folder / "model.safetensors"))
    assert any(not torch.equal(original[k], saved[k]) for k in saved)  # post-training changed the weights
    assert meta["post_trained"] and meta["kind"] == "dynlab" and meta["seq_len"] == 16


def test_a_post_trained_run_is_post_trained_again_and_exported(post_trained, tmp_path, capsys):
    assert main(["lm", "post-train", "--checkpoint", str(post_trained), "--intervention", "zero", *POST,
                 "--out", str(tmp_path / "again")]) == 0
    assert len(list((tmp_path / "again" / "post-train" / "runs").iterdir())) == 1
    need_transformers()
    assert main(["lm", "export", str(post_trained), str(tmp_path / "hf")]) == 0
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    saved = load_file(str(post_trained / "model.safetensors"))
    emb = next(k for k in exported if k.endswith("embeddings.weight"))
    assert torch.equal(exported[emb], saved[next(k for k in saved if "embed" in k)])


@pytest.mark.parametrize("where, kind", [("{run}/hf", "run"), ("{run}/a/b", "run"), ("{study}/exports", "study"),
                                         ("{run}/../hf", "study")])
def test_export_refuses_a_target_inside_a_run_or_study_folder(run_folder, where, kind, capsys):
    target = where.replace("{run}", str(run_folder)).replace("{study}", str(run_folder.parents[1]))
    before = sorted(run_folder.parents[1].rglob("*"))
    assert main(["lm", "export", str(run_folder), target]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: OUT {target} is inside the dynlab {kind} folder ") and err.count("\n") == 1, err
    assert sorted(run_folder.parents[1].rglob("*")) == before


def test_a_file_as_checkpoint_is_called_a_file(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["lm", "post-train", "--checkpoint", str(tmp_path / "afile"), "--out", str(tmp_path / "o")]) == 2
    assert "is not a model (a file, not a folder)" in capsys.readouterr().err
