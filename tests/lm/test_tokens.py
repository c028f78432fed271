"""Token folders (``dynlab data prepare``): the ids written equal the tokenizer's, documents
separated by its end-of-document id; the dtype follows the tokenizer's ids; the split; reruns;
refusals that leave nothing behind; opening as memory maps."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from dynlab.errors import DynlabInputError
from dynlab.lm.data import sources as sources_mod
from dynlab.lm.data import tokens as tokens_mod
from dynlab.lm.data.tokenizer import ByteTokenizer, TokenizerSpec, load_tokenizer
from dynlab.lm.data.tokens import RECORD, TokenFolder, is_token_folder, open_token_folder, prepare_tokens

tokenizers = pytest.importorskip("tokenizers")

WORDS = ["the", "cat", "sat", "on", "a", "mat", "über", "naïve", "日本語", "ran", "away", "!", "42", "\n"]


def make_docs(n: int, seed: int = 0, longest: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, longest))) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    """A tiny byte-level BPE tokenizer (300 ids, ``<|endoftext|>`` as id 0) trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(make_docs(300, seed=1), trainer)
    folder = tmp_path_factory.mktemp("bpe")
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture
def bpe(bpe_dir):
    return load_tokenizer(bpe_dir)


class WideBytes(ByteTokenizer):
    """The byte tokenizer claiming 70 000 ids: its ids need uint32 on disk."""

    n_ids = 70_000

    def spec(self) -> TokenizerSpec:
        return TokenizerSpec(n_ids=self.n_ids)


def write_jsonl(path: Path, docs: list[str], gz: bool = False) -> Path:
    text = "".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs))
    if gz:
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path.write_text(text, encoding="utf-8")
    return path


def all_ids(folder: TokenFolder) -> np.ndarray:
    return np.concatenate([np.asarray(folder.train), np.asarray(folder.val)]).astype(np.int64)


def expected_ids(tok, docs: list[str]) -> np.ndarray:
    parts = []
    for d in docs:
        parts.append(tok.encode(d))
        if tok.eos_id is not None:
            parts.append(np.array([tok.eos_id]))
    return np.concatenate(parts)


