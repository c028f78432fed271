"""The task samples through a subword tokenizer: the texts of the byte formats, piece by
piece, lengths in tokens, only the answer's tokens scored; the byte tokenizer gives the
byte formats exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.tokenizer import train_bpe, word_text

from dynlab.lm.data.babi import COUNTS, ROOMS, BabiTask
from dynlab.lm.data.tasks import CopyingTask, PasskeyTask
from dynlab.lm.data.tokenizer import ByteTokenizer, HFTokenizer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> HFTokenizer:
    pytest.importorskip("tokenizers")
    text = word_text(1500, seed=1) + "\nThe pass key is 12345. Remember it. What is the pass key? Q: Where is Mary? A:"
    return HFTokenizer(train_bpe(tmp_path_factory.mktemp("bpe"), text, 400))


@pytest.fixture(scope="module")
def stream(bpe) -> np.ndarray:
    return bpe.encode(word_text(400, seed=2))


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_byte_tokenizer_gives_the_byte_formats_exactly():
    filler = torch.tensor(list(word_text(200).encode()), dtype=torch.uint8)
    pairs = [(CopyingTask(), CopyingTask(ByteTokenizer()), 12), (PasskeyTask(filler), PasskeyTask(filler, ByteTokenizer()), 300),
             (BabiTask(filler, ("qa1", "qa6"), 4), BabiTask(filler, ("qa1", "qa6"), 4, tokenizer=ByteTokenizer()), 400)]
    for plain, through, length in pairs:
        a, b = plain.sample(_gen(), 4, length), through.sample(_gen(), 4, length)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
        assert plain.min_length() == through.min_length()


def test_passkey_rows_are_the_text_in_tokens_and_only_the_key_is_scored(bpe, stream):
    task = PasskeyTask(stream, bpe)
    length = task.min_length() + 40
    batch = task.sample(_gen(1), 5, length, depth=0.5)
    assert batch.tokens.shape == (5, length)
    for row, mask in zip(batch.tokens.tolist(), batch.mask.tolist()):
        text = bpe.decode(row)
        scored = [row[i + 1] for i, m in enumerate(mask) if m]
        key = bpe.decode(scored)
        assert key.startswith(" ") and key.strip().isdigit() and len(key.strip()) == 5
        assert f"The pass key is {key.strip()}. Remember it." in text
        assert text.endswith("What is the pass key? The pass key is" + key + ".")
        assert row[-len(bpe.encode(".")):] == bpe.encode(".").tolist()  # the period is not scored
    with pytest.raises(ValueError, match="too short"):
        task.check_length(task.min_length() - 1)


def test_copying_scores_the_copy_and_pads_after_it(bpe):
    task = CopyingTask(bpe)
    batch = task.sample(_gen(2), 6, 9)
    pad = bpe.eos_id
    for row, mask in zip(batch.tokens.tolist(), batch.mask.tolist()):
        scored_at = [i + 1 for i, m in enumerate(mask) if m]
        copy = [row[i] for i in scored_at]
        end = scored_at[-1] + 1
        text = bpe.decode(row[:end + len(bpe.encode("."))])
        string = bpe.decode(copy)
        assert len(string) == 9 and string.isalpha() and text == f"${string}|{string}."
        assert all(t == pad for t in row[end + len(bpe.encode(".")):])  # padding only after the copy
        first = row.index(bpe.encode("|").tolist()[0])
        assert row[first - len(copy):first] == copy  # the same ids in both copies


def test_babi_scores_the_answer_in_a_row_of_exactly_its_length(bpe, stream):
    task = BabiTask(stream, ("qa1", "qa6", "qa7"), 3, tokenizer=bpe)
    length = task.min_length() + 30
    for kind in ("qa1", "qa6", "qa7"):
        batch = task.sample_kind(_gen(3), 4, length, kind)
        assert batch.tokens.shape == (4, length)
        for row, mask in zip(batch.tokens.tolist(), batch.mask.tolist()):
            answer = bpe.decode([row[i + 1] for i, m in enumerate(mask) if m])
            assert answer.startswith(" ") and answer.strip() in (*ROOMS, *COUNTS, "yes", "no")
            assert " A:" + answer + "." in bpe.decode(row)
    with pytest.raises(ValueError, match="byte-level format"):
        BabiTask(stream, ("qa1",), 3, tokens="words", tokenizer=bpe)


def test_task_lengths_are_checked_in_the_tokenizers_tokens(bpe, tmp_path):
    from dynlab.lm.spec import LMTaskRunSpec

    text = tmp_path / "filler.txt"
    text.write_text(word_text(500, seed=4))
    tok = bpe.spec()
    in_tokens = PasskeyTask(np.zeros(1, dtype=np.int64), bpe).min_length()
    in_bytes = PasskeyTask(torch.zeros(1, dtype=torch.uint8)).min_length()
    assert in_tokens < in_bytes
    fields = {"kind": "passkey", "train_min": in_tokens, "train_max": in_tokens + 10, "eval_lengths": [in_tokens + 10]}
    spec = LMTaskRunSpec(data={"source": str(text), "tokenizer": tok}, task=fields)  # too short in bytes, fine in tokens
    assert spec.model.vocab_size == bpe.n_ids
    with pytest.raises(ValueError, match="in tokens of"):
        LMTaskRunSpec(data={"source": str(text), "tokenizer": tok}, task={**fields, "train_min": in_tokens - 1})
    with pytest.raises(ValueError, match="too short"):  # the same lengths read as bytes
        LMTaskRunSpec(data={"source": str(text)}, task=fields)


def test_probe_samples_read_one_position_and_label_the_symbol(bpe, stream):
    """The geometry's probes through a subword tokenizer: every row's state is read at one
    position, d filler tokens after its needle (passkey) or right after ``|`` (copying),
    and the label is the key's last digit or the string's first letter."""
    task = PasskeyTask(stream, bpe)
    batch, position, labels = task.probe_samples(_gen(5), 6, 20)
    for row, label in zip(batch.tokens.tolist(), labels):
        before = bpe.decode(row[:position - 20])
        assert before.rstrip().endswith("is the pass key.") and f"{int(label)} is the pass key." in before
    copying = CopyingTask(bpe)
    batch, position, labels = copying.probe_samples(_gen(6), 6, 7)
    for row, label in zip(batch.tokens.tolist(), labels):
        head = bpe.decode([t for t in row[:position] if t != bpe.eos_id])
        assert head.startswith("$") and head.endswith("|") and head[1] == chr(ord("a") + int(label))


@pytest.mark.slow
def test_a_task_study_trains_on_subword_samples(bpe, tmp_path):
    from dynlab.runner.driver import run_study
    from dynlab.studies.passkey import STUDY
    from dynlab.runner.protocol import StudyOptions
    import xarray as xr

    text = tmp_path / "filler.txt"
    text.write_text(word_text(800, seed=5))
    n = PasskeyTask(np.zeros(1, dtype=np.int64), bpe).min_length()
    extra = {"source": str(text), "tokenizer": str(bpe.file),
             "task": {"train_min": n, "train_max": n + 8, "eval_lengths": [n + 8, 2 * n], "depths": [0.5]},
             "train": {"steps": 3, "batch_size": 2}, "eval": {"n_samples": 2}, "post": {"steps": 2},
             "model": {"d_model": 16, "n_layers": 1}}
    options = StudyOptions(preset="smoke", seeds=(0,), extra=extra)
    path = run_study(STUDY, options, out=tmp_path / "out", device="cpu")
    ds = xr.open_dataset(path)
    spec = STUDY.make_specs(options)[0]
    assert spec.data.tokenizer.kind == "hf" and spec.model.vocab_size == bpe.n_ids
    assert ds["accuracy"].notnull().any()
    ds.close()


def test_babi_word_tokens_read_a_memory_mapped_filler_window_by_window(tmp_path):
    """bAbI's word tokens over a token folder's memory map: the samples of the same bytes
    as a tensor (filler bytes >= 128 read as spaces either way), without reading it whole."""
    raw = np.frombuffer(("naïve café " + word_text(300, seed=9)).encode(), dtype=np.uint8)
    raw.astype(np.uint16).tofile(tmp_path / "val.bin")
    mm = np.memmap(tmp_path / "val.bin", dtype=np.uint16, mode="r")
    as_tensor = BabiTask(torch.as_tensor(raw.astype(np.int64)), ("qa1",), 3, tokens="words")
    as_map = BabiTask(mm, ("qa1",), 3, tokens="words")
    a, b = as_tensor.sample(_gen(4), 3, 300), as_map.sample(_gen(4), 3, 300)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.mask, b.mask)
    assert bool((a.tokens < 128 + 39).all())  # no filler byte beyond the word ids (é, ï read as spaces)


def test_min_length_holds_every_story_the_task_draws(bpe, stream):
    """Sampling at ``min_length`` never runs out of room, for every kind and many seeds
    (the dropped-object facts and every question form counted)."""
    for kinds, n_facts in ((("qa7",), 8), (("qa1", "qa2", "qa3", "qa6"), 4)):
        task = BabiTask(stream, kinds, n_facts, tokenizer=bpe)
        for seed in range(40):
            task.sample(_gen(seed), 2, task.min_length())


def test_a_tokenizer_that_loses_a_piece_of_the_task_is_refused(tmp_path):
    """A WordPiece tokenizer whose vocabulary lacks the digits reads the key as its unknown
    token: refused in one line, naming the piece, before any sample."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from dynlab.errors import DynlabInputError

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([word_text(300)], trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    wp = HFTokenizer(tmp_path)
    assert wp.unk_id is not None
    with pytest.raises(DynlabInputError, match="passkey task to its unknown token"):
        PasskeyTask(np.zeros(8, dtype=np.int64), wp)
    with pytest.raises(DynlabInputError, match="copying task"):
        CopyingTask(wp)


def test_babilong_on_a_token_folder_reads_its_text_through_the_folders_tokenizer(bpe, tmp_path):
    from dynlab.lm.data.tokens import prepare_tokens
    from dynlab.studies.babilong import STUDY
    from dynlab.runner.protocol import StudyOptions

    (tmp_path / "t.txt").write_text(word_text(3000, seed=11))
    folder, _ = prepare_tokens([tmp_path / "t.txt"], bpe, tmp_path / "toks", 0.1)
    n = 400
    extra = {"source": str(folder), "task": {"train_min": n, "train_max": n, "eval_lengths": [n, 2 * n]}}
    specs = STUDY.make_specs(StudyOptions(preset="quick", seeds=(0,), extra=extra))
    assert {s.task.babi_tokens for s in specs} == {"bytes"} and specs[0].data.tokenizer.kind == "hf"
    # the kinds preset's warm start (qa1 at its own lengths) is read as text too: too short in these tokens
    with pytest.raises(ValueError, match=r"warm_start\.task\.train_min: babi length .*\(in tokens of"):
        STUDY.make_specs(StudyOptions(preset="kinds", seeds=(0,), extra=extra))
