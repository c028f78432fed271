"""What every command checks in what a user typed: comma lists (repeats collapsed, with one
``note:`` line), seeds, names, groups, presets, devices, executors, paths, ranges, and a
spec's validation error said in the words of the options.

A refusal is one :class:`~dynlab.errors.DynlabInputError` line naming the option as typed
and the allowed values.  Importing this module loads neither torch nor matplotlib.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dynlab.errors import DynlabInputError
from dynlab.names import CELL_NAMES, EXECUTORS, SOURCES

#: The output folder of the commands that write runs (``--out``).
DEFAULT_OUT = "dynlab-runs"
#: ``note:`` lines of the command being parsed, printed once its input is accepted (:func:`say_notes`).
NOTES: list[str] = []


def note_repeats(option: str, text: str, counts: Mapping[object, int]) -> None:
    """Keep one ``note:`` line saying which values of ``option`` were given more than once."""
    if counts:
        said = " and ".join(f"{v} {n} times" for v, n in counts.items())
        NOTES.append(f"note: {option} {text} names {said}; {'each' if len(counts) > 1 else 'it'} runs once")


def say_notes(echo: Callable[..., Any]) -> None:
    """Print the kept notes on stderr with ``echo`` (``typer.echo``; a refused command prints
    its one error line only)."""
    for line in NOTES:
        echo(line, err=True)
    NOTES.clear()


def echo(text: str = "", err: bool = False, nl: bool = True) -> None:
    """Print ``text`` on stdout (``err``: stderr), as ``typer.echo`` does: the default ``echo``
    of the application functions called from Python."""
    print(text, end="\n" if nl else "", file=sys.stderr if err else sys.stdout, flush=True)


def parse_list(text: str | None, option: str, key: Callable[[str], object] | None = None) -> tuple[str, ...] | None:
    """The items of a comma list given to ``option`` (None when the option was not given),
    repeats collapsed (by ``key``, default the item itself) with a note on stderr."""
    from dynlab.runner.protocol import collapse_repeats

    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise DynlabInputError(f"{option} got an empty list ({text!r}); allowed: a comma list of one or more values")
    if len(items) != text.count(",") + 1:  # 'a,,b' or 'a,': an item left out by mistake is not dropped silently
        raise DynlabInputError(f"{option} {text!r} has an empty item; allowed: a comma list of one or more values, "
                               "none empty")
    kept, counts = collapse_repeats(items, key)
    note_repeats(option, text, counts)
    return kept


def parse_numbers(text: str | None, option: str, cast: type, allowed: str) -> tuple | None:
    """The numbers of a comma list given to ``option``, repeats collapsed (by value)."""
    items = parse_list(text, option, key=lambda x: cast_item(x, cast, option, text, allowed))
    return None if items is None else tuple(cast_item(x, cast, option, text, allowed) for x in items)


def cast_item(item: str, cast: type, option: str, text: str | None, allowed: str):
    try:
        return cast(item)
    except ValueError:
        raise DynlabInputError(f"{option} must be {allowed}, got {text!r}") from None


def parse_seeds(text: str | None) -> tuple[int, ...] | None:
    seeds = parse_numbers(text, "--seeds", int, "a comma list of integers from 0 to 2**63 - 1")
    if seeds is not None and any(not 0 <= s < 2**63 for s in seeds):
        raise DynlabInputError(f"--seeds must be ≥ 0 and < 2**63, got {text!r}")
    return seeds


def parse_names(text: str, option: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A selection of names (``all`` or names of ``allowed``) as typed, repeats collapsed;
    refused here (:func:`dynlab.runner.protocol.select_names`) when a name is unknown."""
    from dynlab.runner.protocol import select_names

    names = parse_list(text, option) or ()
    select_names(names, (), allowed, what)
    return names


def cell_names() -> tuple[str, ...]:
    """The cells ``--models`` accepts: the registry's when dynlab.tracking.models is loaded (it may
    hold cells registered at run time), else the built-in ones."""
    models = sys.modules.get("dynlab.tracking.models")
    return tuple(models.available_cells()) if models is not None else CELL_NAMES


def parse_groups(text: str | None) -> tuple[str, ...] | None:
    """Groups in canonical spelling (``c2`` is ``C2``), each checked from its name by
    :func:`dynlab.tracking.groups.group_name` (unknown or too large: one line), repeats collapsed."""
    from dynlab.tracking.groups import group_name

    items = parse_list(text, "--groups", key=group_name)  # from the names: no group is built to refuse one
    return None if items is None else tuple(group_name(g) for g in items)


def check_preset(entry: Any, preset: str) -> str:
    """``preset`` when it is one of the study's (``entry``: a :class:`dynlab.studies.StudyEntry`)."""
    if preset not in entry.presets:
        raise DynlabInputError(f"unknown preset {preset!r} for study {entry.name}; allowed: {', '.join(entry.presets)}")
    return preset


