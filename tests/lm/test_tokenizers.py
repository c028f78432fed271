"""Every LM path reads its text through one tokenizer: a checkpoint's own tokenizer.json,
``--tokenizer``, a token folder's, or the bytes; a tokenizer that does not fit the model is
refused before anything is written; the run id records it; exports carry it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.optional import need_transformers
from helpers.tokenizer import tiny_mamba2, train_bpe, word_text

from dynlab.cli import main
from dynlab.errors import DynlabInputError
from dynlab.lm.spec import LMDataSpec, LMEvalSpec, LMModelSpec, LMRunSpec, LMTrainSpec
from dynlab.lm.data.tokenizer import ByteTokenizer, HFTokenizer, TokenizerSpec, check_fits


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A text file, a BPE tokenizer of 300 ids trained on it, and tiny HF Mamba-2 folders."""
    need_transformers()
    root = tmp_path_factory.mktemp("tok")
    text = word_text(3000)
    (root / "text.txt").write_text(text)
    train_bpe(root / "bpe", text, 300)

    def mamba2(name: str, vocab: int, tokenizer: bool) -> str:
        return tiny_mamba2(root / name, vocab, root / "bpe" if tokenizer else None)

    return {"root": root, "text": str(root / "text.txt"), "bpe": str(root / "bpe"),
            "ckpt": mamba2("ckpt", 304, True), "no_tok": mamba2("no_tok", 1000, False),
            "small": mamba2("small", 280, True), "bytes": mamba2("bytes", 256, False)}


def _one_line_refusal(capsys, args, *words):
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[transformers]")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    for w in words:
        assert w in err[0], err


def test_checkpoint_ppl_is_the_hf_models_own_on_its_tokenizers_ids(world, tmp_path):
    """Post-training 0 steps evaluates the checkpoint on its tokenizer's ids: PPL(t) equals
    exp of the mean cross-entropy of the HF model's own whole forward on windows of the
    tokenized validation tail (an independent computation)."""
    transformers = need_transformers()
    from dynlab.app.posttrain import post_train

    run = post_train(world["ckpt"], "zero", steps=0, source=world["text"], seq_len=16, samples=3,
                     length_multiple=4, out=str(tmp_path), device="cpu")
    spec = json.loads((run / "spec.json").read_text())["fields"]
    assert spec["data"]["tokenizer"]["kind"] == "hf" and spec["data"]["tokenizer"]["n_ids"] == 300
    ppl = np.array(json.loads((run / "result.json").read_text())["ppl"])

    ids = HFTokenizer(world["bpe"]).encode(Path(world["text"]).read_text())
    val = ids[len(ids) - int(round(len(ids) * 0.1)):]
    length = 64
    starts = np.linspace(0, len(val) - length - 1, 3).round().astype(np.int64)
    windows = torch.as_tensor(np.stack([val[s:s + length + 1] for s in starts]))
    hf = transformers.Mamba2ForCausalLM.from_pretrained(world["ckpt"]).eval()
    with torch.no_grad():
        logits = hf(windows[:, :-1]).logits.double()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")
    np.testing.assert_allclose(ppl, np.exp(nll.mean(0).numpy()), rtol=1e-4)
    assert len(ppl) == length


def test_a_post_trained_checkpoint_keeps_its_tokenizer(world, tmp_path):
    from dynlab.app.posttrain import post_train
    from dynlab.lm.train.posttrain import load_checkpoint

    run = post_train(world["ckpt"], "state-passing", steps=2, source=world["text"], seq_len=16, batch_size=2,
                     samples=2, length_multiple=2, out=str(tmp_path), device="cpu")
    assert (run / "hf" / "tokenizer.json").read_bytes() == (world["root"] / "bpe" / "tokenizer.json").read_bytes()
    _, meta = load_checkpoint(run)
    assert meta["tokenizer"]["kind"] == "hf" and meta["tokenizer"]["n_ids"] == 300


def test_a_checkpoint_without_tokenizer_and_a_larger_vocabulary_is_refused(world, tmp_path, capsys):
    out = tmp_path / "o"
    _one_line_refusal(capsys, ["lm", "post-train", "--checkpoint", world["no_tok"], "--source", world["text"],
                               "--steps", "1", "--out", str(out)], "vocabulary of 1000 ids", "--tokenizer")
    assert not out.exists()


def test_a_byte_model_without_tokenizer_reads_bytes(world, tmp_path):
    from dynlab.app.posttrain import post_train

    run = post_train(world["bytes"], "zero", steps=0, source=world["text"], seq_len=16, samples=2,
                     length_multiple=2, out=str(tmp_path), device="cpu")
    fields = json.loads((run / "spec.json").read_text())["fields"]
    assert "tokenizer" not in fields["data"]  # the byte tokenizer: left out of the run id


def test_a_tokenizer_beyond_the_vocabulary_is_refused(world, tmp_path, capsys):
    out = tmp_path / "o"
    _one_line_refusal(capsys, ["lm", "post-train", "--checkpoint", world["small"], "--source", world["text"],
                               "--steps", "1", "--out", str(out)], "ids up to 299", "280")
    assert not out.exists()
    _one_line_refusal(capsys, ["lm", "post-train", "--checkpoint", world["bytes"], "--tokenizer", world["bpe"],
                               "--source", world["text"], "--steps", "1", "--out", str(out)], "256")
    assert not out.exists()


