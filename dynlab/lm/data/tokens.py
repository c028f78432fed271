"""Token corpora on disk: text tokenized once (``dynlab data prepare``), read as memory maps.

A *token folder* ``DIR`` holds three files:

- ``DIR/train.bin`` and ``DIR/val.bin``: the token ids, raw, little-endian, one after
  another with no header: ``uint16`` when the tokenizer's ``n_ids`` ≤ 65 536 (every id
  fits in two bytes), else ``uint32``;
- ``DIR/tokens.json`` (:data:`RECORD`), written last: ``format`` (``"dynlab-tokens"``),
  ``version`` (1), ``dtype`` (``"uint16"`` or ``"uint32"``), ``tokenizer`` (the
  :class:`~dynlab.lm.data.tokenizer.TokenizerSpec`, as ``model_dump()``), ``eos_id`` (the id
  written after every document, or null), ``val_fraction``, ``sources`` (each read file:
  ``path`` absolute, ``size`` in bytes, ``sha256`` of its bytes), ``documents`` (how many
  non-empty documents were read) and ``tokens`` (``{"train": n, "val": n}``, counts of ids).

The sources are read as :mod:`dynlab.lm.data.sources` says (which files, documents, long
documents in pieces).

Split (deterministic, no randomness): the last ``round(val_fraction · n)`` of the ``n``
ids validate, the others train, so a document may straddle the two.

:func:`prepare_tokens` writes a folder; :func:`open_token_folder` opens one as two
read-only ``np.memmap`` arrays, so a corpus of any size costs memory only for the windows
read from it.

Long module: the record, the writer and the reader change together (what the record says of
the split and the dtype is what the writer does and what the reader checks); the sections
below keep them apart.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dynlab.errors import DynlabInputError, format_validation_error
from dynlab.lm.data.tokenizer import Tokenizer, TokenizerSpec
from dynlab.lm.data.sources import SourceRecord, describe_sources, read_documents, source_files, text_batches

__all__ = ["BATCH_BYTES", "FORMAT", "RECORD", "Progress", "TokenCounts", "TokenFolder", "TokenRecord", "check_token_out",
           "check_val_fraction", "is_token_folder", "open_token_folder", "prepare_tokens", "token_dtype",
           "token_folder_problem"]

#: The record of a token folder, written last.
RECORD = "tokens.json"
#: The record's ``format``, and its ``version``.
FORMAT = "dynlab-tokens"
VERSION = 1
#: The files of a token folder.
SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
#: Text given to the tokenizer at once (bytes): memory stays bounded by about this much
#: text and its tokens, whatever the size of the corpus.
BATCH_BYTES = 8 << 20
#: Bytes moved at once from the end of train.bin to val.bin.
_COPY_BYTES = 16 << 20

#: ``progress(done_bytes, total_bytes, tokens)``: source bytes read so far, of all, and ids written.
Progress = Callable[[int, int, int], None]

#: What a token folder is, as the refusals say it.
ALLOWED_FOLDER = "a folder written by `dynlab data prepare`"


def token_dtype(n_ids: int) -> np.dtype:
    """The dtype of a tokenizer's ids on disk: little-endian ``uint16`` when ``n_ids`` ≤ 2**16
    (ids 0 … n_ids − 1 fit), else ``uint32``."""
    return np.dtype("<u2") if n_ids <= 2**16 else np.dtype("<u4")


#: The record's ``dtype`` -> the ids' dtype on disk.
DTYPES = {"uint16": "<u2", "uint32": "<u4"}


def _dtype_name(dtype: np.dtype) -> Literal["uint16", "uint32"]:
    return "uint16" if dtype.itemsize == 2 else "uint32"


class TokenCounts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    train: int = Field(ge=0)
    val: int = Field(ge=0)


class TokenRecord(BaseModel):
    """The record ``tokens.json`` of a token folder (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    format: Literal["dynlab-tokens"] = FORMAT
    version: Literal[1] = VERSION
    dtype: Literal["uint16", "uint32"]
    tokenizer: TokenizerSpec
    eos_id: int | None = Field(default=None, ge=0)
    val_fraction: float = Field(gt=0, lt=1)
    sources: list[SourceRecord]
    documents: int = Field(ge=0)
    tokens: TokenCounts

    @model_validator(mode="after")
    def _consistent(self) -> TokenRecord:
        if self.dtype == "uint16" and self.tokenizer.n_ids > 2**16:
            raise ValueError(f"dtype {self.dtype} does not hold the tokenizer's {self.tokenizer.n_ids} ids")
        if self.eos_id is not None and self.eos_id >= self.tokenizer.n_ids:
            raise ValueError(f"eos_id {self.eos_id} is not below the tokenizer's {self.tokenizer.n_ids} ids")
        return self

    def same_tokens(self, other: TokenRecord) -> bool:
        """Whether ``other`` was made from the same inputs (sources' paths, sizes and hashes;
        the tokenizer's kind, hash and ids; eos_id, val_fraction, dtype): the same ids."""
        def key(r: TokenRecord) -> tuple:
            tok = r.tokenizer
            return (r.version, r.dtype, tok.kind, tok.sha256, tok.n_ids, r.eos_id, r.val_fraction, r.sources)

        return key(self) == key(other)


@dataclass(frozen=True)
class TokenFolder:
    """An opened token folder: its ``path``, its ``record`` (the parsed ``tokens.json``) and
    the ids of each split as read-only ``np.memmap`` arrays (a split of 0 ids: an empty array)."""

    path: Path
    record: dict[str, Any]
    train: np.ndarray
    val: np.ndarray

    @property
    def tokenizer(self) -> TokenizerSpec:
        """The tokenizer the ids were made with."""
        return TokenizerSpec(**self.record["tokenizer"])

    @property
    def eos_id(self) -> int | None:
        return self.record["eos_id"]


def _read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def is_token_folder(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a ``tokens.json`` whose ``format`` is
    ``dynlab-tokens`` (whole or not: :func:`open_token_folder` checks the rest)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return False
    record = _read_record(folder)
    return record is not None and record.get("format") == FORMAT


def token_folder_problem(path: str | Path) -> str | None:
    """What is wrong with the token folder ``path`` (None when it opens): words for a refusal."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        return "a file, not a folder" if folder.exists() else "no such folder"
    if not (folder / RECORD).is_file():
        return f"no {RECORD}"
    record = _read_record(folder)
    if record is None:
        return f"{RECORD} is not a JSON object"
    if record.get("format") != FORMAT:
        return f"{RECORD} is not a dynlab token record (format {record.get('format')!r})"
    try:
        parsed = TokenRecord.model_validate(record)
    except ValidationError as exc:
        return f"{RECORD} is damaged ({format_validation_error(exc)})"
    itemsize = np.dtype(DTYPES[parsed.dtype]).itemsize
    for split, name in SPLIT_FILES.items():
        count = getattr(parsed.tokens, split)
        try:
            size = (folder / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != count * itemsize:
            return (f"{name} holds {size} bytes, the record says {count} {parsed.dtype} ids "
                    f"({count * itemsize} bytes): the file is cut short or was changed")
    return None


def _memmap(file: Path, dtype: np.dtype, count: int) -> np.ndarray:
    """The ``count`` ids of ``file``, read-only, mapped (not read); an empty array for none
    (``np.memmap`` refuses a zero-length map)."""
    if count == 0:
        empty = np.zeros(0, dtype=dtype)
        empty.flags.writeable = False
        return empty
    return np.memmap(file, dtype=dtype, mode="r", shape=(count,))


def open_token_folder(path: str | Path) -> TokenFolder:
    """Open the token folder ``path``: its record checked (it parses, every field valid) and
    each ``.bin`` file's size checked to equal its count × the dtype's size; the splits mapped
    read-only, never read into memory. Otherwise one :class:`DynlabInputError` line naming the
    folder and what is wrong."""
    folder = Path(path).expanduser()
    problem = token_folder_problem(folder)
    if problem is not None:
        raise DynlabInputError(f"token folder {str(folder)!r} cannot be read ({problem}); allowed: {ALLOWED_FOLDER}")
    record = _read_record(folder)
    assert record is not None
    dtype = np.dtype(DTYPES[record["dtype"]])
    return TokenFolder(path=folder, record=record,
                       train=_memmap(folder / SPLIT_FILES["train"], dtype, int(record["tokens"]["train"])),
                       val=_memmap(folder / SPLIT_FILES["val"], dtype, int(record["tokens"]["val"])))


# --- writing -------------------------------------------------------------------------------


def _encode(tokenizer: Tokenizer, texts: list[str], ends: list[bool], dtype: np.dtype) -> np.ndarray:
    """The ids of one batch as ``dtype``: each piece's, and ``eos_id`` after each document's
    last piece (when the tokenizer has one); an id outside 0 … n_ids − 1: one line."""
    encoded = tokenizer.encode_batch(texts)
    eos = tokenizer.eos_id
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    if eos is not None:
        lengths += np.asarray(ends, dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=np.int64)
    at = 0
    for ids, end in zip(encoded, ends):
        out[at:at + len(ids)] = ids
        at += len(ids)
        if end and eos is not None:
            out[at] = eos
            at += 1
    if out.size and (int(out.min()) < 0 or int(out.max()) >= tokenizer.n_ids):
        bad = int(out.max()) if int(out.max()) >= tokenizer.n_ids else int(out.min())
        raise DynlabInputError(f"tokenizer {tokenizer.spec().label} gave id {bad}, outside its {tokenizer.n_ids} ids; "
                               "allowed: a tokenizer whose ids are all below its vocabulary size")
    return out.astype(dtype)


def _write_ids(sources: Sequence[SourceRecord], tokenizer: Tokenizer, dtype: np.dtype, file: Path, batch_bytes: int,
               progress: Progress | None) -> tuple[int, int]:
    """Tokenize every document of ``sources`` into ``file``, batch by batch; the ids and the
    documents written. A second thread encodes each batch (the ``tokenizers`` library lets go
    of the GIL while it encodes on every core) while this one reads the next and writes the
    one before: reading, JSON parsing and writing overlap the encoding. At most three
    batches are held at once."""
    counted = [0]
    total = sum(s.size for s in sources)
    n = documents = 0
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dynlab-tokenize")
    pending: tuple[Future, int, int] | None = None  # a batch being encoded, its documents, the bytes read by then

    def write(batch: tuple[Future, int, int]) -> None:
        nonlocal n, documents
        ids = batch[0].result()
        ids.tofile(f)
        n += ids.size
        documents += batch[1]
        if progress is not None:
            progress(batch[2], total, n)

    try:
        with open(file, "wb") as f:
            for texts, ends in text_batches(read_documents(sources, counted), batch_bytes):
                encoding = pool.submit(_encode, tokenizer, texts, ends, dtype)
                if pending is not None:
                    write(pending)
                pending = (encoding, sum(ends), counted[0])
            if pending is not None:
                write(pending)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # after an error or Ctrl-C, a running batch is left to end
    return n, documents


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _split_tail(train: Path, val: Path, n: int, n_val: int, itemsize: int) -> None:
    """Move the last ``n_val`` of the ``n`` ids of ``train`` to ``val`` (in pieces), then cut ``train``."""
    start = (n - n_val) * itemsize
    with open(train, "rb") as src, open(val, "wb") as dst:
        src.seek(start)
        left = n_val * itemsize
        while left:
            chunk = src.read(min(_COPY_BYTES, left))
            if not chunk:
                raise OSError(f"{train} ended early")
            dst.write(chunk)
            left -= len(chunk)
    os.truncate(train, start)


def check_token_out(out: str | Path, what: str = "out") -> TokenRecord | None:
    """Refuse an output folder ``out`` (``what``: the option as typed) that is a file, or a
    folder holding files that are not a token folder's own: one line, nothing touched. The
    record of the token folder there when it opens whole (else None: a missing or empty
    folder, or a damaged token folder, made again)."""
    out = Path(out).expanduser()
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DynlabInputError(f"{what} {str(out)!r} is a file, not a folder; allowed: a new or empty folder, or "
                               f"{ALLOWED_FOLDER} (it is replaced)")
    if not out.is_dir():
        return None
    names = sorted(os.listdir(out))
    if not names:
        return None
    if not is_token_folder(out):
        listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        raise DynlabInputError(f"{what} {str(out)!r} holds files that are not a token folder ({listed}); "
                               f"allowed: a new or empty folder, or {ALLOWED_FOLDER} (it is replaced)")
    foreign = [n for n in names if n not in {RECORD, *SPLIT_FILES.values()}]
    if foreign:
        raise DynlabInputError(f"{what} {str(out)!r} is a token folder that also holds other files "
                               f"({', '.join(foreign[:3])}); allowed: a new or empty folder, or {ALLOWED_FOLDER} "
                               "holding only its own files")
    if token_folder_problem(out) is not None:
        return None  # damaged: made again
    return TokenRecord.model_validate(_read_record(out))


def check_val_fraction(val_fraction: float, what: str = "val_fraction") -> None:
    """Refuse a validation fraction outside the open interval (0, 1)."""
    if not 0.0 < val_fraction < 1.0:
        raise DynlabInputError(f"{what} {val_fraction} is out of range; allowed: a number between 0 and 1, both "
                               "excluded (the fraction of the ids that validate)")


def _missing_parents(folder: Path) -> list[Path]:
    missing = []
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    return missing


def prepare_tokens(sources: Sequence[str | Path], tokenizer: Tokenizer, out: str | Path, val_fraction: float = 0.01,
                   progress: Progress | None = None, batch_bytes: int = BATCH_BYTES) -> tuple[Path, bool]:
    """Tokenize ``sources`` with ``tokenizer`` into the token folder ``out``; the folder and
    whether anything was written.

    Checked before anything is written: ``val_fraction`` in (0, 1), ``out`` (a file, or a
    folder holding anything but a token folder's files, is refused), the sources (each
    exists; a folder holds usable files); then every file is hashed. When ``out`` is a whole
    token folder made from the same inputs (the same files, sizes and SHA-256s, the same
    tokenizer kind, hash and ids, ``eos_id`` and ``val_fraction``), nothing is done:
    ``(out, False)``.

    Otherwise the documents are tokenized in batches of about ``batch_bytes`` of text
    (``tokenizer.encode_batch``, on every core for a Hugging Face tokenizer), the ids
    appended to ``train.bin`` in a temporary folder beside ``out``; ``progress(done_bytes,
    total_bytes, tokens)`` is called after each batch. The last ``round(val_fraction · n)``
    ids are then moved to ``val.bin``, the record written, and the folder renamed to ``out``
    (an earlier token folder there is replaced). Both splits must hold at least 2 ids. On any
    error, Ctrl-C included, the temporary folder is removed and ``out`` stays as it was.
    """
    check_val_fraction(val_fraction)
    if batch_bytes < 1:
        raise DynlabInputError(f"batch_bytes {batch_bytes} is out of range; allowed: 1 or more")
    out = Path(out).expanduser().absolute()
    old = check_token_out(out)
    files = source_files(sources)
    described = describe_sources(files)
    dtype = token_dtype(tokenizer.n_ids)
    spec = tokenizer.spec()
    eos = tokenizer.eos_id
    if old is not None:
        wanted = TokenRecord(dtype=_dtype_name(dtype), tokenizer=spec, eos_id=eos, val_fraction=val_fraction,
                             sources=described, documents=0, tokens=TokenCounts(train=0, val=0))
        if old.same_tokens(wanted):
            return out, False
    created = _missing_parents(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        train, val = tmp / SPLIT_FILES["train"], tmp / SPLIT_FILES["val"]
        n, documents = _write_ids(described, tokenizer, dtype, train, batch_bytes, progress)
        n_val = int(round(val_fraction * n))
        if n_val < 2 or n - n_val < 2:
            raise DynlabInputError(f"the sources give {n} tokens: too few to split with val_fraction={val_fraction} "
                                   f"(train {n - n_val}, val {n_val}; each needs at least 2); allowed: more text, or "
                                   "another val_fraction")
        _split_tail(train, val, n, n_val, dtype.itemsize)
        record = TokenRecord(dtype=_dtype_name(dtype), tokenizer=spec, eos_id=eos, val_fraction=val_fraction,
                             sources=described, documents=documents, tokens=TokenCounts(train=n - n_val, val=n_val))
        (tmp / RECORD).write_text(json.dumps(record.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
        for f_ in (train, val, tmp / RECORD, tmp):
            _fsync(f_)
        _move_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created:  # the folders made for out, deepest first, when still empty
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return out, True


def _move_in(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``, over an earlier token folder there
    (:func:`dynlab.results.files.replace_folder`)."""
    from dynlab.results.files import replace_folder

    replace_folder(tmp, out)
