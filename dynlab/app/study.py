"""``dynlab study NAME``: a study's options checked and assembled into
:class:`~dynlab.runner.protocol.StudyOptions`, its folders checked, its specs made and its runs run;
``dynlab study list``'s table.

:func:`run_tracking_study` and :func:`run_lm_study` take the options as the command line
takes them (comma lists as text) and refuse what it refuses, in the same one line
(:class:`~dynlab.errors.DynlabInputError`).  Importing this module loads neither torch nor
matplotlib; a study's module is imported when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dynlab.app.checks import (DEFAULT_OUT, NOTES, check_device, check_executor, check_preset, check_source_option,
                               checkpoint_folder,
                               optional_path, out_folder, parse_groups, parse_list, parse_names, parse_numbers,
                               parse_seeds, quiet_libraries, say_notes, cell_names)
from dynlab.app.checks import echo as plain_echo
from dynlab.app.folders import check_study_folder
from dynlab.app.lm_config import lm_knob_options, merge_extra, option_words
from dynlab.errors import DynlabInputError
from dynlab.studies import CATALOG, StudyEntry


def entry_of(name: str, command: str) -> StudyEntry:
    """The catalog entry of study ``name``, whose command is ``command`` (``tracking``: models,
    groups, seeds; ``lm``: mixers, interventions, a text source); one line otherwise."""
    entry = CATALOG.get(name)
    if entry is None or entry.command != command:
        takers = [e.name for e in CATALOG.values() if e.command == command]
        raise DynlabInputError(f"unknown {command} study {name!r}; allowed: {', '.join(takers)}")
    return entry


def run_tracking_study(name: str, models: str = "all", groups: str | None = None, seeds: str | None = None,
                       preset: str = "quick", out: str = DEFAULT_OUT, device: str = "auto", analyze: bool = True,
                       quiet: bool = False, executor: str = "inprocess", scheduler: str | None = None,
                       workers: int | None = None, echo: Callable[..., Any] = plain_echo) -> Path:
    """``dynlab study NAME`` of a word-problem study (group-tracking, nonlinearity): the
    options as typed (``models``, ``groups``, ``seeds``: comma lists), checked as the
    command line checks them; the path of the study's dataset (``note:`` lines: ``echo``)."""
    NOTES.clear()  # the notes of an earlier refusal are not this call's
    entry = entry_of(name, "tracking")
    options = tracking_study_options(entry, models, groups, seeds, preset, analyze=analyze)
    out_dir, start = checked_launch(entry, out, device, quiet, executor, scheduler, workers, echo)
    from dynlab.runner.driver import run_study  # torch: only once the options and folders are checked
    from dynlab.studies import get_study

    return run_study(get_study(name), options, out=out_dir, device=device, progress=not quiet, analyze=analyze,
                     executor=start, words=STUDY_WORDS)


def run_lm_study(name: str, models: str = "all", interventions: str | None = None, source: str | None = None,
                 lengths: str | None = None, depths: str | None = None, kinds: str | None = None,
                 seeds: str | None = None, preset: str = "quick", out: str = DEFAULT_OUT, device: str = "auto",
                 quiet: bool = False, executor: str = "inprocess", scheduler: str | None = None,
                 workers: int | None = None, knobs: Mapping[str, Any] | None = None, config: Path | None = None,
                 echo: Callable[..., Any] = plain_echo, checkpoint: str | None = None,
                 tokenizer: str | None = None) -> Path:
    """``dynlab study NAME`` of a language-model study (length-generalization, copying,
    passkey, babilong): the options as typed, ``knobs`` the common knobs by option
    (``{"--steps": 20}``, :data:`dynlab.app.lm_config.LM_KNOBS`) and ``config`` a
    ``--config`` TOML file, checked as the command line checks them; the dataset's path."""
    NOTES.clear()
    entry = entry_of(name, "lm")
    options = lm_study_options(entry, models, interventions, source, lengths, depths, kinds, seeds, preset, knobs,
                               config, checkpoint, tokenizer)
    typed = {"eval_lengths": ("--lengths", lengths), "depths": ("--depths", depths), "babi_kinds": ("--kinds", kinds),
             "source": ("--source", source)}
    words = option_words(knobs or {}, typed, config)  # a spec's error names the option or config key that set it
    out_dir, start = checked_launch(entry, out, device, quiet, executor, scheduler, workers, echo)
    from dynlab.runner.driver import run_study  # torch: only once the options and folders are checked
    from dynlab.studies import get_study

    return run_study(get_study(name), options, out=out_dir, device=device, progress=not quiet, analyze=False,
                     executor=start, words={**STUDY_WORDS, **words})


#: The option that sets each spec field a study's error may name (a study's own ``words`` win).
STUDY_WORDS = {"eval_lengths": "--lengths", "depths": "--depths", "babi_kinds": "--kinds", "source": "--source",
               "seed": "--seeds", "group": "--groups", "arch": "--models"}


