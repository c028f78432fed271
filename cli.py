"""The ``dynlab`` command line: Typer wiring only; every command calls its function of the
application layer (:mod:`dynlab.app`), which checks the options and does the work.

Bad input (an unknown name, an impossible value, a broken study folder, an output folder
that cannot be written) prints one line ``error: …`` naming the option as typed and the
allowed values, and exits with code 2 before anything is written
(:class:`dynlab.errors.DynlabInputError`); Ctrl-C prints ``interrupted`` (exit code 130);
anything else is a bug or a failing machine: one line, exit code 1 (``DYNLAB_DEBUG=1``: its
traceback).  ``--help``, ``dynlab study list`` and a refusal load neither torch nor
matplotlib (the studies are described by :data:`dynlab.studies.CATALOG`); a name given twice
(``--groups C2,c2``) is used once, with a ``note:`` line on stderr.
"""

from __future__ import annotations

import os
import sys

from dynlab._start import command_ends as _command_ends
from dynlab._start import command_starts as _command_starts
from dynlab._start import guard_start as _guard_start
from dynlab._start import interrupted_at_start as _interrupted_at_start  # noqa: F401 - the guard's handler, by name
from dynlab._start import raise_pending as _raise_pending

if __name__ == "__main__":  # python -m dynlab.cli: the executable's own guard is in dynlab/__init__.py
    _guard_start()

from pathlib import Path  # noqa: E402 - after the start-up guard
from typing import Annotated, Optional  # noqa: E402

import typer  # noqa: E402

from dynlab.app import analyze as app_analyze  # noqa: E402
from dynlab.app import bench as app_bench  # noqa: E402
from dynlab.app import checks, console, lm_config, posttrain  # noqa: E402
from dynlab.app import data as app_data  # noqa: E402
from dynlab.app import export as app_export  # noqa: E402
from dynlab.app import figures as app_figures  # noqa: E402
from dynlab.app import models as app_models  # noqa: E402
from dynlab.app import report as app_report  # noqa: E402
from dynlab.app import runs as app_runs  # noqa: E402
from dynlab.app import study as app_study  # noqa: E402
from dynlab.app.checks import DEFAULT_OUT  # noqa: E402
from dynlab.errors import (EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, check_environment, debug_enabled,  # noqa: E402
                           exit_status, is_usage_error, unknown_environment)
from dynlab.names import BABI_KINDS, FIGURE_FORMATS, INTERVENTION_NAMES  # noqa: E402
from dynlab.studies import CATALOG, StudyEntry  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="dynlab: train recurrent models, measure length extrapolation, explain it from state dynamics.")
study_app = typer.Typer(no_args_is_help=True, help="Run a registered study (`dynlab study list` shows them).")
lm_app = typer.Typer(no_args_is_help=True, help="Language-model tools (`dynlab lm post-train`).")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (`dynlab bench train`, `dynlab bench lm`).")
data_app = typer.Typer(no_args_is_help=True, help="Token corpora (`dynlab data prepare`).")
for _sub, _name in ((study_app, "study"), (lm_app, "lm"), (bench_app, "bench"), (data_app, "data")):
    app.add_typer(_sub, name=_name)


def _o(kind: type, *flags: str, help: str):  # noqa: A002 - typer's own keyword; an option's annotation
    return Annotated[kind, typer.Option(*flags, help=help)]


