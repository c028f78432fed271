"""The command line's options, parsed and checked: the library side of ``cli.py``.

Every check of what a user typed lives here, shared by the command line (``cli.py``,
which only wires these functions to Typer) and the Python API: comma lists (repeats
collapsed, with one ``note:`` line), seeds, names, groups, presets, devices, executors,
paths, ranges, the folders a command writes (checked, and probed, before any work), a
spec's validation error said in the words of the options, and the post-train spec and
benchmark sizes built from options.  A refusal is one
:class:`~dynlab.errors.DynlabInputError` line naming the option as typed and the allowed
values.  Importing this module loads neither torch nor matplotlib.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from dynlab.errors import DynlabInputError, validation_errors
from dynlab.names import (CELL_NAMES, EXECUTORS, HF_EXPORT_ALLOWED, HF_EXPORT_FILES, INTERVENTION_NAMES, SOURCES, TBTT,
                          TBTT_ON_TASKS)

#: The output folder of the commands that write runs (``--out``).
DEFAULT_OUT = "dynlab-runs"
#: ``lm post-train --task`` kind -> the study whose quick preset gives its task grid.
POST_TRAIN_TASKS = {"copying": "copying", "passkey": "passkey", "babi": "babilong"}

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


def parse_list(text: str | None, option: str, key: Callable[[str], object] | None = None) -> tuple[str, ...] | None:
    """The items of a comma list given to ``option`` (None when the option was not given),
    repeats collapsed (by ``key``, default the item itself) with a note on stderr."""
    from dynlab.study import collapse_repeats

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
    refused here (:func:`dynlab.study.select_names`) when a name is unknown."""
    from dynlab.study import select_names

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


def nonempty_path(text: str, flag: str, allowed: str) -> Path:
    """The path given to ``flag``; an empty one is refused (it would mean the current folder)."""
    if not text.strip():
        raise DynlabInputError(f"{flag} got an empty path ({text!r}); allowed: {allowed}")
    return Path(text)


def out_folder(text: str, flag: str = "--out") -> Path:
    return nonempty_path(text, flag, f"a folder (made when missing), e.g. {flag} {DEFAULT_OUT}")


def check_source_option(text: str | None) -> str | None:
    """``--source``: a built-in text or an existing file (its content is checked when the specs are made)."""
    if text is None or text in SOURCES or (text.strip() and Path(text).expanduser().is_file()):
        return text
    raise DynlabInputError(f"--source {text!r} is neither one of the built-in texts ({', '.join(SOURCES)}) nor an "
                           f"existing text file; allowed: {', '.join(SOURCES)} or a path to a UTF-8 text file")


def in_range(flag: str, value: float, low: float, high: float | None = None, what: str = "") -> None:
    """Refuse ``value`` of ``flag`` outside [low, high]."""
    if value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"{low} or more"
        raise DynlabInputError(f"{flag} {value} is out of range; allowed: {allowed}{' ' + what if what else ''}")


@contextmanager
def in_option_words(fields: Mapping[str, str]) -> Iterator[None]:
    """Say a spec's validation error in the words of the options: a bad field named in
    ``fields`` is reported as that option (``chunk_len`` -> ``--seq-len``), one line; a
    refusal whose line starts with such a field (``source 'x': …``) names the option
    (``--source 'x': …``)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        parts: list[str] = []
        for loc, msg, err in validation_errors(exc):
            field = next((x for x in loc if x in fields), None)
            said = next((f for f in fields if msg.startswith((f"{f} ", f"{f}:")) and fields[f].startswith("--")), None)
            if field is None and said is not None:  # the spec as a whole, about a field an option sets
                part = fields[said] + msg[len(said):]
            elif field is None:  # a field no option sets, or the spec as a whole
                part = f"invalid {exc.title}: {'.'.join(loc) + ': ' if loc else ''}{msg}"
            elif "input" in err and not isinstance(err["input"], (dict, list, tuple)):
                part = f"{fields[field]} {err['input']!r}: {msg}"
            else:
                part = f"{fields[field]}: {msg}"
            if part not in parts:
                parts.append(part)
        raise DynlabInputError("; ".join(parts)) from None
    except DynlabInputError as exc:  # a refusal that names a field (``source 'x': …``): named as its option
        text = str(exc)
        field = next((f for f in fields if text.startswith(f"{f} ") and fields[f].startswith("--")), None)
        if field is None:
            raise
        raise DynlabInputError(fields[field] + text[len(field):]) from None


# -- folders ---------------------------------------------------------------------------

def folder_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (None when they can): ``"is a file"``,
    ``"is not writable (<reason>)"`` or, when it is missing, ``"cannot be made (<why>)"``
    about the nearest folder above it that exists.

    Writes nothing, not even a probe (folder times stay as they were): asks the system
    whether this process may create entries there (``access`` with the effective ids,
    which also answers for root and for read-only file systems)."""
    folder = folder.expanduser()
    here = folder
    while not os.path.lexists(here) and here.parent != here:  # lexists: never raises (a name too long is missing)
        here = here.parent
    missing = here != folder
    if not here.is_dir():
        what = "is a file" if here.is_file() else "is not a folder"
        return f"cannot be made ({here} {what})" if missing else what
    effective = os.access in os.supports_effective_ids
    if os.access(here, os.W_OK | os.X_OK, effective_ids=effective):
        return None
    try:
        why = "read-only file system" if os.statvfs(here).f_flag & os.ST_RDONLY else "permission denied"
    except OSError:
        why = "permission denied"
    return f"cannot be made ({here} is not writable: {why})" if missing else f"is not writable ({why})"