def leftovers(parent: Path) -> list[str]:
    """Hidden entries (temporary or set-aside folders) left in ``parent``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_ids_equal_the_tokenizer_with_eos_between_documents(tmp_path, bpe):
    assert bpe.eos_id == 0 and bpe.n_ids == 300
    docs = make_docs(120)
    src = tmp_path / "corpus"
    (src / "b").mkdir(parents=True)
    (src / "a.txt").write_text(docs[0], encoding="utf-8")
    write_jsonl(src / "b" / "c.jsonl", docs[1:50])
    write_jsonl(src / "b" / "d.jsonl.gz", docs[50:100], gz=True)
    (src / "e.md").write_text(docs[100], encoding="utf-8")
    (src / "ignored.csv").write_text("not read", encoding="utf-8")
    single = write_jsonl(tmp_path / "more.jsonl", docs[101:])
    out, wrote = prepare_tokens([src, single], bpe, tmp_path / "tok", val_fraction=0.1, batch_bytes=500)
    assert wrote and out == (tmp_path / "tok").absolute()
    folder = open_token_folder(out)
    # sorted by path: a.txt, b/c.jsonl, b/d.jsonl.gz, e.md; then the file named after the folder
    order = [docs[0], *docs[1:100], docs[100], *docs[101:]]
    np.testing.assert_array_equal(all_ids(folder), expected_ids(bpe, order))
    rec = folder.record
    n = rec["tokens"]["train"] + rec["tokens"]["val"]
    assert rec["tokens"]["val"] == round(0.1 * n) and rec["documents"] == len(docs)
    assert rec["format"] == "dynlab-tokens" and rec["version"] == 1 and rec["dtype"] == "uint16"
    assert rec["eos_id"] == 0 and rec["val_fraction"] == 0.1
    assert folder.tokenizer == bpe.spec() and folder.tokenizer.kind == "hf"
    assert [Path(s["path"]).name for s in rec["sources"]] == ["a.txt", "c.jsonl", "d.jsonl.gz", "e.md", "more.jsonl"]
    assert all(s["size"] == Path(s["path"]).stat().st_size and len(s["sha256"]) == 64 for s in rec["sources"])
    assert folder.train.dtype == np.dtype("<u2") and len(folder.train) == rec["tokens"]["train"]
    assert (out / "train.bin").stat().st_size == 2 * rec["tokens"]["train"]
    assert is_token_folder(out) and not is_token_folder(src)
    assert bpe.decode(folder.train[: len(bpe.encode(docs[0]))]) == docs[0]


def test_splits_are_memmaps_never_loaded(tmp_path, bpe):
    write_jsonl(tmp_path / "a.jsonl", make_docs(40))
    out, _ = prepare_tokens([tmp_path / "a.jsonl"], bpe, tmp_path / "tok", val_fraction=0.25)
    folder = open_token_folder(out)
    assert isinstance(folder.train, np.memmap) and isinstance(folder.val, np.memmap)
    assert not folder.train.flags.writeable and Path(folder.train.filename) == out / "train.bin"
    with pytest.raises(ValueError):
        folder.val[0] = 1


def test_byte_tokenizer_ids_are_the_utf8_bytes(tmp_path):
    docs = ["héllo wörld\n", "日本語", "plain"]
    for i, d in enumerate(docs):
        (tmp_path / "src").mkdir(exist_ok=True)
        (tmp_path / "src" / f"{i}.txt").write_text(d, encoding="utf-8")
    out, _ = prepare_tokens([tmp_path / "src"], ByteTokenizer(), tmp_path / "tok", val_fraction=0.2)
    folder = open_token_folder(out)
    raw = "".join(docs).encode("utf-8")  # no end-of-document id: documents joined as they are
    np.testing.assert_array_equal(all_ids(folder), np.frombuffer(raw, dtype=np.uint8))
    assert folder.record["eos_id"] is None and folder.record["dtype"] == "uint16"
    assert folder.tokenizer.kind == "byte" and folder.record["documents"] == 3


def test_more_than_65536_ids_are_stored_as_uint32(tmp_path):
    (tmp_path / "a.txt").write_text("some text, long enough to split", encoding="utf-8")
    out, _ = prepare_tokens([tmp_path / "a.txt"], WideBytes(), tmp_path / "tok", val_fraction=0.25)
    folder = open_token_folder(out)
    assert folder.record["dtype"] == "uint32" and folder.train.dtype == np.dtype("<u4")
    assert folder.tokenizer.n_ids == 70_000
    assert (out / "train.bin").stat().st_size == 4 * len(folder.train)
    assert (out / "val.bin").stat().st_size == 4 * len(folder.val)
    np.testing.assert_array_equal(all_ids(folder), np.frombuffer(b"some text, long enough to split", np.uint8))
    assert tokens_mod.token_dtype(65_536) == np.uint16 and tokens_mod.token_dtype(65_537) == np.uint32


def test_long_text_is_cut_after_newlines_without_changing_byte_ids(tmp_path, monkeypatch, bpe):
    monkeypatch.setattr(sources_mod, "PIECE_BYTES", 64)
    monkeypatch.setattr(sources_mod, "MAX_PIECE_BYTES", 200)
    text = "\n".join(make_docs(30, seed=3)) + "\n" + "日本語" * 300 + "\nend"  # a line of 2700 bytes, no newline
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    write_jsonl(tmp_path / "long.jsonl", [text])
    seen: list[tuple[list[str], list[bool]]] = []
    real = tokens_mod._encode

    def spy(tok, texts, ends, dtype):
        seen.append((list(texts), list(ends)))
        return real(tok, texts, ends, dtype)

    monkeypatch.setattr(tokens_mod, "_encode", spy)
    for name in ("long.txt", "long.jsonl"):
        seen.clear()
        out, _ = prepare_tokens([tmp_path / name], ByteTokenizer(), tmp_path / f"tok-{name}", val_fraction=0.1,
                                batch_bytes=150)
        pieces = [p for texts, _ in seen for p in texts]
        ends = [e for _, es in seen for e in es]
        assert len(pieces) > 10 and "".join(pieces) == text and ends == [False] * (len(pieces) - 1) + [True]
        assert all(p.endswith("\n") or len(p.encode()) >= 190 for p in pieces[:-1])
        np.testing.assert_array_equal(all_ids(open_token_folder(out)), np.frombuffer(text.encode(), np.uint8))
    out, _ = prepare_tokens([tmp_path / "long.txt"], bpe, tmp_path / "tok-bpe", val_fraction=0.1)
    ids = all_ids(open_token_folder(out))
    assert ids[-1] == bpe.eos_id and bpe.decode(ids[:-1]) == text  # cut in pieces, the text comes back whole


def test_rerun_does_nothing_and_a_change_prepares_again(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(50))
    out, wrote = prepare_tokens([src], bpe, tmp_path / "tok", val_fraction=0.1)
    assert wrote
    files = [out / RECORD, out / "train.bin", out / "val.bin"]
    stamps = [f.stat().st_mtime_ns for f in files]
    inodes = [f.stat().st_ino for f in files]
    assert prepare_tokens([src], bpe, tmp_path / "tok", val_fraction=0.1) == (out, False)
    assert [f.stat().st_mtime_ns for f in files] == stamps and [f.stat().st_ino for f in files] == inodes
    # another val_fraction, then another text: made again, the old folder replaced
    assert prepare_tokens([src], bpe, out, val_fraction=0.2)[1]
    assert open_token_folder(out).record["val_fraction"] == 0.2
    docs = make_docs(50, seed=9)
    write_jsonl(src, docs)
    assert prepare_tokens([src], bpe, out, val_fraction=0.2) == (out, True)
    np.testing.assert_array_equal(all_ids(open_token_folder(out)), expected_ids(bpe, docs))
    assert leftovers(tmp_path) == []
    # a byte tokenizer over the same text: new ids
    assert prepare_tokens([src], ByteTokenizer(), out, val_fraction=0.2)[1]
    assert open_token_folder(out).tokenizer.kind == "byte"


def test_damaged_folder_is_made_again(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(30))
    out, _ = prepare_tokens([src], bpe, tmp_path / "tok")
    os.truncate(out / "val.bin", 2)
    with pytest.raises(DynlabInputError, match="val.bin holds 2 bytes"):
        open_token_folder(out)
    assert prepare_tokens([src], bpe, out) == (out, True)
    open_token_folder(out)


@pytest.mark.parametrize("case", ["missing", "bad-line", "no-text", "non-utf8", "non-utf8-line", "empty-folder",
                                  "bad-gzip", "too-short", "val-fraction"])
def test_bad_sources_are_refused_leaving_nothing(tmp_path, bpe, case):
    good = write_jsonl(tmp_path / "good.jsonl", make_docs(20))
    sources: list[Path] = [good]
    fraction = 0.1
    match = None
    if case == "missing":
        sources.append(tmp_path / "nope.txt")
        match = "nope.txt.*no such file"
    elif case == "bad-line":
        (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n\n{"text": "ok"\n', encoding="utf-8")
        sources.append(tmp_path / "bad.jsonl")
        match = "bad.jsonl' line 3: no JSON object"
    elif case == "no-text":
        (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "x"}\n', encoding="utf-8")
        sources.append(tmp_path / "bad.jsonl")
        match = "line 2: no string 'text' field"
    elif case == "non-utf8-line":
        (tmp_path / "bad.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
        sources.append(tmp_path / "bad.jsonl")
        match = "bad.jsonl' line 2: not UTF-8 text"
    elif case == "non-utf8":
        (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
        sources.append(tmp_path / "latin.txt")
        match = "latin.txt': byte 3 is not UTF-8"
    elif case == "empty-folder":
        (tmp_path / "empty" / "sub").mkdir(parents=True)
        (tmp_path / "empty" / "sub" / "x.csv").write_text("a,b", encoding="utf-8")
        sources.append(tmp_path / "empty")
        match = "folder without .txt"
    elif case == "bad-gzip":
        (tmp_path / "x.jsonl.gz").write_bytes(b"not gzip at all")
        sources.append(tmp_path / "x.jsonl.gz")
        match = "not a gzip file"
    elif case == "too-short":
        (tmp_path / "short.txt").write_text("ab", encoding="utf-8")
        sources = [tmp_path / "short.txt"]
        fraction, match = 0.5, "too few to split"
    else:
        fraction, match = 1.0, "val_fraction 1.0 is out of range"
    before = sorted(p.name for p in tmp_path.iterdir())
    tokenizer = ByteTokenizer() if case == "too-short" else bpe
    with pytest.raises(DynlabInputError, match=match) as err:
        prepare_tokens(sources, tokenizer, tmp_path / "deep" / "tok", val_fraction=fraction, batch_bytes=100)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no tmp folder, not even deep/


def test_out_that_is_not_a_token_folder_is_refused_untouched(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(20))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(DynlabInputError, match="holds files that are not a token folder \\(notes.txt\\)"):
        prepare_tokens([src], bpe, foreign)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(DynlabInputError, match="is a file"):
        prepare_tokens([src], bpe, tmp_path / "file")
    out, _ = prepare_tokens([src], bpe, tmp_path / "tok")
    (out / "README.md").write_text("mine", encoding="utf-8")
    with pytest.raises(DynlabInputError, match="also holds other files \\(README.md\\)"):
        prepare_tokens([src], ByteTokenizer(), out)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_tokens([src], bpe, empty)[1] and is_token_folder(empty)
    assert leftovers(tmp_path) == []


def test_interrupt_removes_the_temporary_folder(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(200))
    out, _ = prepare_tokens([src], ByteTokenizer(), tmp_path / "tok")
    calls = []

    def interrupt(done, total, n):
        calls.append((done, total, n))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_tokens([src], bpe, out, progress=interrupt, batch_bytes=100)
    assert leftovers(tmp_path) == [] and open_token_folder(out).tokenizer.kind == "byte"  # the old folder stays
    assert calls and 0 < calls[0][0] <= calls[0][1] == src.stat().st_size and calls[0][2] > 0


def test_progress_reaches_the_total(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(100))
    calls = []
    prepare_tokens([src], bpe, tmp_path / "tok", progress=lambda *a: calls.append(a), batch_bytes=300)
    assert len(calls) > 3 and calls[-1][0] == calls[-1][1] == src.stat().st_size
    assert [c[2] for c in calls] == sorted(c[2] for c in calls)


def test_open_refuses_what_prepare_did_not_write(tmp_path, bpe):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(30))
    out, _ = prepare_tokens([src], bpe, tmp_path / "tok")
    n = open_token_folder(out).record["tokens"]["train"]
    with open(out / "train.bin", "r+b") as f:
        f.truncate(2 * n - 2)
    with pytest.raises(DynlabInputError, match=f"token folder .*tok.*train.bin holds {2 * n - 2} bytes.*"
                                               "allowed: a folder written by `dynlab data prepare`"):
        open_token_folder(out)
    with pytest.raises(DynlabInputError, match="no such folder"):
        open_token_folder(tmp_path / "nothing")
    with pytest.raises(DynlabInputError, match="no tokens.json"):
        open_token_folder(tmp_path)
    record = json.loads((out / RECORD).read_text())
    record["tokenizer"]["n_ids"] = 70_000
    (out / RECORD).write_text(json.dumps(record))
    with pytest.raises(DynlabInputError, match="damaged.*dtype uint16 does not hold"):
        open_token_folder(out)


def test_an_empty_split_opens_as_an_empty_array(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefgh", encoding="utf-8")
    out, _ = prepare_tokens([tmp_path / "a.txt"], ByteTokenizer(), tmp_path / "tok", val_fraction=0.25)
    record = json.loads((out / RECORD).read_text())
    record["tokens"] = {"train": 8, "val": 0}
    (out / RECORD).write_text(json.dumps(record))
    (out / "train.bin").write_bytes(np.arange(97, 105, dtype="<u2").tobytes())
    (out / "val.bin").write_bytes(b"")
    folder = open_token_folder(out)
    assert folder.val.shape == (0,) and folder.val.dtype == np.uint16 and len(folder.train) == 8


def test_app_prepare_checks_options_and_says_what_it_did(tmp_path, bpe_dir, monkeypatch):
    from dynlab.app import data

    src = write_jsonl(tmp_path / "a.jsonl", make_docs(60))
    lines: list[tuple[str, object]] = []

    def echo(text, file=None):
        lines.append((text, file))

    with pytest.raises(DynlabInputError, match="--val-fraction 0.0 is out of range"):
        data.prepare([str(src)], str(bpe_dir), str(tmp_path / "tok"), val_fraction=0.0, echo=echo)
    with pytest.raises(DynlabInputError, match="tokenizer .*nope.*cannot be read"):
        data.prepare([str(src)], str(tmp_path / "nope"), str(tmp_path / "tok"), echo=echo)
    with pytest.raises(DynlabInputError, match="source .*missing.jsonl"):
        data.prepare([str(tmp_path / "missing.jsonl")], "byte", str(tmp_path / "tok"), echo=echo)
    (tmp_path / "f").write_text("x")
    with pytest.raises(DynlabInputError, match="^--out .*f' is a file"):
        data.prepare([str(src)], "byte", str(tmp_path / "f"), echo=echo)
    assert not (tmp_path / "tok").exists() and lines == []
    monkeypatch.setattr(data, "PROGRESS_EVERY_S", 0.0)
    path = data.prepare([str(src)], str(bpe_dir), str(tmp_path / "tok"), val_fraction=0.1, echo=echo)
    progress = [t for t, f in lines if f is not None]
    assert progress and all(t.startswith("tokenized ") and " tokens, " in t and t.endswith("/s") for t in progress)
    counts = open_token_folder(path).record["tokens"]
    assert lines[-1] == (f"train: {counts['train']:,} tokens, val: {counts['val']:,} tokens, uint16, {path}", None)
    lines.clear()
    assert data.prepare([str(src)], str(bpe_dir), str(tmp_path / "tok"), val_fraction=0.1, quiet=True,
                        echo=echo) == path
    assert lines == [(f"up to date: {path}", None)]
    assert data.progress_line(123_400_000, 1_200_000_000, 30_100_000, 10.0) == \
        "tokenized 123.4 MB of 1.2 GB, 30.1M tokens, 12.3 MB/s"


@pytest.mark.slow
def test_app_refusals_before_the_tokenizer_load_no_torch(tmp_path):
    """The checks that need nothing of dynlab.lm (whose package loads torch) refuse first."""
    import subprocess
    import sys

    probe = ("import sys\nfrom dynlab.app.data import prepare\nfrom dynlab.errors import DynlabInputError\n"
             f"for args in ([['{tmp_path}'], 'byte', 'o', 1.5], [['{tmp_path}/x'], 'byte', 'o', 0.1], "
             f"[['{tmp_path}'], '{tmp_path}', 'o', 0.1], [['{tmp_path}'], 'byte', ' ', 0.1]):\n"
             "    try:\n        prepare(*args)\n    except DynlabInputError as e:\n        print(str(e)[:20])\n"
             "print('torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:5] == ["--val-fraction 1.5 i", f"source '{tmp_path}/x"[:20], f"tokenizer '{tmp_path}"[:20],
                       "--out got an empty p", "False"]
