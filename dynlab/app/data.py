"""``dynlab data prepare``: text tokenized once into a token folder (:mod:`dynlab.lm.data.tokens`),
its options checked before anything is read or written, its progress said on stderr.
Torch-free."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynlab.app.checks import nonempty_path, optional_path
from dynlab.app.folders import folder_problem
from dynlab.errors import DynlabInputError

#: Seconds between two progress lines.
PROGRESS_EVERY_S = 2.0


def human_bytes(n: float) -> str:
    """``n`` bytes in decimal units: ``512 B``, ``123.4 MB``, ``1.2 GB``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_count(n: float) -> str:
    """A count of tokens: ``950``, ``12.3K``, ``30.1M``, ``1.2B``."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))


def progress_line(done: int, total: int, tokens: int, seconds: float) -> str:
    """``tokenized 123.4 MB of 1.2 GB, 30.1M tokens, 12.3 MB/s`` (the rate over ``seconds``)."""
    rate = done / seconds if seconds > 0 else 0.0
    return f"tokenized {human_bytes(done)} of {human_bytes(total)}, {human_count(tokens)} tokens, {human_bytes(rate)}/s"


def light_checks(sources: Sequence[str], tokenizer: str, out: str, val_fraction: float) -> Path:
    """The checks of ``dynlab data prepare``'s options that need nothing of ``dynlab.lm`` (whose
    package loads torch), in the words of :mod:`dynlab.lm.data.tokens` and
    :mod:`dynlab.lm.data.tokenizer`: ``--val-fraction`` in (0, 1), a non-empty ``--out``, every
    SOURCE present, a ``--tokenizer`` that is ``byte`` or names a tokenizer.json. The output folder."""
    if not 0.0 < val_fraction < 1.0:
        raise DynlabInputError(f"--val-fraction {val_fraction} is out of range; allowed: a number between 0 and 1, "
                               "both excluded (the fraction of the ids that validate)")
    out_dir = nonempty_path(out, "--out", "a new or empty folder, or a token folder to replace")
    if not sources:
        raise DynlabInputError("no SOURCE given; allowed: one or more text files, .jsonl or .jsonl.gz files, or "
                               "folders of them")
    for source in sources:
        path = nonempty_path(source, "SOURCE", "text files, .jsonl or .jsonl.gz files, or folders of them") \
            if str(source).strip() else Path(source)
        if not str(source).strip() or not (path.is_file() or path.is_dir()):
            why = "not a file or folder" if str(source).strip() and path.exists() else "no such file or folder"
            raise DynlabInputError(f"source {str(source)!r} cannot be read ({why}); allowed: UTF-8 text files, "
                                   ".jsonl or .jsonl.gz files with a string 'text' field on every line, or folders "
                                   "holding .txt, .md, .jsonl or .jsonl.gz files")
    name = str(tokenizer)
    optional_path(name, "--tokenizer", ("byte",), "'byte', a tokenizer.json or a folder holding one")
    tok = Path(name).expanduser()
    if name != "byte" and (not name.strip() or not (tok.is_file() or (tok / "tokenizer.json").is_file())):
        why = "a folder without tokenizer.json" if name.strip() and tok.is_dir() else "no such file"
        raise DynlabInputError(f"tokenizer {str(tokenizer)!r} cannot be read ({why}); allowed: 'byte' (UTF-8 bytes), "
                               "a tokenizer.json file, or a folder holding a tokenizer.json")
    return out_dir


def prepare_options(sources: Sequence[str], tokenizer: str, out: str, val_fraction: float) -> tuple[Any, Path]:
    """Refuse a bad option of ``dynlab data prepare`` before anything is written: first
    :func:`light_checks`; then a ``--tokenizer`` that does not load, a SOURCE folder without
    usable files, an ``--out`` that is a file or a folder of other files, or one inside a
    folder that takes no files. The tokenizer and the output folder."""
    out_dir = light_checks(sources, tokenizer, out, val_fraction)
    from dynlab.lm.data.tokenizer import load_tokenizer
    from dynlab.lm.data.tokens import check_token_out, source_files

    tok = load_tokenizer(tokenizer)
    source_files(list(sources))
    check_token_out(out_dir, "--out")
    parent = out_dir.absolute().parent
    problem = folder_problem(parent)
    if problem is not None:
        raise DynlabInputError(f"--out {out_dir}: {parent} {problem}; allowed: a folder in a writable folder")
    return tok, out_dir


def prepare(sources: list[str], tokenizer: str, out: str, val_fraction: float = 0.01, quiet: bool = False,
            echo: Callable[..., Any] = print) -> Path:
    """``dynlab data prepare SOURCE... --tokenizer T --out DIR``: tokenize ``sources`` (text
    files, .jsonl/.jsonl.gz files, folders of them) with the tokenizer ``tokenizer`` (``byte``
    or a Hugging Face ``tokenizer.json``, or a folder holding one) into the token folder
    ``out``, the last ``val_fraction`` of the ids validating; the folder.

    The options are checked first (:func:`prepare_options`). Unless ``quiet``, a progress
    line goes to stderr every :data:`PROGRESS_EVERY_S` seconds; at the end one line on
    stdout: ``train: N tokens, val: M tokens, uint16, PATH``, or ``up to date: PATH`` when
    the folder already held these sources tokenized so. ``echo``: a print-like function
    that takes ``file=`` (``print``, ``typer.echo``)."""
    tok, out_dir = prepare_options(sources, tokenizer, out, val_fraction)
    from dynlab.lm.data.tokens import open_token_folder, prepare_tokens

    start = time.monotonic()
    last = [start]

    def progress(done: int, total: int, tokens: int) -> None:
        now = time.monotonic()
        if not quiet and now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            echo(progress_line(done, total, tokens, now - start), file=sys.stderr)

    path, wrote = prepare_tokens(list(sources), tok, out_dir, val_fraction=val_fraction, progress=progress)
    if not wrote:
        echo(f"up to date: {path}")
        return path
    folder = open_token_folder(path)
    counts = folder.record["tokens"]
    echo(f"train: {counts['train']:,} tokens, val: {counts['val']:,} tokens, {folder.record['dtype']}, {path}")
    return path