def check_out(out: Path, *below: str, flag: str = "--out") -> None:
    """Refuse an output folder (and the folders ``below`` it that the command writes in)
    that cannot receive files: one line naming it and why, before anything is computed
    or written.  The deepest folder is probed (:func:`dynlab.outputs.probe_folder`: made,
    written in, and removed again), so that what only the system knows (a file system
    that takes no files, a name too long) is found before the work."""
    from dynlab.outputs import probe_folder

    folders = (out, *(out / b for b in below))
    for folder in folders:
        problem = folder_problem(folder)
        if problem is None:
            continue
        allowed = "a folder (made when missing)" if problem == "is a file" else "a writable folder (made when missing)"
        where = f"{flag} {out}" if folder == out else f"{flag} {out}: {folder}"
        raise DynlabInputError(f"{where} {problem}; allowed: {allowed}")
    problem = probe_folder(folders[-1], deep=bool(below))  # what the system says when files are really made there
    if problem is not None:
        where = f"{flag} {out}" if folders[-1] == out else f"{flag} {out}: {folders[-1]}"
        raise DynlabInputError(f"{where} {problem}; allowed: a writable folder (made when missing)")


def check_study_folder(root: Path, probe: bool = True) -> None:
    """Refuse a study folder (``OUT/<study>``) that cannot receive files in itself or its
    ``runs/`` (with ``probe``, probed as a run's files will be written), before a run is
    trained or analysed (a study that cannot store its runs would lose them)."""
    from dynlab.outputs import probe_folder

    for folder in (root, root / "runs"):
        problem = folder_problem(folder)
        if problem is not None:
            raise DynlabInputError(f"cannot write the study: {folder} {problem}; allowed: a writable --out folder")
    problem = probe_folder(root / "runs", deep=True) if probe else None  # a run's files, as they will be written
    if problem is not None:
        raise DynlabInputError(f"cannot write the study: {root / 'runs'} {problem}; allowed: a writable --out folder")


def run_selected_study(name: str, get_study: Callable[[str], Any], options: Any, out: Path, device: str, quiet: bool,
                       analyze: bool, executor: str, scheduler: str | None, workers: int | None,
                       echo: Callable[..., Any]) -> Path:
    """Check that the folder of study ``name`` can be written, then get the study
    (``get_study``: ``dynlab.studies.get_study``, which imports its module), make its specs
    (refusing bad selections, and groups too large for the analyses, before a cluster is
    started or a folder made) and run it; the path of its dataset."""
    from dynlab.outputs import refuse_foreign_folder

    from dynlab.results.folder import check_study_folder as check_contract

    refuse_foreign_folder(out, "--out", allowed="a folder of studies (made when missing), not a run or study folder")
    check_contract(out / name, name, flag="--out")  # a folder of someone else's files: refused before any write
    check_study_folder(out / name)
    from dynlab.executors import make_executor
    from dynlab.runner import check_analyses_fit, run_study

    study = get_study(name)
    study.check_preset(options.preset)
    with in_option_words({"eval_lengths": "--lengths", "depths": "--depths", "babi_kinds": "--kinds",
                           "source": "--source", "seed": "--seeds", "group": "--groups", "arch": "--models"}):
        specs = study.make_specs(options)
    check_analyses_fit(study, specs, analyze)  # a group too large for the analyses, before a cluster starts
    say_notes(echo)
    with make_executor(executor, scheduler=scheduler, workers=workers) as ex:
        return run_study(study, options, out=out, device=device, progress=not quiet, analyze=analyze, executor=ex)


#: What each common preset is for (a study lists its own in `dynlab study list`).
PRESET_NOTES = {
    "smoke": "checks an installation: under a minute on 2 cores",
    "quick": "a 2-core laptop, minutes",
    "sweep": "quick's sizes with 5 seeds",
    "groups": "quick's sizes on 8 more groups × 3 seeds",
    "paper": "the papers' sizes: a GPU box or a cluster",
}


