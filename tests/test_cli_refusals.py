"""Refusals in the words of the option the user typed (one line, exit 2, nothing written),
and repeated names in a list collapsed with a one-line note, in the CLI and the Python API."""

from __future__ import annotations

import pytest

from dynlab.cli import main
from dynlab.errors import DynlabInputError
from dynlab.study import StudyOptions, canonical_groups, collapse_repeats, select_names

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
     "error: --source '' is neither one of the built-in texts (shakespeare) nor an existing text file; "
     "allowed: shakespeare or a path to a UTF-8 text file"),
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
     "error: --source '' is neither one of the built-in texts (shakespeare) nor an existing text file; "
     "allowed: shakespeare or a path to a UTF-8 text file"),
    (["study", "length-generalization", "--source", " "],
     "error: --source ' ' is neither one of the built-in texts (shakespeare) nor an existing text file; "
     "allowed: shakespeare or a path to a UTF-8 text file"),
    (["study", "group-tracking", "--executor", "ray"], "error: unknown executor 'ray'; allowed: inprocess, dask"),
    (["study", "group-tracking", "--workers", "2"], "error: --scheduler and --workers need --executor dask"),
]


@pytest.mark.parametrize("argv, line", REFUSALS, ids=[" ".join(a[:4]) for a, _ in REFUSALS])
def test_refusal_names_the_option_and_the_allowed_values(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + (["--out", str(tmp_path / "out")] if argv[0] != "bench" else [])
    from dynlab.models import available_cells

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

    from dynlab.cli import _in_option_words

    class EvalSpec(BaseModel):
        chunk_len: int = Field(ge=1)
        bin_width: int = Field(ge=1)
        other: int = Field(ge=1)

    with pytest.raises(DynlabInputError) as info, _in_option_words({"chunk_len": "--seq-len", "bin_width": "--seq-len"}):
        EvalSpec(chunk_len=0, bin_width=0, other=0)
    assert str(info.value) == ("--seq-len 0: Input should be greater than or equal to 1; "
                               "invalid EvalSpec: other: Input should be greater than or equal to 1")


# -- repeats ---------------------------------------------------------------------------

def test_repeated_names_run_once_with_a_one_line_note(tmp_path, capsys, monkeypatch):
    import dynlab.runner

    made = {}

    def run_study(study, options, **kwargs):
        made["options"], made["specs"] = options, study.make_specs(options)
        return tmp_path / "dataset.nc"

    monkeypatch.setattr(dynlab.runner, "run_study", run_study)
    argv = ["study", "group-tracking", "--models", "tanh-rnn,tanh-rnn", "--groups", "C2,C2,c2", "--seeds", "0,0,00",
            "--preset", "smoke", "-q", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["note: --models tanh-rnn,tanh-rnn names tanh-rnn 2 times; it runs once",
                   "note: --groups C2,C2,c2 names C2 3 times; it runs once",
                   "note: --seeds 0,0,00 names 0 3 times; it runs once"]
    options = made["options"]
    assert (options.models, options.groups, options.seeds) == (("tanh-rnn",), ("C2",), (0,))
    assert len(made["specs"]) == 1


def test_repeats_in_two_names_of_one_list_are_one_note(tmp_path, capsys, monkeypatch):
    import dynlab.runner

    monkeypatch.setattr(dynlab.runner, "run_study", lambda study, options, **kw: tmp_path / "dataset.nc")
    argv = ["study", "length-generalization", "--models", "mamba2,gla,mamba2,gla", "--interventions", "zero,zero",
            "-q", "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        "note: --interventions zero,zero names zero 2 times; it runs once",
        "note: --models mamba2,gla,mamba2,gla names mamba2 2 times and gla 2 times; each runs once",
    ]


def test_the_python_api_collapses_repeats_too():
    from dynlab.studies import get_study

    options = StudyOptions(preset="smoke", models=["tanh-rnn", "tanh-rnn"], groups=["C2", "C2", "c2"], seeds=[0, 0])
    assert (options.models, options.groups, options.seeds) == (("tanh-rnn",), ("C2",), (0,))
    assert len(get_study("group-tracking").make_specs(options)) == 1
    assert len(get_study("nonlinearity").make_specs(StudyOptions(preset="smoke", groups=("s3", "S3"), seeds=(1, 1)))) == 6
    assert StudyOptions(groups=("C2xS3", "c2xs3", "Q8")).groups == ("C2xS3", "Q8")  # Q8 is left for the study to refuse


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
