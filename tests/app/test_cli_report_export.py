"""`dynlab report` and `dynlab lm export` from the command line."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.optional import need_transformers
import torch

from dynlab.cli import main


def test_report_prints_the_tables_of_a_dataset(tmp_path, capsys):
    import xarray as xr

    from dynlab.results.schema import write_dataset

    t_bin = np.array([8, 16, 24, 32])  # binned PPL sits on its bins' ends
    ppl = np.array([[4.0, 4.0, 4.0, 6.0]])
    ds = xr.Dataset({"ppl_binned": (("run", "t_bin"), ppl), "lg_p_star": ("run", [4.0]), "lg_passed": ("run", [False])},
                    coords={"t_bin": t_bin, "intervention": ("run", ["zero"]), "seed": ("run", [0]),
                            "arch": ("run", ["gla"]), "train_length": ("run", [16])},
                    attrs={"study": "length-generalization", "preset": "quick"})
    write_dataset(ds, tmp_path / "lg" / "dataset.nc")
    assert main(["report", str(tmp_path / "lg")]) == 0
    out = capsys.readouterr().out
    assert "| gla | zero | 0 | 1.500 (1.500–1.500)" in out  # (28, 32] holds t = 32: 6 / 4


def test_report_refuses_a_folder_without_a_dataset(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: no dataset at {tmp_path / 'dataset.nc'}; allowed: a study folder") and len(err.splitlines()) == 1


@pytest.mark.slow
def test_export_a_trained_run_and_load_it_back(tmp_path, capsys):
    transformers = need_transformers()
    from dynlab.lm.train.posttrain import load_checkpoint
    from dynlab.runner.driver import run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8, "d_state": 4, "chunk_size": 8,
                      "mlp_ratio": 0},
            "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
            "eval": {"length_multiple": 2, "n_samples": 2, "chunk_len": 16, "bin_width": 8, "effrem_points": 2,
                     "effrem_samples": 2, "state_points": 2}, "interventions": ["zero"]}
    options = StudyOptions(preset="quick", extra=tiny)
    run_study(STUDY, options, out=tmp_path, device="cpu")
    run = tmp_path / "length-generalization" / "runs" / STUDY.make_specs(options)[0].spec_hash()
    import os

    mask = os.umask(0o022)
    try:
        assert main(["lm", "export", str(run), str(tmp_path / "hf")]) == 0
    finally:
        os.umask(mask)
    # every file of the export has the umask's mode, as its siblings (safetensors writes 0600 by itself)
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir() if not p.name.startswith(".")} == {
        "config.json": 0o644, "generation_config.json": 0o644, "model.safetensors": 0o644, "tokenizer.json": 0o644,
        "tokenizer_config.json": 0o644, "README.md": 0o644}
    weights = (run / "model.safetensors").read_bytes()
    assert main(["lm", "export", str(run), str(run)]) == 2  # never into the run folder: its weights stay
    assert (run / "model.safetensors").read_bytes() == weights
    assert (tmp_path / "hf" / ".dynlab-export").is_file()  # the marker that makes it an earlier export
    assert main(["lm", "export", str(run), str(tmp_path / "hf")]) == 0  # an earlier export is replaced
    (tmp_path / "hf" / ".dynlab-export").unlink()  # an export from before the marker: known by its model card
    assert main(["lm", "export", str(run), str(tmp_path / "hf")]) == 0
    hf = transformers.Mamba2ForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()
    model, _ = load_checkpoint(run)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = model(tokens)
        theirs = hf(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max()))
    # a layout HF cannot hold is refused in one line, nothing written
    assert main(["lm", "export", str(run), str(tmp_path / "hf2"), "--dtype", "int8"]) == 2
    assert not (tmp_path / "hf2").exists()
    # --license: the card's YAML header states it; a value that is no Hub identifier is refused, nothing written
    assert main(["lm", "export", str(run), str(tmp_path / "hf3"), "--license", "apache-2.0"]) == 0
    assert "\nlicense: apache-2.0\n" in (tmp_path / "hf3" / "README.md").read_text()
    capsys.readouterr()
    assert main(["lm", "export", str(run), str(tmp_path / "hf4"), "--license", "Apache 2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --license 'Apache 2' is not") and "allowed:" in err[0]
    assert not (tmp_path / "hf4").exists()


def test_bench_json_that_cannot_be_written_is_refused_before_the_benchmark(tmp_path, capsys):
    assert main(["bench", "train", "--quick", "--models", "tanh-rnn", "--json", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a folder" in err[0], err