def test_a_token_folder_of_another_tokenizer_is_refused(world, tmp_path, capsys):
    from dynlab.lm.data.tokens import prepare_tokens

    folder, _ = prepare_tokens([world["text"]], ByteTokenizer(), tmp_path / "bytes", val_fraction=0.1)
    out = tmp_path / "o"
    _one_line_refusal(capsys, ["lm", "post-train", "--checkpoint", world["ckpt"], "--source", str(folder),
                               "--steps", "1", "--out", str(out)], "tokenized with byte")
    assert not out.exists()


def test_a_token_folder_is_read_as_its_text_is(world, tmp_path):
    """Post-training reads a token folder of the checkpoint's tokenizer: the same
    evaluation windows as the text it was made from (one document, the same split)."""
    from dynlab.app.posttrain import post_train
    from dynlab.lm.data.tokens import prepare_tokens

    folder, _ = prepare_tokens([world["text"]], HFTokenizer(world["ckpt"]), tmp_path / "toks", val_fraction=0.1)
    by_folder = post_train(world["ckpt"], "zero", steps=0, source=str(folder), seq_len=16, samples=3,
                           length_multiple=2, out=str(tmp_path / "a"), device="cpu")
    ppl = json.loads((by_folder / "result.json").read_text())["ppl"]
    assert np.all(np.isfinite(ppl)) and len(ppl) == 32
    data = json.loads((by_folder / "spec.json").read_text())["fields"]["data"]
    assert data["tokenizer"]["kind"] == "hf" and data["source"] == str(folder.resolve())


def test_the_run_id_changes_with_the_tokenizer_and_not_for_bytes(world):
    base = LMDataSpec(source=world["text"])
    assert "tokenizer" not in base.hashed_fields()
    hf = LMDataSpec(source=world["text"], tokenizer=HFTokenizer(world["bpe"]).spec())
    assert hf.spec_hash() != base.spec_hash()
    other = hf.tokenizer.model_copy(update={"sha256": "0" * 64})
    assert LMDataSpec(source=world["text"], tokenizer=other).spec_hash() != hf.spec_hash()
    assert "vocab_size" not in LMModelSpec().hashed_fields()


def test_a_model_takes_its_vocabulary_from_the_tokenizer(world):
    tok = HFTokenizer(world["bpe"]).spec()
    spec = LMRunSpec(data={"source": world["text"], "tokenizer": tok}, model={"d_model": 16})
    assert spec.model.vocab_size == 300
    with pytest.raises(ValueError, match="vocab_size >= 300"):
        LMRunSpec(data={"source": world["text"], "tokenizer": tok}, model={"vocab_size": 256})
    with pytest.raises(DynlabInputError, match="does not fit"):
        check_fits(tok, 299)
    check_fits(TokenizerSpec(), 256)


def _tiny_spec(world, seed: int, engine: str = "loop") -> LMRunSpec:
    tok = HFTokenizer(world["bpe"]).spec()
    return LMRunSpec(
        data={"source": world["text"], "tokenizer": tok},
        model={"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 8, "d_state": 4, "chunk_size": 8, "mlp_ratio": 0},
        train=LMTrainSpec(steps=3, batch_size=2, seq_len=16, engine=engine),
        eval=LMEvalSpec(length_multiple=2, n_samples=2, chunk_len=16, bin_width=8, effrem_points=2, effrem_samples=2,
                        state_points=2),
        seed=seed)


def test_dynlab_models_train_on_subword_ids_alone_and_stacked(world):
    """A 300-id model trains on the tokenizer's ids; the stack engine equals the loop to rounding."""
    from dynlab.lm.run.text import train_and_evaluate, train_and_evaluate_many

    specs = [_tiny_spec(world, s, "stack") for s in (0, 1)]
    stacked = train_and_evaluate_many(specs, "cpu")
    for spec, (res, weights) in zip(specs, stacked):
        alone, w_alone = train_and_evaluate(spec, "cpu")
        assert res["status"] == alone["status"] == "ok"
        assert weights["embedding.weight"].shape == (300, 16)
        np.testing.assert_allclose(res["ppl"], alone["ppl"], rtol=1e-4)
        assert res["n_params"] == alone["n_params"]


def test_an_export_carries_the_runs_tokenizer(world, tmp_path):
    transformers = need_transformers()
    from dynlab.lm.hub.export import export_hf
    from dynlab.results.store import RunStore
    from dynlab.lm.run.text import train_and_evaluate

    spec = _tiny_spec(world, 0)
    result, weights = train_and_evaluate(spec, "cpu")
    store = RunStore(tmp_path / "study")
    run = store.save(spec, result, weights)
    out = export_hf(run, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == (world["root"] / "bpe" / "tokenizer.json").read_bytes()
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    assert tok("the cat")["input_ids"] == HFTokenizer(world["bpe"]).encode("the cat").tolist()
    hf = transformers.Mamba2ForCausalLM.from_pretrained(str(out))
    assert hf.config.vocab_size == 300