def preset_help(presets: tuple[str, ...]) -> str:
    """``--preset`` help naming every preset of a study, with what it is for."""
    return "One of: " + "; ".join(f"{p} ({PRESET_NOTES[p]})" if p in PRESET_NOTES else p for p in presets) + "."


def task_options(entry: Any, lengths: str | None, depths: str | None, kinds: str | None,
                 catalog: Mapping[str, Any]) -> dict:
    """``--lengths``, ``--depths``, ``--kinds`` as overrides of the task spec of the study
    ``entry`` of ``catalog`` (``extra["task"]``), each checked here: whole lengths within the
    stated limit, depths in [0, 1], kinds among the study's."""
    from dynlab.spec import MAX_LENGTH

    task: dict = {}
    for flag, text in (("--lengths", lengths), ("--depths", depths), ("--kinds", kinds)):
        if text is None:
            continue
        if flag not in entry.task_options:
            takers = ", ".join(e.name for e in catalog.values() if flag in e.task_options)
            raise DynlabInputError(f"study {entry.name} takes no {flag}; allowed: {takers} only")
    if lengths is not None:
        allowed = f"a comma list of whole numbers from 1 to {MAX_LENGTH}"
        values = parse_numbers(lengths, "--lengths", int, allowed)
        for n in values:
            if not 1 <= n <= MAX_LENGTH:
                raise DynlabInputError(f"--lengths {lengths!r}: length {n} is out of range; allowed: {allowed}")
        task["eval_lengths"] = list(values)
    if depths is not None:
        allowed = "a comma list of fractions from 0 to 1"
        values = parse_numbers(depths, "--depths", float, allowed)
        for d in values:
            if not 0.0 <= d <= 1.0:
                raise DynlabInputError(f"--depths {depths!r}: depth {d} is outside [0, 1]; allowed: {allowed}")
        task["depths"] = list(values)
    if kinds is not None:
        values = parse_list(kinds, "--kinds") or ()
        for k in values:
            if k not in entry.kinds:
                raise DynlabInputError(f"--kinds {kinds!r}: unknown kind {k!r}; allowed: a comma list of "
                                       f"{', '.join(entry.kinds)}")
        task["babi_kinds"] = list(values)
    return task


def post_train_places(out: str, checkpoint: Path) -> Path:
    """The output folder of ``lm post-train``, checked (not a run or study folder;
    ``OUT/post-train/runs`` probed), after checking that ``--checkpoint`` is a folder."""
    out_dir = out_folder(out)
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out_dir, "--out", allowed="a folder of studies (made when missing), not a run or study folder")
    check_out(out_dir, "post-train", "post-train/runs")  # the run goes to OUT/post-train/runs/<id>
    if not checkpoint.expanduser().is_dir():  # the words of dynlab.lm.posttrain.load_checkpoint
        why = "a file, not a folder" if checkpoint.expanduser().exists() else "no such folder"
        raise DynlabInputError(f"checkpoint {str(checkpoint.expanduser())!r} is not a model ({why}); allowed: a "
                               "dynlab LM run folder (spec.json + model.safetensors) or a Hugging Face Mamba/Mamba2 "
                               "folder (config.json + weights)")
    return out_dir




#: What ``dynlab figures`` writes (``dynlab.figures.write_figures``): a folder holding
#: only these takes new figures.
FIGURE_FILES = ("*.png", "*.pdf", "*.md", "NOTES.txt")


def option_of_other_studies(exc: BaseException, args: list[str], command: Callable[[], Any]) -> str | None:
    """The error line of ``dynlab study NAME --opt`` where ``--opt`` is an option of other
    studies, not of NAME: which studies take it (the framework would suggest a look-alike
    option); None for any other error.  ``command``: the command line's Click command."""
    name = getattr(exc, "option_name", None)
    if type(exc).__name__ != "NoSuchOption" or len(args) < 2 or args[0] != "study" or not name:
        return None
    group = command().commands["study"]
    takers = [n for n, c in group.commands.items() if n != args[1] and any(name in p.opts for p in c.params)]
    if not takers or args[1] not in group.commands:
        return None
    return f"error: study {args[1]} takes no {name}; allowed: {name} with {', '.join(takers)} (`dynlab study {args[1]} --help`)"


def quiet_libraries(quiet: bool = True) -> None:
    """``-q``: the libraries dynlab calls print no notices either (transformers' notices,
    such as its fallback from missing CUDA kernels, shown only as errors)."""
    if not quiet:
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"  # read when transformers sets up its logging
    transformers = sys.modules.get("transformers")
    if transformers is not None:
        transformers.logging.set_verbosity_error()


