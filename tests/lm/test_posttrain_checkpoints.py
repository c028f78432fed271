"""`lm post-train` refuses damaged or unfinished dynlab runs and broken HF folders in one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from helpers.lm_runs import tiny_lm_run
from helpers.optional import need_transformers

from dynlab.cli import main
from dynlab.lm.train.posttrain import load_checkpoint


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    return tiny_lm_run(tmp_path_factory.mktemp("lg"))


def _copy(run, tmp_path):
    import shutil

    dest = tmp_path / run.name
    shutil.copytree(run, dest)
    return dest


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, match", [
    (lambda r: _flip_a_byte(r / "model.safetensors"), "checksum mismatch"),
    (lambda r: (r / "checksums.json").write_text("{"), "checksums.json unreadable"),
    (lambda r: (r / "result.json").unlink(), "result.json: missing"),
])
def test_a_damaged_run_is_not_post_trained(run_folder, tmp_path, capsys, damage, match):
    load_checkpoint(run_folder)  # intact: loads
    broken = _copy(run_folder, tmp_path)
    damage(broken)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(broken)
    assert main(["lm", "post-train", "--checkpoint", str(broken), "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: checkpoint") and match in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_diverged_run_is_not_a_checkpoint(run_folder, tmp_path):
    broken = _copy(run_folder, tmp_path)
    result = json.loads((broken / "result.json").read_text())
    (broken / "result.json").write_text(json.dumps({**result, "status": "diverged"}))
    with pytest.raises(ValueError):  # the edit itself is damage (checksum), and the status is refused too
        load_checkpoint(broken)


def test_infinite_learning_rate_is_refused(run_folder, tmp_path, capsys):
    assert main(["lm", "post-train", "--checkpoint", str(run_folder), "--lr", "inf", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "lr" in err[0], err
    assert not (tmp_path / "o").exists()


def test_a_truncated_hf_checkpoint_is_bad_input(tmp_path, capsys):
    transformers = need_transformers()
    cfg = transformers.Mamba2Config(vocab_size=256, hidden_size=16, num_hidden_layers=1, num_heads=2, head_dim=16,
                                    state_size=4, n_groups=1, expand=2, chunk_size=8)
    transformers.Mamba2ForCausalLM(cfg).save_pretrained(str(tmp_path / "hf"))
    weights = tmp_path / "hf" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    capsys.readouterr()  # the save's own progress bars
    assert main(["lm", "post-train", "--checkpoint", str(tmp_path / "hf"), "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: checkpoint"), err


def test_an_hf_checkpoint_with_too_small_a_vocabulary_is_one_line(tmp_path, capsys):
    transformers = need_transformers()
    cfg = transformers.Mamba2Config(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_heads=2, head_dim=16,
                                    state_size=4, n_groups=1, expand=2, chunk_size=8)
    transformers.Mamba2ForCausalLM(cfg).save_pretrained(str(tmp_path / "hf"))
    capsys.readouterr()  # the save's own progress bars
    assert main(["lm", "post-train", "--checkpoint", str(tmp_path / "hf"), "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "vocabulary of 100 ids" in err[0] and not captured.out.strip(), (err, captured.out)


def test_an_intact_run_loads_from_any_folder_name_and_is_only_read(run_folder, tmp_path):
    import shutil

    dest = tmp_path / "my-checkpoint"
    shutil.copytree(run_folder, dest)
    (dest / "analysis.nc").unlink(missing_ok=True)  # a later file gone: not the checkpoint's business
    before = {f.name: f.read_bytes() for f in dest.iterdir()}
    load_checkpoint(dest)
    assert {f.name: f.read_bytes() for f in dest.iterdir()} == before


def test_an_hf_checkpoint_whose_weights_do_not_fit_its_config_is_one_line(tmp_path, capfd):
    """config.json edited to another vocabulary than its weights: one line, without the
    load-report table transformers prints before its own error."""
    import json

    transformers = need_transformers()
    cfg = transformers.Mamba2Config(vocab_size=256, hidden_size=16, num_hidden_layers=1, num_heads=2, head_dim=16,
                                    state_size=4, n_groups=1, expand=2, chunk_size=8)
    transformers.Mamba2ForCausalLM(cfg).save_pretrained(str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "vocab_size": 1000}))
    capfd.readouterr()  # the save's own progress bars
    assert main(["lm", "post-train", "--checkpoint", str(tmp_path / "hf"), "--steps", "1", "--out", str(tmp_path / "o")]) == 2
    captured = capfd.readouterr()
    err = [line for line in captured.err.strip().splitlines() if "falling back to its reference" not in line]
    assert len(err) == 1 and "sizes of its weights differ from those its config.json gives" in err[0], err
    assert not (tmp_path / "o").exists()
