"""Edges of reading pretrained checkpoints and token folders: a tokenizer is never adopted
or swapped silently, bfloat16 checkpoints train in float32, the pretrained preset's
options mean what they say, remade folders and edited checkpoints are noticed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from helpers.optional import need_transformers
from helpers.tokenizer import tiny_mamba2, train_bpe, word_text

from dynlab.cli import main
from dynlab.errors import DynlabInputError


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    need_transformers()
    from dynlab.lm.data.tokenizer import ByteTokenizer, HFTokenizer
    from dynlab.lm.data.tokens import prepare_tokens

    root = tmp_path_factory.mktemp("edges")
    text = word_text(2500, seed=7)
    (root / "text.txt").write_text(text)
    train_bpe(root / "bpe", text, 300)
    train_bpe(root / "bpe2", word_text(2500, seed=8), 300)

    def mamba2(name, vocab, tokenizer=None, dtype=None):
        return tiny_mamba2(root / name, vocab, None if tokenizer is None else root / tokenizer, dtype)

    bpe_tokens, _ = prepare_tokens([root / "text.txt"], HFTokenizer(root / "bpe"), root / "bpe-tokens", 0.1)
    byte_tokens, _ = prepare_tokens([root / "text.txt"], ByteTokenizer(), root / "byte-tokens", 0.1)
    return {"root": root, "text": str(root / "text.txt"), "bpe": str(root / "bpe"), "bpe2": str(root / "bpe2"),
            "ckpt": mamba2("ckpt", 300, "bpe"), "no_tok": mamba2("no_tok", 300),
            "bf16": mamba2("bf16", 300, "bpe", torch.bfloat16),
            "bpe_tokens": str(bpe_tokens), "byte_tokens": str(byte_tokens)}


def _refused(capsys, args, words):
    code = main(args)
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[transformers]")]
    assert code == 2 and len(err) == 1 and words in err[0], err


POST = ["--steps", "1", "--seq-len", "16", "--batch-size", "2", "--samples", "2", "--eval-multiple", "2"]


def test_a_checkpoint_without_tokenizer_does_not_adopt_a_token_folders(world, tmp_path, capsys):
    _refused(capsys, ["lm", "post-train", "--checkpoint", world["no_tok"], "--source", world["byte_tokens"], *POST,
                      "--out", str(tmp_path / "o")], "no tokenizer.json")
    assert not (tmp_path / "o").exists()
    # named explicitly, the folder's own tokenizer is taken
    assert main(["lm", "post-train", "--checkpoint", world["no_tok"], "--tokenizer", world["bpe"], "--source",
                 world["bpe_tokens"], *POST, "--out", str(tmp_path / "ok")]) == 0


def test_a_tokenizer_other_than_the_checkpoints_own_is_refused(world, tmp_path, capsys):
    _refused(capsys, ["lm", "post-train", "--checkpoint", world["ckpt"], "--tokenizer", world["bpe2"], "--source",
                      world["text"], *POST, "--out", str(tmp_path / "o")], "was trained with the tokenizer")
    assert not (tmp_path / "o").exists()


def test_a_bfloat16_checkpoint_loads_and_trains_in_float32(world):
    from dynlab.lm.hub.checkpoint import load_checkpoint

    model, _ = load_checkpoint(world["bf16"])
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def _pretrained(world, tmp_path, *extra, config: str = "[train]\naccum = 1\n"):
    path = tmp_path / "c.toml"
    path.write_text(config + "[eval]\nlength_multiple = 2\nn_samples = 2\neffrem_samples = 2\neffrem_points = 2\n"
                    "state_points = 2\n")
    return ["study", "length-generalization", "--preset", "pretrained", "--checkpoint", world["ckpt"], "--source",
            world["bpe_tokens"], "--seq-len", "16", "--batch-size", "2", "--seeds", "0", "--quiet", "--config",
            str(path), "--out", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("extra, config, words", [
    (["--lr", "1e-3"], "[train]\nengine = \"stack\"\n", "engine"),
    (["--lr", "1e-3", "--models", "gla"], "", "no --models"),
], ids=["stack", "models"])
def test_the_pretrained_preset_refuses_options_it_cannot_honour(world, tmp_path, capsys, extra, config, words):
    _refused(capsys, _pretrained(world, tmp_path, *extra, config=config), words)
    assert not (tmp_path / "out" / "length-generalization").exists()


def test_the_pretrained_preset_schedules_the_arms_with_the_training_options(world):
    from dynlab.studies.length_generalization import make_specs
    from dynlab.runner.protocol import StudyOptions

    options = StudyOptions(preset="pretrained", seeds=(0,), extra={
        "checkpoint": world["ckpt"], "source": world["bpe_tokens"],
        "train": {"steps": 5, "lr": 2e-3, "warmup_frac": 0.3, "seq_len": 16, "batch_size": 2, "accum": 1},
        "post": {"steps": 9, "lr": 0.5}})
    spec = make_specs(options)[0]
    assert (spec.post.steps, spec.post.lr, spec.post.warmup_frac) == (5, 2e-3, 0.3)  # the training options win
    assert (spec.train.lr, spec.train.warmup_frac) == (2e-3, 0.3)  # the spec records what the arms used
    assert spec.init.config["vocab_size"] == 300 and spec.init.config["model_type"] == "mamba2"


def test_accumulation_counts_in_the_training_budget():
    from dynlab.studies.length_generalization import make_specs
    from dynlab.runner.protocol import StudyOptions

    one = make_specs(StudyOptions(preset="budget", seeds=(0,), extra={"train": {"accum": 1}}))[0]
    two = make_specs(StudyOptions(preset="budget", seeds=(0,), extra={"train": {"accum": 2}}))[0]
    assert two.train.steps == pytest.approx(one.train.steps / 2, abs=1)


def test_a_remade_token_folder_is_read_again(world, tmp_path):
    from dynlab.lm.run.text import data_corpus
    from dynlab.lm.spec import LMDataSpec
    from dynlab.lm.data.tokenizer import ByteTokenizer
    from dynlab.lm.data.tokens import prepare_tokens

    (tmp_path / "a.txt").write_text(word_text(300, seed=1))
    (tmp_path / "b.txt").write_text(word_text(200, seed=2))
    folder, _ = prepare_tokens([tmp_path / "a.txt"], ByteTokenizer(), tmp_path / "t", 0.1)
    first = len(data_corpus(LMDataSpec(source=str(folder))).train)
    prepare_tokens([tmp_path / "b.txt"], ByteTokenizer(), folder, 0.1)
    again = data_corpus(LMDataSpec(source=str(folder)))
    assert len(again.train) != first and len(again.train) == int(round(len(b"".join(
        [(tmp_path / "b.txt").read_bytes()])) * 0.9))


def test_a_run_spec_reads_back_after_its_token_folder_was_remade(world, tmp_path):
    from dynlab.lm.spec import LMDataSpec
    from dynlab.lm.data.tokenizer import ByteTokenizer, HFTokenizer
    from dynlab.lm.data.tokens import prepare_tokens
    from dynlab.spec import load_spec

    folder, _ = prepare_tokens([world["text"]], ByteTokenizer(), tmp_path / "t", 0.1)
    stored = json.loads(LMDataSpec(source=str(folder)).canonical_json())
    prepare_tokens([world["text"]], HFTokenizer(world["bpe"]), folder, 0.1)  # remade with another tokenizer
    back = load_spec(stored, LMDataSpec)
    assert back.tokenizer.kind == "byte" and back.spec_hash() == LMDataSpec.model_validate(
        stored["fields"], context={"stored": True}).spec_hash()


def test_an_id_beyond_the_folders_tokenizer_is_one_line(world, tmp_path):
    import shutil

    from dynlab.lm.run.text import data_corpus
    from dynlab.lm.data.loaders import take
    from dynlab.lm.spec import LMDataSpec

    bad = tmp_path / "bad"
    shutil.copytree(world["bpe_tokens"], bad)
    ids = np.fromfile(bad / "val.bin", dtype=np.uint16)
    ids[5] = 65535
    ids.tofile(bad / "val.bin")
    corpus = data_corpus(LMDataSpec(source=str(bad)))
    with pytest.raises(DynlabInputError, match="beyond its tokenizer's 300 ids"):
        take(corpus.val, torch.arange(10)[None, :])


def test_a_post_training_runs_digest_covers_its_hf_weights(world, tmp_path):
    from dynlab.app.posttrain import post_train
    from dynlab.lm.hub.checkpoint import checkpoint_digest, load_checkpoint

    run = post_train(world["ckpt"], "zero", steps=1, source=world["text"], seq_len=16, batch_size=2, samples=2,
                     length_multiple=2, out=str(tmp_path), device="cpu")
    before = checkpoint_digest(run)
    weights = run / "hf" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert checkpoint_digest(run) != before
    assert (run / "hf" / "tokenizer.json").is_file()
    _, meta = load_checkpoint(run)
    assert meta["tokenizer"]["kind"] == "hf"


def test_a_mamba1_checkpoint_with_tied_embeddings_is_post_trained_and_saved(world, tmp_path):
    transformers = need_transformers()
    from dynlab.app.posttrain import post_train
    from dynlab.lm.hub.checkpoint import load_checkpoint

    cfg = transformers.MambaConfig(vocab_size=300, hidden_size=32, num_hidden_layers=1, state_size=8, expand=2)
    assert cfg.tie_word_embeddings  # transformers' default: the head is the embedding
    torch.manual_seed(0)
    folder = tmp_path / "m1"
    transformers.MambaForCausalLM(cfg).save_pretrained(str(folder))
    (folder / "tokenizer.json").write_bytes((world["root"] / "bpe" / "tokenizer.json").read_bytes())
    run = post_train(str(folder), "state-passing", steps=1, source=world["text"], seq_len=16, batch_size=2,
                     samples=2, length_multiple=2, out=str(tmp_path / "o"), device="cpu")
    model, meta = load_checkpoint(run)
    assert meta["tokenizer"]["kind"] == "hf" and model.vocab_size == 300


def test_a_post_training_that_diverges_says_so(world, tmp_path, capsys, monkeypatch):
    """A post-training whose loss becomes non-finite is one status line on stderr beside its run."""
    import dynlab.lm.train.posttrain as posttrain_mod
    from dynlab.training import TrainResult

    def diverged(model, *args, **kwargs):
        res = TrainResult(model=model)
        res.diverge("loss", 0, 16)
        return res

    monkeypatch.setattr(posttrain_mod, "train_lm", diverged)
    assert main(["lm", "post-train", "--checkpoint", world["ckpt"], "--source", world["text"], *POST,
                 "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("run: ")
    err = [line for line in captured.err.splitlines() if line.startswith("status:")]
    assert err == ["status: diverged (non-finite loss at step 0 (length 16)); the run keeps no weights and no evaluation"]