def tolerant_output() -> None:
    """Let stdout and stderr print any text on a terminal whose encoding lacks a character
    (``PYTHONIOENCODING=ascii``, ``LANG=C`` on an old Python): written as an escape
    (``\\u2026``) instead of failing with ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change now keeps its settings
                pass


def post_train_options(intervention: str, task: str | None, source: str, seq_len: int | None, steps: int,
                       batch_size: int, lr: float, length_multiple: int, samples: int, seed: int, device: str) -> None:
    """Refuse a bad option of ``dynlab lm post-train`` before anything is loaded."""
    from dynlab.spec import MAX_BATCH, MAX_LENGTH, MAX_SAMPLES, MAX_SEED, MAX_STEPS

    if task is not None and task not in POST_TRAIN_TASKS:
        raise DynlabInputError(f"unknown task kind {task!r}; allowed: {', '.join(POST_TRAIN_TASKS)}")
    if intervention not in INTERVENTION_NAMES:
        raise DynlabInputError(f"unknown --intervention {intervention!r}; allowed: {', '.join(INTERVENTION_NAMES)}")
    if task is not None and intervention == TBTT:
        raise DynlabInputError(TBTT_ON_TASKS)
    check_source_option(source)
    if seq_len is not None:
        in_range("--seq-len", seq_len, 2, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 0, MAX_STEPS)
    in_range("--batch-size", batch_size, 1, MAX_BATCH)
    in_range("--eval-multiple", length_multiple, 2, None, "(times --seq-len)")
    in_range("--samples", samples, 1, MAX_SAMPLES, "windows")
    in_range("--seed", seed, 0, MAX_SEED)
    if not lr > 0:
        raise DynlabInputError(f"--lr {lr} is out of range; allowed: a number above 0")
    check_device(device)


def post_train_spec(checkpoint: Path, intervention: str, task: str | None, task_grid: Mapping[str, Any] | None,
                    source: str, check_source: Callable[..., Any], seq_len: int | None, steps: int, batch_size: int,
                    lr: float, length_multiple: int, samples: int, seed: int) -> Any:
    """The :class:`~dynlab.lm.posttrain.PostTrainSpec` of ``dynlab lm post-train``'s options
    (``task_grid``: the task study's quick preset; ``check_source``: the LM studies' check
    that the text holds the evaluation), a validation error said in the options' words."""
    from dynlab.lm.posttrain import PostTrainSpec, PostTrainTrainSpec, checkpoint_digest, load_checkpoint
    from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMTaskSpec, check_eval_size

    _, meta = load_checkpoint(checkpoint)  # one line naming the path when it is not a model
    length = seq_len if seq_len is not None else int(meta.get("seq_len", 64))
    length_flag = "--seq-len" if seq_len is not None else f"the checkpoint's training length {length} (--seq-len)"
    with in_option_words({"chunk_len": length_flag, "bin_width": length_flag, "seq_len": length_flag,
                          "n_samples": "--samples", "effrem_samples": "--samples", "length_multiple": "--eval-multiple",
                          "steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "seed": "--seed",
                          "source": "--source", "kind": "--intervention"}):
        task_spec = None if task is None else LMTaskSpec(kind=task, **task_grid)
        evals = LMEvalSpec(length_multiple=length_multiple, n_samples=samples, chunk_len=min(256, length),
                           bin_width=min(16, length), effrem_samples=min(16, samples))
        if task_spec is None:  # the evaluation's size, before the text is read for it
            check_eval_size(length, evals.length_multiple, evals.n_samples)
        need = max([evals.length_multiple * length, *(task_spec.eval_lengths if task_spec else ())]) + 1
        data = check_source(source, LMDataSpec().val_fraction, need)
        return PostTrainSpec(
            checkpoint=str(checkpoint.expanduser().resolve()), checkpoint_sha256=checkpoint_digest(checkpoint),
            data=data, intervention=InterventionSpec(kind=intervention), task=task_spec,
            train=PostTrainTrainSpec(steps=steps, batch_size=batch_size, seq_len=length, lr=lr), eval=evals, seed=seed,
        )