ModelsOpt = _o(str, "--models", "-m", help="'all' or a comma list of registered names.")
GroupsOpt = _o(Optional[str], "--groups", "-g", help="Comma list of groups, e.g. C2,C6,S3,A5,C2xS3.")
SeedsOpt = _o(Optional[str], "--seeds", "-s", help="Comma list of seeds (default: the preset's).")
PresetOpt = _o(str, "--preset", "-p", help="A preset of the study: smoke, quick, paper, … (`dynlab study list`).")
OutOpt = _o(str, "--out", "-o", help="Output folder; the study writes OUT/<study>/.")
DeviceOpt = _o(str, "--device", help="auto (CUDA if present), cpu, cuda or cuda:N.")
QuietOpt = _o(bool, "--quiet", "-q", help="No progress bars.")
ExecutorOpt = _o(str, "--executor", help="Where runs train: inprocess (default) or dask.")
SchedulerOpt = _o(Optional[str], "--scheduler", help="Dask scheduler address (tcp://host:8786) of an existing cluster.")
WorkersOpt = _o(Optional[int], "--workers", help="Start a local Dask cluster of N worker processes.")
NoAnalysisOpt = _o(bool, "--no-analysis", help="Skip the per-run analyses.")
MixersOpt = _o(str, "--models", "-m", help="'all' (the preset's mixers) or a comma list of mixers.")
InterventionsOpt = _o(Optional[str], "--interventions", "-i", help="Comma list of interventions.")
SourceOpt = _o(Optional[str], "--source", help="Text: 'shakespeare' (the plays, shipped with dynlab; default), a path to a UTF-8 text file, or a token folder (dynlab data prepare).")
TokenizerOpt = _o(Optional[str], "--tokenizer", help="'byte' (UTF-8 bytes) or a Hugging Face tokenizer.json / a folder holding one (default: the checkpoint's own).")
LengthsOpt = _o(Optional[str], "--lengths", help="Task studies: comma list of test lengths (default: the preset's).")
DepthsOpt = _o(Optional[str], "--depths", help="passkey: comma list of needle depths in [0, 1].")
CheckpointOpt = _o(Optional[str], "--checkpoint", help="length-generalization --preset pretrained: a Hugging Face Mamba/Mamba2 folder or a dynlab LM run folder.")
StudyTokenizerOpt = _o(Optional[str], "--tokenizer", help="'byte' or a Hugging Face tokenizer.json / a folder holding one, for a text --source (a token folder brings its own).")
KindsOpt = _o(Optional[str], "--kinds", help=f"babilong: comma list of {', '.join(BABI_KINDS)}.")


def _add_study_command(entry: StudyEntry) -> None:
    """Study commands of the tracking studies: cells, groups, seeds."""

    def command(models: ModelsOpt = "all", groups: GroupsOpt = None, seeds: SeedsOpt = None, preset: PresetOpt = "quick",
                out: OutOpt = DEFAULT_OUT, device: DeviceOpt = "auto", no_analysis: NoAnalysisOpt = False,
                quiet: QuietOpt = False, executor: ExecutorOpt = "inprocess", scheduler: SchedulerOpt = None,
                workers: WorkersOpt = None) -> None:
        path = app_study.run_tracking_study(entry.name, models, groups, seeds, preset, out, device, not no_analysis,
                                            quiet, executor, scheduler, workers, echo=typer.echo)
        typer.echo(f"dataset: {path}")

    # the study's own presets (a real annotation object: string annotations cannot see locals)
    command.__annotations__["preset"] = _o(str, "--preset", "-p", help=app_study.preset_help(entry.presets))
    study_app.command(name=entry.name, help=entry.description)(command)


