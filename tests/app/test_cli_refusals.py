"""Refusals in the words of the option the user typed (one line, exit 2, nothing written),
and repeated names in a list collapsed with a one-line note, in the CLI and the Python API."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynlab.cli import main
from dynlab.errors import DynlabInputError
from dynlab.runner.protocol import StudyOptions, collapse_repeats, select_names
from dynlab.tracking.selection import canonical_groups, canonical_options

#: The registered cells, as the refusals list them (those registered at run time included).
CELLS = "{cells}"

REFUSALS = [
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--seq-len", "0"],
     "error: --seq-len 0 is out of range; allowed: 2 to 100000 tokens"),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--samples", "0"],
     "error: --samples 0 is out of range; allowed: 1 to 1048576 windows"),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--eval-multiple", "1"],
     "error: --eval-multiple 1 is out of range; allowed: 2 or more (times --seq-len)"),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--source", ""],
     "error: --source '' is neither one of the built-in texts (shakespeare), an existing text file nor a token "
     "folder; allowed: shakespeare, a path to a UTF-8 text file, or a folder written by dynlab data prepare"),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--intervention", "nope"],
     "error: unknown --intervention 'nope'; allowed: zero, random-noise, fitted-noise, state-passing, tbtt"),
    (["bench", "train", "--length", "1000000000"], "error: --length 1000000000 is out of range; allowed: 1 to 100000 tokens"),
    (["bench", "train", "--hidden", "0"], "error: --hidden 0 is out of range; allowed: 1 to 8192"),
    (["bench", "train", "--models", "all"], f"error: unknown model 'all'; allowed: a comma list of {CELLS}"),
    (["bench", "train", "--ensembles", "16,x"],
     "error: --ensembles must be a comma list of whole numbers from 1 to 1024, got '16,x'"),
    (["bench", "train", "--ensembles", "16,0"],
     "error: --ensembles '16,0': a size is out of range; allowed: a comma list of whole numbers from 1 to 1024"),
    (["study", "babilong", "--kinds", "qa4"],
     "error: --kinds 'qa4': unknown kind 'qa4'; allowed: a comma list of qa1, qa2, qa3, qa6, qa7"),
    (["study", "babilong", "--kinds", ","],
     "error: --kinds got an empty list (','); allowed: a comma list of one or more values"),
    (["study", "passkey", "--lengths", "0"],
     "error: --lengths '0': length 0 is out of range; allowed: a comma list of whole numbers from 1 to 100000"),
    (["study", "passkey", "--lengths", "1.5"],
     "error: --lengths must be a comma list of whole numbers from 1 to 100000, got '1.5'"),
    (["study", "passkey", "--depths", "0.5,x"], "error: --depths must be a comma list of fractions from 0 to 1, got '0.5,x'"),
    (["study", "group-tracking", "--models", "all,tanh-rnn"],
     f"error: 'all' cannot be combined with other model names (tanh-rnn); allowed: all, or a comma list of: {CELLS}"),
    (["study", "length-generalization", "--models", "mamba2,all"],
     "error: 'all' cannot be combined with other mixer names (mamba2); allowed: all, or a comma list of: "
     "mamba2, mamba1, gla"),
    (["study", "length-generalization", "--source", ""],
     "error: --source '' is neither one of the built-in texts (shakespeare), an existing text file nor a token "
     "folder; allowed: shakespeare, a path to a UTF-8 text file, or a folder written by dynlab data prepare"),
    (["study", "length-generalization", "--source", " "],
     "error: --source ' ' is neither one of the built-in texts (shakespeare), an existing text file nor a token "
     "folder; allowed: shakespeare, a path to a UTF-8 text file, or a folder written by dynlab data prepare"),
    (["study", "group-tracking", "--executor", "ray"], "error: unknown executor 'ray'; allowed: inprocess, dask"),
    (["study", "group-tracking", "--workers", "2"], "error: --scheduler and --workers need --executor dask"),
]


@pytest.mark.parametrize("argv, line", REFUSALS, ids=[" ".join(a[:4]) for a, _ in REFUSALS])
def test_refusal_names_the_option_and_the_allowed_values(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + (["--out", str(tmp_path / "out")] if argv[0] != "bench" else [])
    from dynlab.tracking.models import available_cells

    assert main(argv) == 2
    assert capsys.readouterr().err == line.replace("{cells}", ", ".join(available_cells())) + "\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "-q", "--device", "cpu"],
    ["study", "copying", "--preset", "quick", "-q", "--device", "cpu"],
    ["lm", "post-train", "--checkpoint", "{tmp}/ckpt"],
    ["figures", "{tmp}/no-study"],
], ids=["group-tracking", "copying", "post-train", "figures"])
@pytest.mark.parametrize("out", ["", "  "])
def test_an_empty_out_is_refused_not_the_current_folder(argv, out, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main([*argv, "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out got an empty path ({out!r}); allowed: a folder (made when missing), e.g. --out ")
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []


def test_an_empty_json_path_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "train", "--json", ""]) == 2
    assert capsys.readouterr().err == "error: --json got an empty path (''); allowed: a file path, e.g. --json bench.json\n"


def test_a_spec_error_is_said_in_option_words(tmp_path):
    from pydantic import BaseModel, Field

    from dynlab.errors import in_option_words as _in_option_words

    class EvalSpec(BaseModel):
        chunk_len: int = Field(ge=1)
        bin_width: int = Field(ge=1)
        other: int = Field(ge=1)

    with pytest.raises(DynlabInputError) as info, _in_option_words({"chunk_len": "--seq-len", "bin_width": "--seq-len"}):
        EvalSpec(chunk_len=0, bin_width=0, other=0)
    assert str(info.value) == ("--seq-len 0: Input should be greater than or equal to 1; "
                               "invalid EvalSpec: other: Input should be greater than or equal to 1")


# -- repeats ---------------------------------------------------------------------------

def _checked_run(made: dict, path: Path):
    """A stand-in for run_study that trains nothing: it makes the specs (kept in ``made``) and
    starts the executor, as run_study does once the specs are checked (the notes are said then)."""
    def run_study(study, options, **kwargs):
        made["options"], made["specs"] = options, study.make_specs(options)
        with kwargs["executor"]():
            return path

    return run_study


def test_repeated_names_run_once_with_a_one_line_note(tmp_path, capsys, monkeypatch):
    import dynlab.runner.driver

    made = {}

    monkeypatch.setattr(dynlab.runner.driver, "run_study", _checked_run(made, tmp_path / "dataset.nc"))
    argv = ["study", "group-tracking", "--models", "tanh-rnn,tanh-rnn", "--groups", "C2,C2,c2", "--seeds", "0,0,00",
            "--preset", "smoke", "-q", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: --models tanh-rnn,tanh-rnn names tanh-rnn 2 times; it runs once",
                   "note: --groups C2,C2,c2 names C2 3 times; it runs once",
                   "note: --seeds 0,0,00 names 0 3 times; it runs once"]
    options = made["options"]
    assert (options.models, options.extra["groups"], options.seeds) == (("tanh-rnn",), ("C2",), (0,))
    assert len(made["specs"]) == 1


def test_repeats_in_two_names_of_one_list_are_one_note(tmp_path, capsys, monkeypatch):
    import dynlab.runner.driver

    monkeypatch.setattr(dynlab.runner.driver, "run_study", _checked_run({}, tmp_path / "dataset.nc"))
    argv = ["study", "length-generalization", "--models", "mamba2,gla,mamba2,gla", "--interventions", "zero,zero",
            "-q", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        "note: --interventions zero,zero names zero 2 times; it runs once",
        "note: --models mamba2,gla,mamba2,gla names mamba2 2 times and gla 2 times; each runs once",
    ]


def test_the_python_api_collapses_repeats_too():
    from dynlab.studies import get_study

    options = StudyOptions(preset="smoke", models=["tanh-rnn", "tanh-rnn"], seeds=[0, 0],
                           extra={"groups": ["C2", "C2", "c2"]})
    assert (options.models, options.seeds) == (("tanh-rnn",), (0,))
    assert get_study("group-tracking").prepared(options).extra["groups"] == ("C2",)  # the study reads c2 as C2
    assert len(get_study("group-tracking").make_specs(options)) == 1
    sixes = StudyOptions(preset="smoke", seeds=(1, 1), extra={"groups": ("s3", "S3")})
    assert len(get_study("nonlinearity").make_specs(sixes)) == 6
    options = StudyOptions(extra={"groups": ("C2xS3", "c2xs3", "Q8", "Q8")})  # the study's own selection
    assert canonical_options(options).extra["groups"] == ("C2xS3", "Q8")  # Q8 is left for the study to refuse
    assert get_study("group-tracking").prepared(options).extra["groups"] == ("C2xS3", "Q8")
    for odd in ("C2", 3, None):  # not a list of names: left as given, for the options to refuse (None: the preset's)
        assert canonical_options(StudyOptions(extra={"groups": odd})).extra["groups"] == odd


def test_select_names_and_collapse_repeats():
    allowed = ("a", "b", "c")
    assert select_names(None, ("a",), allowed, "mixer") == ("a",)
    assert select_names(("all", "all"), ("a",), allowed, "mixer") == ("a",)
    assert select_names(["b", "a", "b"], ("a",), allowed, "mixer") == ("b", "a")
    with pytest.raises(DynlabInputError, match=r"^'all' cannot be combined with other mixer names \(b\); "
                                               r"allowed: all, or a comma list of: a, b, c$"):
        select_names(("all", "b"), ("a",), allowed, "mixer")
    with pytest.raises(DynlabInputError, match=r"^no mixer selected; allowed: all, or a comma list of: a, b, c$"):
        select_names((), ("a",), allowed, "mixer")
    with pytest.raises(DynlabInputError, match=r"^unknown mixer 'd'; allowed: all, a, b, c$"):
        select_names(("d",), ("a",), allowed, "mixer")
    assert collapse_repeats(("x", "y", "x", "x")) == (("x", "y"), {"x": 3})
    assert collapse_repeats(("C2", "c2"), key=str.upper) == (("C2",), {"C2": 2})
    assert canonical_groups(("c6", "C6", "s3")) == ("C6", "S3")



def test_a_refused_command_prints_its_error_line_only(tmp_path, capsys):
    argv = ["study", "group-tracking", "--models", "tanh-rnn,tanh-rnn", "--seeds", "0,0", "--device", "tpu",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err == "error: unknown device 'tpu'; allowed: auto, cpu, cuda (or cuda:N)\n"


def test_a_group_too_large_for_the_analyses_is_refused_before_an_executor_starts(tmp_path, capsys, monkeypatch):
    import dynlab.executors

    def no_executor(*args, **kwargs):
        raise AssertionError("an executor was started")

    monkeypatch.setattr(dynlab.executors, "make_executor", no_executor)
    argv = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "S6", "--preset", "smoke", "-q",
            "--executor", "dask", "--workers", "1", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: group S6 (order 720) is too large for the per-run analyses") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


# -- every refusal names its option and the allowed values ---------------------------------------------------------

def _inputs(tmp_path):
    """Bad files for the refusals below: texts that are no UTF-8, empty or too short, a
    file where a folder is needed, a Hugging Face folder without weights."""
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00\x81 binary" * 40)
    (tmp_path / "latin1.txt").write_bytes("café olé ".encode("latin-1") * 100)
    (tmp_path / "utf16.txt").write_text("to be or not to be " * 100, encoding="utf-16")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("hi\n")
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "mamba2", "vocab_size": 256}')


NAMED = [
    (["study", "passkey", "--source", "{tmp}/binary.txt"], "--source"),
    (["study", "passkey", "--source", "{tmp}/latin1.txt"], "--source"),
    (["study", "babilong", "--source", "{tmp}/utf16.txt"], "--source"),
    (["study", "length-generalization", "--source", "{tmp}/empty.txt"], "--source"),
    (["study", "passkey", "--source", "{tmp}/short.txt"], "--source"),
    (["study", "copying", "--lengths", "100000"], "--lengths"),
    (["study", "passkey", "--lengths", "100000"], "--lengths"),
    (["study", "passkey", "--lengths", "1"], "--lengths"),
    (["study", "babilong", "--lengths", "5"], "--lengths"),
    (["bench", "train", "--json", "{tmp}/a_file/b.json"], "--json"),
    (["lm", "post-train", "--checkpoint", "{tmp}/hf"], "checkpoint"),
]


@pytest.mark.parametrize("argv, option", NAMED, ids=[" ".join(a[:4]).replace("{tmp}/", "") for a, _ in NAMED])
def test_every_refusal_names_its_option_and_the_allowed_values(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _inputs(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + (["--out", str(tmp_path / "out")] if argv[0] != "bench" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.match(rf"error: {re.escape(option)}[ :]", err) and "; allowed: " in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


# -- bad input is exit 2 wherever it is given: a file, a number, the environment ---------------------------------------

@pytest.mark.parametrize("case", ["manifest-latin1", "seed-2**64", "seed-huge", "kernel-backend", "c-kernels"])
def test_bad_input_in_files_numbers_and_the_environment_is_exit_2(case, tmp_path, capsys, monkeypatch):
    study = tmp_path / "study"
    study.mkdir()
    (study / "manifest.json").write_bytes('{"study": "group-tracking", "preset": "smoke", "run_ids": [], "é": 1}'
                                          .encode("latin-1"))
    argv, line = {
        "manifest-latin1": (["analyze", str(study)], f"error: unreadable study manifest {study / 'manifest.json'} "
                                                     "(not UTF-8 text); allowed: "),
        "seed-2**64": (["lm", "post-train", "--checkpoint", str(tmp_path), "--seed", str(2**64)],
                       f"error: --seed {2**64} is out of range; allowed: 0 to {2**63 - 1}"),
        "seed-huge": (["lm", "post-train", "--checkpoint", str(tmp_path), "--seed", "9" * 23],
                      f"error: --seed {'9' * 23} is out of range; allowed: 0 to {2**63 - 1}"),
        "kernel-backend": (["study", "list"], "error: environment variable DYNLAB_KERNEL_BACKEND='bogus' is not a setting "
                                              "dynlab knows; allowed: auto, torch, triton, mamba_ssm, fla, causal_conv1d (or unset)"),
        "c-kernels": (["study", "list"], "error: environment variable DYNLAB_C_KERNELS='off' is not a setting dynlab "
                                         "knows; allowed: 1, 0 (or unset)"),
    }[case]
    monkeypatch.setenv("DYNLAB_KERNEL_BACKEND", "bogus" if case == "kernel-backend" else "auto")
    monkeypatch.setenv("DYNLAB_C_KERNELS", "off" if case == "c-kernels" else "1")
    before = sorted(p.name for p in study.iterdir())
    assert main([*argv, *(["--out", str(tmp_path / "out")] if argv[0] == "lm" else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert sorted(p.name for p in study.iterdir()) == before and not (tmp_path / "out").exists()


def test_the_environment_switches_are_those_dynlab_reads():
    from dynlab.errors import ENV_SWITCHES
    from dynlab.kernels import compiled, dispatch
    from dynlab.runtime import ALLOCATOR_ENV

    assert ENV_SWITCHES[dispatch.ENV_VAR] == ("auto", *dispatch.BACKENDS)
    assert {compiled.C_KERNELS_ENV, ALLOCATOR_ENV, "DYNLAB_DEBUG"} < set(ENV_SWITCHES)


# -- no command writes into a run folder, or into a folder of other files ------------------------------------------

@pytest.mark.parametrize("argv, line", [
    (["lm", "export", "{run}", "{run}"], "error: OUT {run} is a dynlab run folder: writing there would replace its files"),
    (["lm", "export", "{run}", "{notes}"], "error: OUT {notes} holds files this command did not write (notes.txt)"),
    (["lm", "export", "{run}", "{tmp}/readme"], "error: OUT {tmp}/readme holds files this command did not write (README.md)"),
    (["lm", "export", "{run}", "{tmp}/other-model"],
     "error: OUT {tmp}/other-model holds files this command did not write (config.json, model.safetensors)"),
    (["figures", "{tmp}/study", "--out", "{run}"], "error: --out {run} is a dynlab run folder"),
    (["figures", "{tmp}/study", "--out", "{notes}"], "error: --out {notes} holds files this command did not write"),
    (["bench", "train", "--json", "{run}/model.safetensors"], "error: --json {run} is a dynlab run folder"),
    (["bench", "train", "--json", "{notes}/notes.txt"],
     "error: --json {notes}/notes.txt exists and is not a benchmark file dynlab wrote"),
    (["study", "group-tracking", "--preset", "smoke", "--out", "{run}"], "error: --out {run} is a dynlab run folder"),
    (["study", "copying", "--out", "{tmp}/study"], "error: --out {tmp}/study is a dynlab study folder"),
    (["lm", "post-train", "--checkpoint", "{run}", "--out", "{run}"], "error: --out {run} is a dynlab run folder"),
    (["study", "copying", "--preset", "smoke", "--out", "{tmp}/study/runs"],
     "error: --out {tmp}/study/runs is inside the dynlab study folder {tmp}/study"),
    (["figures", "{tmp}/study", "--out", "{tmp}/study/runs/figs"],
     "error: --out {tmp}/study/runs/figs is inside the dynlab study folder {tmp}/study"),
    (["bench", "train", "--json", "{tmp}/study/runs/b.json"], "error: --json {tmp}/study/runs is inside the dynlab study folder"),
    (["lm", "post-train", "--checkpoint", "{run}", "--out", "{tmp}/study/runs"],
     "error: --out {tmp}/study/runs is inside the dynlab study folder {tmp}/study"),
], ids=["export-into-its-run", "export-into-notes", "export-over-a-readme", "export-over-another-model", "figures-into-a-run", "figures-into-notes", "bench-json-in-a-run",
        "bench-json-over-notes", "study-into-a-run", "study-into-a-study", "post-train-into-a-run", "study-below-a-study",
        "figures-below-a-study", "bench-json-below-a-study", "post-train-below-a-study"])
def test_no_command_writes_into_a_run_or_a_folder_of_other_files(argv, line, tmp_path, capsys):
    """A command refuses, before it writes anything, to write into a dynlab run or study
    folder or into a folder holding files it did not write (one line, exit 2): `lm export
    RUN RUN` once replaced the run's weights."""
    from dynlab.lm.hub.export import export_hf

    run, notes, study = tmp_path / "run", tmp_path / "notes", tmp_path / "study"
    for folder in (run, notes, study):
        folder.mkdir()
    (run / "spec.json").write_text('{"fields": {}, "spec": "LMRunSpec"}')
    (run / "checksums.json").write_text('{"files": {}}')
    (run / "model.safetensors").write_bytes(b"weights" * 100)
    (notes / "notes.txt").write_text("mine")
    (tmp_path / "readme").mkdir()  # names an export writes, but not an export's files
    (tmp_path / "readme" / "README.md").write_text("# my notes")
    (tmp_path / "other-model").mkdir()
    (tmp_path / "other-model" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "other-model" / "model.safetensors").write_bytes(b"w")
    (study / "manifest.json").write_text('{"study": "copying", "preset": "quick", "run_ids": []}')
    (study / "runs").mkdir()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    subs = {"{run}": str(run), "{notes}": str(notes), "{tmp}": str(tmp_path)}

    def fill(text: str) -> str:
        for key, value in subs.items():
            text = text.replace(key, value)
        return text

    assert main([fill(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(fill(line)) and "; allowed: " in err and err.count("\n") == 1, err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    with pytest.raises(DynlabInputError, match="is a dynlab run folder"):
        export_hf(run, run)  # the Python API refuses it too


def test_a_stray_file_above_does_not_make_a_dynlab_folder(tmp_path):
    """Only a run's or a study's files together mark a folder above as dynlab's: a project
    folder holding a spec.json or a manifest.json of its own does not refuse the folders below it."""
    from dynlab.outputs import refuse_foreign_folder

    (tmp_path / "spec.json").write_text("{}")
    (tmp_path / "manifest.json").write_text("{}")
    refuse_foreign_folder(tmp_path / "out", "--out")  # no error
    (tmp_path / "runs").mkdir()  # a runs/ folder of the project's own: still not a study
    refuse_foreign_folder(tmp_path / "out", "--out")
    (tmp_path / "manifest.json").write_text('{"study": "copying", "preset": "quick", "run_ids": []}')  # a study's
    with pytest.raises(DynlabInputError, match="is inside the dynlab study folder"):
        refuse_foreign_folder(tmp_path / "out", "--out")


def test_figures_of_two_studies_never_mix_in_one_folder(tmp_path):
    """`dynlab figures` records whose figures a folder holds; another study's are refused
    there (its panels would replace some of the first study's under one NOTES.txt)."""
    from types import SimpleNamespace

    import xarray as xr

    from dynlab.app.figures import draw_study_figures

    studies = {"alpha": SimpleNamespace(panels={}), "beta": SimpleNamespace(panels={})}
    for name in studies:
        xr.Dataset(attrs={"study": name}).to_netcdf(tmp_path / f"{name}.nc")
    out = tmp_path / "figs"
    draw_study_figures(tmp_path / "alpha.nc", out, studies)
    draw_study_figures(tmp_path / "alpha.nc", out, studies)  # the same study again: redrawn
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DynlabInputError, match=f"^--out {out} holds the figures of study 'alpha', not 'beta'; "):
        draw_study_figures(tmp_path / "beta.nc", out, studies)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