def bench_options(models: str, hidden: int, batch: int, length: int, ensembles: str, steps: int, repeats: int,
                  quick: bool, device: str, json_out: str | None) -> tuple[tuple[str, ...], tuple[int, ...], int, int, Path | None]:
    """``dynlab bench train``'s options checked: ``(models, ensemble sizes, steps, repeats,
    JSON path)``, ``--quick`` applied, the JSON path probed before the benchmark runs."""
    from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS, MAX_WIDTH

    json_path = None if json_out is None else nonempty_path(json_out, "--json", "a file path, e.g. --json bench.json")
    if json_path is not None:
        from dynlab.outputs import check_json_path

        check_json_path(json_path)  # probed (a file made and removed beside it), before the benchmark runs
    names = parse_list(models, "--models") or ()
    cells = cell_names()
    for m in names:
        if m not in cells:
            raise DynlabInputError(f"unknown model {m!r}; allowed: a comma list of {', '.join(cells)}")
    allowed = f"a comma list of whole numbers from 1 to {MAX_ENSEMBLE}"
    sizes = parse_numbers(ensembles, "--ensembles", int, allowed) or ()
    if any(not 1 <= n <= MAX_ENSEMBLE for n in sizes):
        raise DynlabInputError(f"--ensembles {ensembles!r}: a size is out of range; allowed: {allowed}")
    in_range("--hidden", hidden, 1, MAX_WIDTH)
    in_range("--batch", batch, 1, MAX_BATCH)
    in_range("--length", length, 1, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 2, MAX_STEPS, "(the first is not timed)")
    in_range("--repeats", repeats, 1)
    check_device(device)
    if quick:
        steps, sizes, repeats = 3, tuple(n for n in sizes if n <= 16) or (16,), 1
    return names, sizes, steps, repeats, json_path


def export_places(run: Path, out: str, dtype: str | None) -> Path:
    """``dynlab lm export``'s output folder, checked with its run folder and ``--dtype``."""
    dtypes = ("float32", "float64", "bfloat16")
    if dtype is not None and dtype not in dtypes:
        raise DynlabInputError(f"--dtype {dtype!r} is not a dtype dynlab exports; allowed: {', '.join(dtypes)}")
    out_dir = nonempty_path(out, "OUT", "a folder (made when missing)")
    if not run.is_dir():
        raise DynlabInputError(f"RUN {str(run)!r} is not a folder; allowed: a dynlab LM run folder (runs/<id>)")
    from dynlab.outputs import refuse_foreign_folder

    from dynlab.outputs import refuse_inside_dynlab_folder

    refuse_foreign_folder(out_dir, "OUT", own=HF_EXPORT_FILES, allowed=HF_EXPORT_ALLOWED)  # before anything is loaded
    refuse_inside_dynlab_folder(out_dir, "OUT", "a folder outside dynlab's run and study folders")
    check_out(out_dir, flag="OUT")
    return out_dir


def figure_places(out: str, study_dir: str) -> tuple[Path, Path]:
    """``dynlab figures``'s output folder, checked (not a folder of other files, writable),
    and its STUDY_DIR (not an empty path)."""
    study = nonempty_path(study_dir, "STUDY_DIR", "a study folder written by `dynlab study`, or its dataset.nc")
    out_dir = nonempty_path(out, "--out", "a folder (made when missing), e.g. --out figures")
    from dynlab.outputs import refuse_foreign_folder

    from dynlab.results.folder import FIGURES_MARKER, check_owned_folder

    allowed = "a new or empty folder, or one `dynlab figures` wrote"
    refuse_foreign_folder(out_dir, "--out", own=FIGURE_FILES, allowed=allowed)
    check_owned_folder(out_dir, FIGURES_MARKER, FIGURE_FILES, "--out", allowed, legacy=figure_notes_of_dynlab)
    check_out(out_dir)
    return out_dir, study


def figure_notes_of_dynlab(folder: Path) -> bool:
    """Whether ``folder/NOTES.txt`` reads as the notes ``dynlab figures`` writes (a figure
    folder written before its marker existed)."""
    try:
        lines = (folder / "NOTES.txt").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return False
    note = re.compile(r"[\w.+-]+: (drawn empty|skipped) \(.*\)")
    return bool(lines) and (lines == ["all panels drawn"] or all(note.fullmatch(line) for line in lines))


def study_folder_to_analyze(text: str, device: str, quiet: bool = False) -> Path:
    """``dynlab analyze``'s folder, refused when it is an empty path, no study folder, or
    cannot be written (``quiet``: :func:`quiet_libraries`)."""
    study_dir = nonempty_path(text, "STUDY_DIR", "a study folder written by `dynlab study`")
    check_device(device)
    quiet_libraries(quiet)
    if not (study_dir / "manifest.json").exists():  # the words of dynlab.runner.analyze_study
        raise DynlabInputError(f"{study_dir} is not a dynlab study folder (no manifest.json); run `dynlab study ...` first")
    if (study_dir / "manifest.json").is_file():  # else analyze_study says why it cannot read it
        check_study_folder(study_dir, probe=False)  # analyze_study probes its files once the manifest is checked
    return study_dir


