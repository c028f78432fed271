"""A refusal names what the user set, with its numbers: a text too short for the batch or
the evaluation names the options that size them (not only --source); a value set in a
--config file is named by its key there, not by the option that would set it."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynlab.cli import main


def _refused(argv: list[str], tmp_path: Path, capsys) -> str:
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert not out.exists()
    return err[0]


def test_a_batch_larger_than_the_text_names_batch_size_and_seq_len(tmp_path, capsys):
    line = _refused(["study", "length-generalization", "--preset", "smoke", "--batch-size", "4096", "--seq-len", "1024"],
                    tmp_path, capsys)
    assert line.startswith("error: one training batch, batch size 4096 (--batch-size) × (training length 1024 "
                           "(--seq-len) + 1), needs 4198401 bytes of text, more than --source 'shakespeare' holds: "
                           "its train and validation parts have "), line
    assert line.endswith("and each must hold 4198401; allowed: a smaller --batch-size or --seq-len, or a longer text")


def test_an_evaluation_longer_than_the_text_names_seq_len_and_the_multiple(tmp_path, capsys):
    line = _refused(["study", "length-generalization", "--preset", "smoke", "--seq-len", "100000"], tmp_path, capsys)
    assert line.startswith("error: the evaluation, 16 (eval.length_multiple in --config) × training length 100000 "
                           "(--seq-len), needs 1600001 bytes of text, more than --source 'shakespeare' holds"), line
    assert line.endswith("allowed: a smaller --seq-len or eval.length_multiple in --config, or a longer text")


def test_post_train_names_its_own_options(tmp_path, capsys):
    out = tmp_path / "lg"
    assert main(["study", "length-generalization", "--preset", "smoke", "--interventions", "zero", "--steps", "2",
                 "--out", str(out), "--device", "cpu", "-q"]) == 0
    (run,) = (out / "length-generalization" / "runs").iterdir()
    capsys.readouterr()
    line = _refused(["lm", "post-train", "--checkpoint", str(run), "--seq-len", "50000", "--samples", "4"], tmp_path,
                    capsys)
    assert line.startswith("error: the evaluation, 16 (--eval-multiple) × --seq-len 50000, needs 800001 bytes of "
                           "text, more than --source 'shakespeare' holds"), line
    assert line.endswith("allowed: a smaller --eval-multiple or --seq-len, or a longer text")


@pytest.mark.parametrize("toml, typed, said", [
    ("[task]\neval_lengths = [5000]\n", [], "--config {cfg}: task.eval_lengths [5000] hold no length <= train_max"),
    ("[task]\neval_lengths = [5000]\n", ["--lengths", "6000"], "--lengths [6000] hold no length <= train_max"),
    ("[task]\ndepths = [2.0]\n", [], "--config {cfg}: task.depths: depth 2.0 is outside [0, 1]"),
], ids=["config-key", "typed-option-wins", "config-depths"])
def test_a_config_key_is_named_as_the_key_not_as_an_option(tmp_path, capsys, toml, typed, said):
    cfg = tmp_path / "study.toml"
    cfg.write_text(toml)
    line = _refused(["study", "passkey", "--preset", "smoke", "--config", str(cfg), *typed], tmp_path, capsys)
    assert line.startswith("error: " + said.format(cfg=cfg)), line