def _add_lm_study_command(entry: StudyEntry) -> None:
    """Study commands of the language-model studies: mixers instead of models, no groups, a text source."""

    def command(models: MixersOpt = "all", interventions: InterventionsOpt = None, source: SourceOpt = None,
                lengths: LengthsOpt = None, depths: DepthsOpt = None, kinds: KindsOpt = None, seeds: SeedsOpt = None,
                preset: PresetOpt = "quick", out: OutOpt = DEFAULT_OUT, device: DeviceOpt = "auto",
                quiet: QuietOpt = False, executor: ExecutorOpt = "inprocess", scheduler: SchedulerOpt = None,
                workers: WorkersOpt = None, steps=None, d_model=None, n_layers=None, batch_size=None, lr=None,
                seq_len=None, precision=None, config=None, checkpoint: CheckpointOpt = None,
                tokenizer: StudyTokenizerOpt = None) -> None:  # knobs: LM_KNOB_OPTIONS
        knobs = dict(zip(lm_config.LM_KNOBS, (steps, d_model, n_layers, batch_size, lr, seq_len, precision)))
        path = app_study.run_lm_study(entry.name, models, interventions, source, lengths, depths, kinds, seeds, preset,
                                      out, device, quiet, executor, scheduler, workers, knobs, config, echo=typer.echo,
                                      checkpoint=checkpoint, tokenizer=tokenizer)
        typer.echo(f"dataset: {path}")

    # per-study help texts: real annotation objects (this module's string annotations cannot see locals)
    command.__annotations__.update(
        models=_o(str, "--models", "-m", help=f"'all' (the preset's mixers) or a comma list of: {', '.join(entry.models)}."),
        interventions=_o(Optional[str], "--interventions", "-i",
                         help=f"Comma list of: {', '.join(entry.interventions)} (default: the study's)."),
        preset=_o(str, "--preset", "-p", help=f"One of: {', '.join(entry.presets)}."),
        **{name: _o(Optional[kind], flag, help=text) for name, (flag, kind, text) in lm_config.LM_KNOB_OPTIONS.items()},
    )
    study_app.command(name=entry.name, help=entry.description)(command)


@lm_app.command("post-train")
def lm_post_train(
    checkpoint: _o(Path, "--checkpoint", "-c", help="A dynlab LM run folder (runs/<id>) or a Hugging Face Mamba/Mamba2 folder."),
    intervention: _o(str, "--intervention", "-i", help=f"{', '.join(INTERVENTION_NAMES[:-1])} or {INTERVENTION_NAMES[-1]}.") = "state-passing",
    steps: _o(int, "--steps", help="Post-training steps (0: evaluate the checkpoint as it is).") = 100,
    task: _o(Optional[str], "--task", help="Post-train and score on a task instead of text: copying, passkey or babi.") = None,
    source: _o(str, "--source", help="Text: 'shakespeare', a path to a UTF-8 text file, or a token folder (dynlab data prepare).") = "shakespeare",
    tokenizer: TokenizerOpt = None,
    seq_len: _o(Optional[int], "--seq-len", help="Post-training length (default: the run's own, 64 for HF models).") = None,
    batch_size: _o(int, "--batch-size", help="Sequences a micro-batch (per process under torchrun).") = 16,
    batch_tokens: _o(Optional[int], "--batch-tokens", help="Tokens a step over all processes: gradient accumulation to it.") = None,
    lr: _o(float, "--lr", help="Peak learning rate.") = 3e-4,
    length_multiple: _o(int, "--eval-multiple", help="Evaluate at this many times --seq-len.") = 16,
    samples: _o(int, "--samples", help="Validation windows for PPL(t).") = 64,
    precision: _o(str, "--precision", help="fp32 or bf16 (autocast; float32 weights, optimiser, loss and dynlab's scans).") = "fp32",
    seed: _o(int, "--seed", help="Seed of batches and intervention noise.") = 0,
    out: OutOpt = DEFAULT_OUT,
    device: DeviceOpt = "auto",
) -> None:
    """Post-train a checkpoint with an initial-state intervention, then evaluate PPL(t), EffRem, state statistics (and the task)."""
    run = posttrain.post_train(checkpoint, intervention, steps, task, source, seq_len, batch_size, lr, length_multiple,
                               samples, seed, out, device, tokenizer, precision, batch_tokens)
    typer.echo(f"run: {run}")
    failed = posttrain.failure_line(run)  # a run that diverged is said, not only stored
    if failed:
        typer.echo(failed, err=True)