def tracking_study_options(entry: Any, models: str, groups: str | None, seeds: str | None, preset: str,
                           analyze: bool) -> Any:
    """The :class:`~dynlab.study.StudyOptions` of a word-problem study command (``entry``: its
    :class:`dynlab.studies.StudyEntry`); with ``analyze``, a group too large for the analyses
    is refused from its name (no torch)."""
    from dynlab.study import StudyOptions

    options = StudyOptions(preset=check_preset(entry, preset), models=parse_names(models, "--models", cell_names(), "model"),
                           groups=parse_groups(groups), seeds=parse_seeds(seeds))
    if analyze:
        from dynlab.spec import check_analysable

        for group in options.groups or ():
            check_analysable(group, entry.name)
    return options


def lm_study_options(entry: Any, models: str, interventions: str | None, source: str | None, lengths: str | None,
                     depths: str | None, kinds: str | None, seeds: str | None, preset: str,
                     catalog: Mapping[str, Any], knobs: Mapping[str, Any] | None = None,
                     config: Path | None = None) -> Any:
    """The :class:`~dynlab.study.StudyOptions` of a language-model study command: mixers,
    interventions, a text source and the task options of study ``entry`` of ``catalog``;
    ``knobs`` and ``config``: the common knobs and a ``--config`` file
    (:func:`lm_knob_options`), which the other options win over."""
    from dynlab.study import StudyOptions

    extra: dict = {}
    if interventions is not None:
        extra["interventions"] = list(parse_names(interventions, "--interventions", entry.interventions, "intervention"))
    if source is not None:
        extra["source"] = check_source_option(source)
    task = task_options(entry, lengths, depths, kinds, catalog)
    if task:
        extra["task"] = task
    extra = merge_extra(lm_knob_options(entry, knobs or {}, config), extra)
    return StudyOptions(preset=check_preset(entry, preset), models=parse_names(models, "--models", entry.models, "mixer"),
                        seeds=parse_seeds(seeds), extra=extra)


# -- the common LM knobs and --config ------------------------------------------------

#: The common knobs of the LM study commands: option -> (section of the study's options, spec field).
LM_KNOBS = {"--steps": ("train", "steps"), "--d-model": ("model", "d_model"), "--n-layers": ("model", "n_layers"),
            "--batch-size": ("train", "batch_size"), "--lr": ("train", "lr"), "--seq-len": ("train", "seq_len")}
#: The knob options of the LM study commands: parameter -> (option, type, help).
LM_KNOB_OPTIONS: dict[str, tuple[str, type, str]] = {
    "steps": ("--steps", int, "Training steps (default: the preset's)."),
    "d_model": ("--d-model", int, "Model width d_model (default: the preset's)."),
    "n_layers": ("--n-layers", int, "Number of blocks (default: the preset's)."),
    "batch_size": ("--batch-size", int, "Training batch size (default: the preset's)."),
    "lr": ("--lr", float, "Peak learning rate (default: the preset's)."),
    "seq_len": ("--seq-len", int, "length-generalization: training length T_train (default: the preset's)."),
    "config": ("--config", Path, "A TOML file of study options: the knobs above by field name (steps, d_model, …) "
               "and tables (model, train, eval, …) of spec fields; options typed here win."),
}
#: Fields a study sets itself, which neither a knob nor ``--config`` may set.
_FIXED_FIELDS = {"model": ("mixer",), "intervention": ("kind",), "task": ("kind",), "post": ("interventions",)}


def _is_task_study(entry: Any) -> bool:
    """The task studies (copying, passkey, babilong) are those that take task options."""
    return bool(entry.task_options)


def lm_config_specs(entry: Any) -> dict[str, type]:
    """Section of an LM study's options -> the spec class whose fields it overrides (imports torch)."""
    from dynlab.lm import spec as s

    common = {"model": s.LMModelSpec, "intervention": s.InterventionSpec}
    if _is_task_study(entry):
        return {**common, "task": s.LMTaskSpec, "train": s.TaskTrainSpec, "eval": s.TaskEvalSpec, "post": s.TaskPostSpec}
    return {**common, "train": s.LMTrainSpec, "eval": s.LMEvalSpec, "post": s.LMPostSpec}


def check_spec_value(spec_cls: type, section: str, field: str, value: Any, where: str) -> None:
    """Refuse ``value`` for ``field`` of ``spec_cls`` (section ``section`` of the options)
    unless the field exists, is not one the study sets itself, and takes the value (its
    type and range, as the spec checks them); ``where``: the option or config key as the
    user wrote it."""
    from pydantic import TypeAdapter, ValidationError

    fixed = _FIXED_FIELDS.get(section, ())
    allowed = [f for f in spec_cls.model_fields if f not in fixed]
    info = spec_cls.model_fields.get(field)
    if info is None or field in fixed:
        raise DynlabInputError(f"{where}: unknown key {field!r} in [{section}]; allowed: {', '.join(allowed)}")
    from typing import Annotated

    kind = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
    try:
        TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        msg = "; ".join(dict.fromkeys(e["msg"] for e in exc.errors()))
        said = f"{where} = {value!r}" if where.startswith("--config") else f"{where} {value!r}"
        raise DynlabInputError(f"{said}: {msg}") from None


