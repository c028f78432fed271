"""The text sources of a token folder (``dynlab data prepare``, :mod:`dynlab.lm.data.tokens`):
which files are read, how each becomes documents, and how the documents reach the tokenizer.

What is read (:func:`source_files`): a folder is searched recursively for every regular
file whose name ends in ``.txt``, ``.md``, ``.jsonl`` or ``.jsonl.gz``, in the order of
their sorted paths; a file given by name is read whatever its name. A ``.jsonl`` or
``.jsonl.gz`` file holds one document per line (a JSON object whose ``text`` field is a
string; blank lines are skipped); any other file is UTF-8 text and one document. Empty
documents are skipped. Each document is tokenized on its own and followed by the
tokenizer's end-of-document id when it has one (``eos_id``); without one, documents are
joined as they are.

A document longer than :data:`PIECE_BYTES` (about 1 MB) is tokenized in pieces that end
right after a newline (a piece with no newline in its first :data:`MAX_PIECE_BYTES` is cut
at a character boundary), so that one long file is spread over every core like many
documents. The ids then equal those of the whole document except, possibly, at a cut: a
tokenizer that could merge text across a newline, or that marks the start of a text
(SentencePiece's ``▁``), may tokenize the few characters around a cut differently. The
byte tokenizer's ids never differ.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from contextlib import nullcontext
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dynlab.errors import DynlabInputError

__all__ = ["ALLOWED_SOURCES", "MAX_PIECE_BYTES", "PIECE_BYTES", "SOURCE_SUFFIXES", "SourceRecord", "describe_sources",
           "read_documents", "source_files", "text_batches"]

#: The names read from a source folder.
SOURCE_SUFFIXES = (".txt", ".md", ".jsonl", ".jsonl.gz")
#: A document longer than this (bytes of a text file, characters of a JSON text) is tokenized in pieces.
PIECE_BYTES = 1 << 20
#: A piece without a newline is cut at a character boundary once this long.
MAX_PIECE_BYTES = 16 << 20

#: What a source may be, as the refusals say it.
ALLOWED_SOURCES = ("UTF-8 text files, .jsonl or .jsonl.gz files with a string 'text' field on every line, or folders "
                   "holding .txt, .md, .jsonl or .jsonl.gz files")


class SourceRecord(BaseModel):
    """One file read: its absolute ``path``, ``size`` in bytes and the SHA-256 of its bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def source_files(sources: Sequence[str | Path]) -> list[Path]:
    """The files that ``sources`` name, in order: a file itself; a folder's files whose names
    end in one of :data:`SOURCE_SUFFIXES`, recursively, sorted by path. A file named twice is
    read once. A missing source, a folder without such files, or no source at all: one line."""
    if not sources:
        raise DynlabInputError(f"no source given; allowed: one or more {ALLOWED_SOURCES}")
    files: list[Path] = []
    for source in sources:
        path = Path(source).expanduser()
        if path.is_dir():
            found = sorted(Path(root) / name for root, _, names in os.walk(path) for name in names
                           if name.endswith(SOURCE_SUFFIXES) and (Path(root) / name).is_file())
            if not found:
                raise DynlabInputError(f"source {str(source)!r} is a folder without .txt, .md, .jsonl or .jsonl.gz "
                                       f"files; allowed: {ALLOWED_SOURCES}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            why = "not a file or folder" if path.exists() else "no such file or folder"
            raise DynlabInputError(f"source {str(source)!r} cannot be read ({why}); allowed: {ALLOWED_SOURCES}")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(key)
    return unique


def describe_sources(files: Iterable[Path]) -> list[SourceRecord]:
    """Each file's absolute path, size (bytes) and SHA-256 (one read of every file); a file
    that cannot be read: one line."""
    from dynlab.results.store import file_digest  # the run store's hash of a file, read in blocks

    described = []
    for f in files:
        try:
            described.append(SourceRecord(path=str(f), size=f.stat().st_size, sha256=file_digest(f)["sha256"]))
        except OSError as err:
            raise DynlabInputError(f"source {str(f)!r} cannot be read ({err.strerror or type(err).__name__}); "
                                   f"allowed: {ALLOWED_SOURCES}") from None
    return described


def _chunks(path: Path, counted: list[int]) -> Iterator[bytes]:
    """The bytes of ``path`` (decompressed for ``.gz``) in pieces of :data:`PIECE_BYTES`;
    ``counted[0]`` grows by the file's bytes read for each piece."""
    gz = path.name.endswith(".gz")
    with open(path, "rb") as raw, (gzip.GzipFile(fileobj=raw, mode="rb") if gz else nullcontext(raw)) as stream:
        try:
            while True:
                chunk = stream.read(PIECE_BYTES)
                counted[0] = raw.tell()
                if not chunk:
                    return
                yield chunk
        except (OSError, EOFError, zlib.error) as err:
            why = "not a gzip file, or a damaged one" if gz else (getattr(err, "strerror", None) or type(err).__name__)
            raise DynlabInputError(f"source {str(path)!r} cannot be read ({why}); allowed: {ALLOWED_SOURCES}") from None


def _char_cut(buf: bytes) -> int:
    """Where to cut ``buf`` (UTF-8) without a newline: before the last character's first byte."""
    for j in range(len(buf) - 1, max(len(buf) - 4, 0) - 1, -1):
        if buf[j] & 0xC0 != 0x80:
            return j or len(buf)
    return len(buf)


def _decode(piece: bytes, path: Path, offset: int) -> str:
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DynlabInputError(f"source {str(path)!r}: byte {offset + err.start} is not UTF-8 text; "
                               f"allowed: {ALLOWED_SOURCES}") from None


def _text_pieces(path: Path, counted: list[int]) -> Iterator[tuple[str, bool]]:
    """A text file as one document, in pieces ending right after a newline: ``(text, last)``."""
    buf = b""
    offset = 0
    chunks = _chunks(path, counted)
    for chunk in chunks:
        buf += chunk
        if len(buf) < PIECE_BYTES:
            continue
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            if len(buf) < MAX_PIECE_BYTES:
                continue
            cut = _char_cut(buf)
        yield _decode(buf[:cut], path, offset), False
        offset += cut
        buf = buf[cut:]
    yield _decode(buf, path, offset), True


def _split_text(text: str) -> list[str]:
    """A JSON document's text in pieces of about :data:`PIECE_BYTES` characters, each ending
    right after a newline (or at :data:`MAX_PIECE_BYTES` characters without one)."""
    pieces = []
    start = 0
    while len(text) - start > PIECE_BYTES:
        cut = text.rfind("\n", start, start + PIECE_BYTES) + 1
        if cut <= start:
            nxt = text.find("\n", start + PIECE_BYTES, start + MAX_PIECE_BYTES)
            cut = nxt + 1 if nxt >= 0 else start + MAX_PIECE_BYTES
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _json_documents(path: Path, counted: list[int]) -> Iterator[str]:
    """The ``text`` of every line of a ``.jsonl`` (or ``.jsonl.gz``) file, blank lines skipped;
    a line that is not a JSON object with a string ``text`` field: one line naming it."""
    rest: list[bytes] = []
    number = 0

    def text_of(line: bytes) -> str | None:
        if not line.strip():
            return None
        doc: Any = None
        what = "no JSON object"
        try:
            doc = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            what = "not UTF-8 text"
        except ValueError:
            pass
        text = doc.get("text") if isinstance(doc, dict) else None
        if not isinstance(text, str):
            what = "no string 'text' field" if isinstance(doc, dict) else what
            raise DynlabInputError(f"source {str(path)!r} line {number}: {what}; allowed: {ALLOWED_SOURCES}")
        return text

    for chunk in _chunks(path, counted):
        if b"\n" not in chunk:  # a line longer than a chunk: gathered, not copied again for every chunk
            rest.append(chunk)
            continue
        lines = (b"".join(rest) + chunk).split(b"\n")
        rest = [lines.pop()]
        for line in lines:
            number += 1
            text = text_of(line)
            if text:
                yield text
    number += 1
    text = text_of(b"".join(rest))
    if text:
        yield text


def read_documents(files: Sequence[SourceRecord], counted: list[int]) -> Iterator[tuple[str, bool]]:
    """Every document of ``files`` as ``(piece, last piece of its document)``, empty documents
    left out; ``counted[0]``: bytes of the files read so far. A file whose size changed since
    it was hashed: one line."""
    done = 0
    for source in files:
        path = Path(source.path)
        here = [0]
        if _is_jsonl(path):
            for text in _json_documents(path, here):
                counted[0] = done + here[0]
                pieces = _split_text(text)
                for i, piece in enumerate(pieces):
                    yield piece, i == len(pieces) - 1
        else:
            pending: str | None = None  # one piece held back, so an empty last piece still ends the document
            for piece, last in _text_pieces(path, here):
                counted[0] = done + here[0]
                if piece:
                    if pending is not None:
                        yield pending, False
                    pending = piece
                if last and pending is not None:
                    yield pending, True
        if here[0] != source.size:
            raise DynlabInputError(f"source {source.path!r} changed while it was read ({here[0]} bytes, "
                                   f"{source.size} when hashed); allowed: files that stay as they are")
        done += source.size
        counted[0] = done


def text_batches(documents: Iterator[tuple[str, bool]], batch_bytes: int) -> Iterator[tuple[list[str], list[bool]]]:
    """The pieces of ``documents`` in batches of at least ``batch_bytes`` characters (the last
    may be shorter), each as ``(texts, ends)``: what the tokenizer is given at once."""
    texts: list[str] = []
    ends: list[bool] = []
    size = 0
    for text, end in documents:
        texts.append(text)
        ends.append(end)
        size += len(text)
        if size >= batch_bytes:
            yield texts, ends
            texts, ends, size = [], [], 0
    if texts:
        yield texts, ends