@data_app.command("prepare")
def data_prepare(
    sources: Annotated[list[str], typer.Argument(help="Text files, .jsonl / .jsonl.gz files (a 'text' field a line), or folders of them.")],
    tokenizer: _o(str, "--tokenizer", "-t", help="'byte' or a Hugging Face tokenizer.json / a folder holding one.") = "byte",
    out: _o(str, "--out", "-o", help="The token folder to write (train.bin, val.bin, tokens.json).") = "tokens",
    val_fraction: _o(float, "--val-fraction", help="Fraction of the ids, from the end, that validate.") = 0.01,
    quiet: QuietOpt = False,
) -> None:
    """Tokenize text into a token folder that every LM command takes as --source (memory-mapped, any size)."""
    app_data.prepare(sources, tokenizer, out, val_fraction, quiet, echo=typer.echo)


@study_app.command("list")
def study_list() -> None:
    """List the registered studies and their presets."""
    typer.echo("\n".join(app_study.study_table()))  # a header and a line per study


@app.command()
def models() -> None:
    """List registered architectures with declared and measured family."""
    typer.echo("\n".join(app_models.model_table()))  # a header and a line per cell


@app.command()
def analyze(study_dir: Annotated[str, typer.Argument(help="A study folder written by `dynlab study`.")],
            device: DeviceOpt = "auto", quiet: QuietOpt = False) -> None:
    """Recompute the analyses of an existing study without retraining."""
    path, correlations = app_analyze.analyze(study_dir, device, quiet)
    if correlations:  # the T_cross–mp table, when the study has one
        typer.echo(correlations)
    typer.echo(f"dataset: {path}")


@app.command()
def figures(study_dir: Annotated[str, typer.Argument(help="A study folder written by `dynlab study` (or its dataset.nc).")],
            out: _o(str, "--out", "-o", help="Folder for the figure files.") = "figures",
            panels: _o(Optional[str], "--panels", help="Comma list of panels to draw (default: all, and the composites).") = None,
            formats: _o(str, "--format", help=f"Comma list of file formats: {', '.join(FIGURE_FORMATS)}.") = "png,pdf",
            width: _o(str, "--width", help="A panel's width: column (3.4 in) or page (7.2 in).") = "column") -> None:
    """Draw every panel of a study and its composite figures, one per claim (a panel with nothing to draw: empty, saying why)."""
    for line in app_figures.figure_lines(app_figures.figures(study_dir, out, panels, formats, width)):
        typer.echo(line)  # the files, then each panel drawn empty (written, saying why) or skipped (not written)


@app.command()
def report(datasets: Annotated[list[str], typer.Argument(help="Study folders or dataset.nc files (copying, passkey, babilong, length-generalization), or benchmark .json files.")]) -> None:
    """Print a study's paper tables as Markdown, read from its dataset (e.g. `dynlab report runs/passkey > results.md`)."""
    for path, text in app_report.report(datasets):  # every dataset is read before anything is printed
        typer.echo(f"## {path}\n\n{text}")


@app.command()
def runs(study_dir: Annotated[str, typer.Argument(help="A study folder (OUT/<study>) written by `dynlab study`.")],
         full: _o(bool, "--full", help="Whole run ids (default: the shortest prefix that tells them apart).") = False,
         as_json: _o(bool, "--json", help="A JSON list of the runs (whole ids, each status's reason) instead.") = False,
         tensorboard: _o(Optional[str], "--tensorboard", help="Also write the runs' stored curves as a TensorBoard log in this folder.") = None) -> None:
    """List a study's runs, each named by what it is (model, group or intervention, seed, the swept settings) and its status."""
    typer.echo(app_runs.runs_text(study_dir, full, as_json, tensorboard))


@lm_app.command("export")
def lm_export(run: Annotated[Path, typer.Argument(help="A dynlab LM run folder (runs/<id>) with a Mamba-2 or Mamba-1 model.")],
              out: Annotated[str, typer.Argument(help="Folder for the Hugging Face model (config.json + model.safetensors).")],
              dtype: _o(Optional[str], "--dtype", help="float32, float64 or bfloat16 (default: the run's).") = None,
              license: _o(str, "--license", help="The model card's license, a Hub identifier (mit, apache-2.0, ...).") = "unknown") -> None:  # noqa: A002
    """Export a dynlab LM run as a Hugging Face Mamba2ForCausalLM / MambaForCausalLM folder (from_pretrained loads it)."""
    typer.echo(str(app_export.export(run, out, dtype, license)))