def read_config(path: Path) -> dict[str, Any]:
    """The table of a TOML file (``tomllib``; on Python < 3.11 the ``tomli`` package); a
    file that is missing or not TOML is refused in one line."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python < 3.11
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise DynlabInputError("--config needs the package 'tomli' on Python < 3.11 (pip install tomli)") from None
    try:
        text = Path(path).expanduser().read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DynlabInputError(f"--config {str(path)!r} cannot be read ({why}); allowed: a UTF-8 TOML file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DynlabInputError(f"--config {str(path)!r} is not TOML ({exc}); allowed: a TOML file") from None


def lm_knob_options(entry: Any, knobs: Mapping[str, Any], config: Path | None) -> dict[str, Any]:
    """Overrides of an LM study's options (``StudyOptions.extra``) from the common knobs
    (``knobs``: option as typed -> value, None when not given; :data:`LM_KNOBS`) and a
    ``--config`` TOML file, each key and value checked against the field of the spec it
    sets.  The file holds the knobs by field name at the top (``steps``, ``d_model``,
    ``n_layers``, ``batch_size``, ``lr``, ``seq_len``), ``interventions`` (a list),
    ``source``, and tables ``[model]``, ``[train]``, ``[eval]``, ``[intervention]``,
    ``[post]`` (task studies also ``[task]``) of spec fields.  An option on the command
    line wins over the file."""
    given = {flag: v for flag, v in knobs.items() if v is not None}
    cfg = read_config(config) if config is not None else {}
    if not given and not cfg:
        return {}
    specs = lm_config_specs(entry)
    knob_keys = {field: flag for flag, (_, field) in LM_KNOBS.items()
                 if not (field == "seq_len" and _is_task_study(entry))}
    sections = tuple(specs)
    allowed_top = ", ".join([*knob_keys, "interventions", "source", *(f"[{s}]" for s in sections)])
    where = f"--config {config}"
    extra: dict[str, Any] = {}

    def put(section: str, field: str, value: Any, said: str) -> None:
        if field == "seq_len" and section == "train" and _is_task_study(entry):
            raise DynlabInputError(f"{said}: study {entry.name} trains on its task's lengths, not a seq_len; "
                                   "allowed: task.train_min and task.train_max in --config ([task])")
        check_spec_value(specs[section], section, field, value, said)
        extra.setdefault(section, {})[field] = value

    for key, value in cfg.items():
        if key in knob_keys:
            section = LM_KNOBS[knob_keys[key]][0]
            if key in cfg.get(section, {}):
                raise DynlabInputError(f"{where}: {key} is given twice (at the top and in [{section}]); "
                                       "allowed: one of them")
            put(section, key, value, f"{where}: {key}")
        elif key in sections:
            if not isinstance(value, dict):
                raise DynlabInputError(f"{where}: {key} = {value!r} is not a table; allowed: a [{key}] table of "
                                       f"{specs[key].__name__} fields")
            for field, v in value.items():
                put(key, field, v, f"{where}: {key}.{field}")
        elif key == "interventions":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DynlabInputError(f"{where}: interventions = {value!r}; allowed: a list of names of "
                                       f"{', '.join(entry.interventions)}")
            extra["interventions"] = list(parse_names(",".join(value), f"{where}: interventions",
                                                      entry.interventions, "intervention"))
        elif key == "source":
            if not isinstance(value, str):
                raise DynlabInputError(f"{where}: source = {value!r}; allowed: {', '.join(SOURCES)} or a text file")
            extra["source"] = check_source_option(value)
        else:
            raise DynlabInputError(f"{where}: unknown key {key!r}; allowed: {allowed_top}")
    for flag, value in given.items():  # the command line wins over the file
        section, field = LM_KNOBS[flag]
        put(section, field, value, flag)
    return extra


def merge_extra(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with the keys of ``over`` (dicts merged one level deep, ``over`` winning)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
def bench_lm_options(widths: str, ensembles: str, batch: int, length: int, steps: int,
                     json_out: str | None) -> tuple[tuple[int, ...], tuple[int, ...], Path | None]:
    """``dynlab bench lm``'s options checked: ``(widths, stack sizes, JSON path)``, the JSON
    path probed before the benchmark runs."""
    from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS

    json_path = None if json_out is None else nonempty_path(json_out, "--json", "a file path, e.g. --json bench.json")
    if json_path is not None:
        from dynlab.outputs import check_json_path

        check_json_path(json_path)
    allowed_w = "a comma list of widths from 8 to 1024 divisible by 8"
    sizes = parse_numbers(widths, "--widths", int, allowed_w) or ()
    if not sizes or any(not 8 <= w <= 1024 or w % 8 for w in sizes):
        raise DynlabInputError(f"--widths {widths!r}: allowed: {allowed_w}")
    allowed_e = f"a comma list of whole numbers from 1 to {MAX_ENSEMBLE}"
    stacks = parse_numbers(ensembles, "--ensembles", int, allowed_e) or ()
    if not stacks or any(not 1 <= n <= MAX_ENSEMBLE for n in stacks):
        raise DynlabInputError(f"--ensembles {ensembles!r}: allowed: {allowed_e}")
    in_range("--batch", batch, 1, MAX_BATCH)
    in_range("--length", length, 2, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 1, MAX_STEPS)
    return sizes, stacks, json_path


# -- the benchmark commands ----------------------------------------------------------

#: ``dynlab bench train``'s options: parameter -> (flags, type, help).
BENCH_TRAIN_OPTIONS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "models": (("--models", "-m"), str, "Comma list of architectures; the first is the headline."),
    "hidden": (("--hidden",), int, "Hidden width H."),
    "batch": (("--batch",), int, "Batch size B."),
    "length": (("--length",), int, "Sequence length T."),
    "ensembles": (("--ensembles",), str, "Comma list of ensemble sizes."),
    "steps": (("--steps",), int, "Training steps per measurement (the first is not timed)."),
    "repeats": (("--repeats",), int, "Rounds over all methods; each is reported at its fastest round (noisy machines)."),
    "quick": (("--quick",), bool, "About a minute: 3 steps, ensemble 16 only, one round."),
    "device": (("--device",), str, "auto (CUDA if present), cpu, cuda or cuda:N."),
    "compile": (("--compile",), bool, "Also time one model with torch.compile'd cell steps (slow to start)."),
    "json_out": (("--json",), Optional[str], "Also write the results as JSON to this file."),
}

#: ``dynlab bench lm``'s options: parameter -> (flags, type, help).
BENCH_LM_OPTIONS: dict[str, tuple[tuple[str, ...], type, str]] = {
    "widths": (("--widths",), str, "Comma list of model widths d_model (16: the budget preset's model, else the quick layout)."),
    "ensembles": (("--ensembles",), str, "Comma list of stack sizes."),
    "batch": (("--batch",), int, "Batch size B."),
    "length": (("--length",), int, "Sequence length T."),
    "steps": (("--steps",), int, "Timed training steps per measurement (after 2 untimed ones)."),
    "memory": (("--memory/--no-memory",), bool, "Measure each stack's peak memory in a child process."),
    "json_out": (("--json",), Optional[str], "Also write the results as JSON to this file."),
}


def run_bench_train(models: str, hidden: int, batch: int, length: int, ensembles: str, steps: int, repeats: int,
                    quick: bool, device: str, compile: bool, json_out: str | None, echo: Callable[..., None]) -> None:  # noqa: A002
    """``dynlab bench train``: check the options, measure, print the tables (and write the JSON)."""
    names, sizes, steps, repeats, json_path = bench_options(models, hidden, batch, length, ensembles, steps, repeats,
                                                            quick, device, json_out)
    say_notes(echo)
    from dynlab.bench import bench_train, train_payload, write_json
    from dynlab.report import bench_markdown

    with in_option_words({"hidden": "--hidden", "batch_size": "--batch", "min_length": "--length",
                          "max_length": "--length", "steps": "--steps"}):
        results = [bench_train(m, hidden, batch, length, sizes, steps=steps, device=device, compile=compile,
                               repeats=repeats) for m in names]
    echo(bench_markdown(train_payload(results)), nl=False)  # the tables of `dynlab report FILE.json`
    if json_path is not None:
        echo(f"json: {write_json(results, json_path)}")


def run_bench_lm(widths: str, ensembles: str, batch: int, length: int, steps: int, memory: bool,
                 json_out: str | None, echo: Callable[..., None]) -> None:
    """``dynlab bench lm``: check the options, measure (a line per measurement on stderr), print the tables."""
    sizes, stacks, json_path = bench_lm_options(widths, ensembles, batch, length, steps, json_out)
    from dynlab.bench import write_bench_json
    from dynlab.bench.lm import bench_lm, lm_bench_markdown

    payload = bench_lm(sizes, stacks, batch, length, steps, memory=memory, say=lambda line: echo(line, err=True))
    echo(lm_bench_markdown(payload), nl=False)
    if json_path is not None:
        echo(f"json: {write_bench_json(payload, json_path)}")