def check_device(device: str) -> str:
    """``device`` when it names one (auto, cpu, cuda, cuda:N); whether CUDA is present is
    checked when the command runs."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device.strip().lower()):
        raise DynlabInputError(f"unknown device {device!r}; allowed: auto, cpu, cuda (or cuda:N)")
    return device


def check_executor(executor: str, scheduler: str | None, workers: int | None) -> None:
    if executor not in EXECUTORS:
        raise DynlabInputError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if executor == "inprocess" and (scheduler is not None or workers is not None):
        raise DynlabInputError("--scheduler and --workers need --executor dask")
    if workers is not None:
        from dynlab.executors import check_workers

        check_workers(workers)


def nonempty_path(text: str | Path, flag: str, allowed: str) -> Path:
    """The path given to ``flag``, ``~`` expanded: the one reading of every path a command
    takes (an output folder, a study folder, a run, a --source, --config, --checkpoint or
    --tokenizer file), done before any work.  Refused in one line naming ``flag``: an empty
    path (it would mean the current folder), a name that is not valid UTF-8 (bytes of
    another encoding: the paths dynlab records in JSON, netCDF and safetensors files are
    UTF-8 text), and ``~user`` of a user this machine does not know."""
    text = str(text)
    if not text.strip():
        raise DynlabInputError(f"{flag} got an empty path ({text!r}); allowed: {allowed}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a byte the file system name holds that is not UTF-8 (os.fsdecode's surrogates)
        raise DynlabInputError(f"{flag} {shown_path(text)} is not valid UTF-8; allowed: {allowed}, named in "
                               "UTF-8") from None
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~user of an unknown user, or ~ without a home folder
        user = text[1:].split("/", 1)[0]
        who = f"no user {user!r}" if user else "no home folder"
        raise DynlabInputError(f"{flag} {text!r}: this machine has {who} ({text.split('/', 1)[0]} cannot be "
                               f"expanded); allowed: {allowed}") from None


def shown_path(text: str) -> str:
    """``text`` quoted for an error line, the bytes that are not UTF-8 as ``\\xff``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # surrogates that no file name decoded to (from Python)
        return repr(text)
    return "'" + raw.decode("utf-8", "backslashreplace") + "'"


def optional_path(text: str | None, flag: str, names: tuple[str, ...], allowed: str) -> None:
    """Refuse, as :func:`nonempty_path` does, an option that takes a built-in name
    (``names``: ``shakespeare``, ``byte``) or a path, when it is a path; an empty one is
    left to the option's own check."""
    if text is not None and text not in names and str(text).strip():
        nonempty_path(text, flag, allowed)


def out_folder(text: str, flag: str = "--out") -> Path:
    return nonempty_path(text, flag, f"a folder (made when missing), e.g. {flag} {DEFAULT_OUT}")


def check_source_option(text: str | None, flag: str = "--source") -> str | None:
    """``--source`` (``flag``: the option or config key as written): a built-in text, an
    existing file or a token folder (``dynlab data prepare``; its record is read when the
    specs are made, as a file's content)."""
    optional_path(text, flag, SOURCES, f"{', '.join(SOURCES)}, a text file or a token folder")
    path = Path(text).expanduser() if text and text.strip() else None
    if text is None or text in SOURCES or (path is not None and (path.is_file() or (path / "tokens.json").is_file())):
        return text
    raise DynlabInputError(f"{flag} {text!r} is neither one of the built-in texts ({', '.join(SOURCES)}), an "
                           f"existing text file nor a token folder; allowed: {', '.join(SOURCES)}, a path to a UTF-8 "
                           "text file, or a folder written by dynlab data prepare")


def checkpoint_folder(text: str | Path, said: str | None = None) -> Path:
    """A checkpoint given on the command line (``--checkpoint``), ``~`` expanded: an
    existing folder (its files are read when it loads,
    :func:`dynlab.lm.hub.checkpoint.load_checkpoint`), else one line naming it as ``said``
    (``--checkpoint 'x'``; None: ``checkpoint '<the path>'``) in that function's words."""
    allowed = "a dynlab LM run folder or a Hugging Face Mamba/Mamba2 folder"
    path = nonempty_path(text, "--checkpoint", allowed) if str(text).strip() else Path(text)
    said = f"checkpoint {str(path)!r}" if said is None else said
    if not str(text).strip() or not path.is_dir():
        why = "a file, not a folder" if str(text).strip() and path.exists() else "no such folder"
        raise DynlabInputError(f"{said} is not a model ({why}); allowed: a dynlab LM run folder (spec.json + "
                               "model.safetensors) or a Hugging Face Mamba/Mamba2 folder (config.json + weights)")
    return path


def in_range(flag: str, value: float, low: float, high: float | None = None, what: str = "") -> None:
    """Refuse ``value`` of ``flag`` outside [low, high]."""
    if value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"{low} or more"
        raise DynlabInputError(f"{flag} {value} is out of range; allowed: {allowed}{' ' + what if what else ''}")


def quiet_libraries(quiet: bool = True) -> None:
    """``-q``: the libraries dynlab calls print no notices either (transformers' notices,
    such as its fallback from missing CUDA kernels, shown only as errors)."""
    if not quiet:
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"  # read when transformers sets up its logging
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.logging.set_verbosity_error()