def checked_launch(entry: StudyEntry, out: str, device: str, quiet: bool, executor: str, scheduler: str | None,
                   workers: int | None, echo: Callable[..., Any] = plain_echo) -> tuple[Path, Callable[[], Any]]:
    """What study ``entry`` runs in and on, checked before anything is made: the folder of
    studies ``out`` (its study folder someone else's, or a study whose runs another's:
    refused), the device, the executor.  Returns the folder and the function that starts
    the executor (a Dask cluster), saying the options' ``note:`` lines (``echo``) first;
    :func:`dynlab.runner.driver.run_study` calls it once it has made and checked the specs
    (a spec's error names the option that set the field: :data:`STUDY_WORDS`)."""
    out_dir = out_folder(out)
    check_device(device)
    check_executor(executor, scheduler, workers)
    quiet_libraries(quiet)
    from dynlab.outputs import refuse_foreign_folder
    from dynlab.results.folder import check_study_folder as check_contract

    refuse_foreign_folder(out_dir, "--out",
                          allowed="a folder of studies (made when missing), not a run or study folder")
    check_contract(out_dir / entry.name, entry.name, flag="--out")  # someone else's files: refused before any write
    check_study_folder(out_dir / entry.name)

    def start() -> Any:  # called once every spec is checked
        from dynlab.executors import make_executor

        say_notes(echo)
        return make_executor(executor, scheduler=scheduler, workers=workers)

    return out_dir, start


def study_table() -> list[str]:
    """``dynlab study list``: a line per study (name, presets, description) under a header."""
    rows = [(e.name, ", ".join(e.presets), e.description) for e in CATALOG.values()]
    w_name, w_presets = max(len("study"), *(len(r[0]) for r in rows)), max(len("presets"), *(len(r[1]) for r in rows))
    return [f"{name:{w_name}s}  {presets:{w_presets}s}  {description}"
            for name, presets, description in [("study", "presets", "description"), *rows]]


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


def task_options(entry: StudyEntry, lengths: str | None, depths: str | None, kinds: str | None) -> dict:
    """``--lengths``, ``--depths``, ``--kinds`` as overrides of the task spec of the study
    ``entry`` (``extra["task"]``), each checked here: whole lengths within the
    stated limit, depths in [0, 1], kinds among the study's."""
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


def tracking_study_options(entry: StudyEntry, models: str, groups: str | None, seeds: str | None, preset: str,
                           analyze: bool) -> Any:
    """The :class:`~dynlab.runner.protocol.StudyOptions` of a word-problem study command (``entry``: its
    :class:`dynlab.studies.StudyEntry`); with ``analyze``, a group too large for the analyses
    is refused from its name (no torch)."""
    from dynlab.runner.protocol import StudyOptions

    preset = check_preset(entry, preset)  # the options checked in the order the command lists them
    names = parse_names(models, "--models", cell_names(), "model")
    chosen = parse_groups(groups)  # the word-problem studies' own selection: extra["groups"]
    options = StudyOptions(preset=preset, models=names, seeds=parse_seeds(seeds),
                           extra={} if chosen is None else {"groups": chosen})
    if analyze:
        from dynlab.tracking.selection import check_analysable

        for group in chosen or ():
            check_analysable(group, entry.name)
    return options


def check_checkpoint_option(entry: StudyEntry, checkpoint: str) -> str:
    """``--checkpoint``: an existing folder, for the study whose ``pretrained`` preset takes one."""
    if "pretrained" not in entry.presets:
        raise DynlabInputError(f"--checkpoint is not an option of {entry.name}; allowed: length-generalization "
                               "--preset pretrained --checkpoint DIR")
    return str(checkpoint_folder(checkpoint, f"--checkpoint {checkpoint!r}"))


def lm_study_options(entry: StudyEntry, models: str, interventions: str | None, source: str | None,
                     lengths: str | None, depths: str | None, kinds: str | None, seeds: str | None, preset: str,
                     knobs: Mapping[str, Any] | None = None, config: Path | None = None,
                     checkpoint: str | None = None, tokenizer: str | None = None) -> Any:
    """The :class:`~dynlab.runner.protocol.StudyOptions` of a language-model study command: mixers,
    interventions, a text source and the task options of study ``entry``;
    ``knobs`` and ``config``: the common knobs and a ``--config`` file
    (:func:`lm_knob_options`), which the other options win over."""
    from dynlab.runner.protocol import StudyOptions

    extra: dict = {}
    if interventions is not None:
        extra["interventions"] = list(parse_names(interventions, "--interventions", entry.interventions,
                                                  "intervention"))
    if source is not None:
        extra["source"] = check_source_option(source)
    task = task_options(entry, lengths, depths, kinds)
    if task:
        extra["task"] = task
    if checkpoint is not None:
        extra["checkpoint"] = check_checkpoint_option(entry, checkpoint)
    if tokenizer is not None:
        optional_path(tokenizer, "--tokenizer", ("byte",), "'byte', a tokenizer.json or a folder holding one")
        extra["tokenizer"] = tokenizer
    extra = merge_extra(lm_knob_options(entry, knobs or {}, config), extra)
    return StudyOptions(preset=check_preset(entry, preset),
                        models=parse_names(models, "--models", entry.models, "mixer"),
                        seeds=parse_seeds(seeds), extra=extra)


