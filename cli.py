"""The ``dynlab`` command line.  Wiring only: every command calls a library function.

Bad input (unknown model, group, preset, device; impossible values; a broken study
folder) prints one line ``error: …`` naming the problem and the allowed values, and exits
with code 2, before anything is written.  Set ``DYNLAB_DEBUG=1`` to get the traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

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
PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="quick (a 2-core laptop, minutes) or paper.")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output folder; the study writes OUT/<study>/.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA if present), cpu, cuda or cuda:N.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")]
ExecutorOpt = Annotated[str, typer.Option("--executor", help="Where runs train: inprocess (default) or dask.")]
SchedulerOpt = Annotated[
    Optional[str], typer.Option("--scheduler", help="Dask scheduler address (tcp://host:8786) of an existing cluster.")
]
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", help="Start a local Dask cluster of N worker processes.")]


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise ValueError(f"empty list {text!r}")
    return items


def _seeds(text: str | None) -> tuple[int, ...] | None:
    items = _csv(text)
    if items is None:
        return None
    try:
        seeds = tuple(int(x) for x in items)
    except ValueError:
        raise ValueError(f"seeds must be a comma list of non-negative integers, got {text!r}") from None
    if any(not 0 <= s < 2**63 for s in seeds):
        raise ValueError(f"seeds must be ≥ 0 and < 2**63, got {text!r}")
    return seeds


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
        options = StudyOptions(preset=preset, models=_csv(models), groups=_csv(groups), seeds=_seeds(seeds))
        study.check_preset(options.preset)
        study.make_specs(options)  # refuse bad selections before a cluster is started
        with make_executor(executor, scheduler=scheduler, workers=workers) as ex:
            path = run_study(
                study, options, out=out, device=device, progress=not quiet, analyze=not no_analysis, executor=ex
            )
        typer.echo(f"dataset: {path}")

    from dynlab.studies import get_study

    study_app.command(name=name, help=get_study(name).description)(command)


@study_app.command("list")
def study_list() -> None:
    """List the registered studies and their presets."""
    from dynlab.studies import STUDIES

    for s in STUDIES.values():
        typer.echo(f"{s.name:24s} presets: {', '.join(s.presets):14s} {s.description}")


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

    path = analyze_study(study_dir, get_study, device=device, progress=not quiet)
    typer.echo(f"dataset: {path}")


@app.command()
def figures(
    study_dir: Annotated[Path, typer.Argument(help="A study folder written by `dynlab study` (or its dataset.nc).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the PNG and PDF files.")] = Path("figures"),
) -> None:
    """Draw every panel of a study (PNG + PDF) and one composite figure."""
    from dynlab.figures import write_figures
    from dynlab.runner import open_study

    figs = write_figures(open_study(study_dir), out)
    for path in figs.written:
        typer.echo(str(path))
    for name, why in figs.skipped.items():
        typer.echo(f"skipped {name}: {why}")


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
    quick: Annotated[bool, typer.Option("--quick", help="About a minute: 3 steps, ensemble 16 only.")] = False,
    device: DeviceOpt = "auto",
    compile: Annotated[
        bool, typer.Option("--compile", help="Also time one model with torch.compile'd cell steps (slow to start).")
    ] = False,
    json_out: Annotated[
        Optional[Path], typer.Option("--json", help="Also write the results as JSON to this file.")
    ] = None,
) -> None:
    """Training throughput: user baseline vs dynlab (one model, ensembles) vs the GEMM floor."""
    from dynlab.bench import bench_train, format_table, write_json

    if json_out is not None and not json_out.parent.resolve().is_dir():
        raise ValueError(f"--json {json_out}: folder {json_out.parent} does not exist")
    names = _csv(models) or ()
    try:
        sizes = tuple(int(x) for x in (_csv(ensembles) or ()))
    except ValueError:
        raise ValueError(f"--ensembles must be a comma list of integers, got {ensembles!r}") from None
    if quick:
        steps, sizes = 3, tuple(n for n in sizes if n <= 16) or (16,)
    results = [bench_train(m, hidden, batch, length, sizes, steps=steps, device=device, compile=compile) for m in names]
    typer.echo(format_table(results))
    if json_out is not None:
        typer.echo(f"json: {write_json(results, json_out)}")


def _register_studies() -> None:
    from dynlab.studies import STUDIES

    for name in STUDIES:
        _add_study_command(name)


_register_studies()


def main(argv: list[str] | None = None) -> int:
    """Console entry point: maps bad input to one line on stderr and exit code 2."""
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
        typer.echo(f"error: invalid {exc.title}: {format_validation_error(exc)}", err=True)
        return 2
    except (ValueError, OSError) as exc:  # bad input, or a path that cannot be read/written
        if os.environ.get("DYNLAB_DEBUG"):
            raise
        typer.echo(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