def bench_train_cmd(models="tanh-rnn,mamba", hidden=128, batch=256, length=60, ensembles="16,64", steps=4, repeats=2,
                    quick=False, device="auto", compile=False, json_out=None) -> None:  # noqa: A002
    """Training throughput: user baseline vs dynlab (one model, ensembles) vs the floor (GEMM or bandwidth)."""
    app_bench.run_bench_train(models, hidden, batch, length, ensembles, steps, repeats, quick, device, compile, json_out,
                              typer.echo)


def bench_lm_cmd(widths="16,64,128,256", ensembles="8,16,32", batch=16, length=32, steps=8, memory=True,
                 mixer="mamba2", json_out=None) -> None:
    """LM training throughput: the one-model loop vs stacks of models vs the no-op-mixer and FLOP floors."""
    app_bench.run_bench_lm(widths, ensembles, batch, length, steps, memory, json_out, typer.echo, mixer)


for _name, _fn, _table in (("train", bench_train_cmd, app_bench.BENCH_TRAIN_OPTIONS),
                           ("lm", bench_lm_cmd, app_bench.BENCH_LM_OPTIONS)):
    _fn.__annotations__.update({k: _o(kind, *flags, help=text) for k, (flags, kind, text) in _table.items()})
    bench_app.command(_name)(_fn)


for _entry in CATALOG.values():  # a command per study of the catalog (no study module is imported)
    (_add_lm_study_command if _entry.command == "lm" else _add_study_command)(_entry)


def main(argv: list[str] | None = None) -> int:
    """Run the command; its exit code (:func:`dynlab.errors.exit_status`: bad input 2, Ctrl-C 130, else 1;
    ``DYNLAB_DEBUG=1``: a failure's traceback). A group called without a command prints its help (0)."""
    args = list(sys.argv[1:] if argv is None else argv)
    checks.NOTES.clear()
    code, handed = EXIT_OK, False
    try:
        handed = _command_starts()  # from here on Ctrl-C is a KeyboardInterrupt, until the finally below
        console.tolerant_output()
        check_environment()  # every DYNLAB_* switch, before any work
        unknown = unknown_environment()  # a DYNLAB_* name dynlab does not know: said, then ignored
        if unknown:
            typer.echo(unknown, err=True)
        command = typer.main.get_command(app)
        with command.make_context("dynlab", args) as ctx:
            command.invoke(ctx)
        _raise_pending()  # a Ctrl-C that a finalizer swallowed meanwhile (dynlab._start)
    except (Exception, KeyboardInterrupt) as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help of a group called without a command
            text = exc.format_message() if hasattr(exc, "format_message") else ""
            if text.strip():  # typer's rich help is printed when the error is made
                typer.echo(text)
            return EXIT_OK
        code, line = exit_status(exc)
        line = console.option_of_other_studies(exc, args, lambda: typer.main.get_command(app)) or line
        if isinstance(exc, BrokenPipeError):  # nothing more reaches the reader, not even at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if code == EXIT_FAILURE and line is not None and debug_enabled() and not is_usage_error(exc):
            raise  # DYNLAB_DEBUG=1: the traceback of a failure (bad input stays one line, exit 2)
        if line is not None:
            typer.echo(line, err=True)
    finally:
        if handed:  # Ctrl-C is the guard's again (dynlab._start.command_ends)
            _command_ends(code)
    return code


def entry() -> None:
    """The ``dynlab`` executable: :func:`main`, then its exit code (after Ctrl-C, SIGINT is ignored while it exits);
    a Ctrl-C as :func:`main` returns (a ``KeyboardInterrupt`` past its own handling) is exit code 130 too."""
    _guard_start()
    try:
        code = main()
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
        os.write(2, b"interrupted\n")
    _command_ends(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
