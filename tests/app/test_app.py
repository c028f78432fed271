"""The application layer (dynlab.app) called from Python does what the command does: the same
refusal in the same words (the command line prints it as ``error: …`` and exits 2), the
same options and specs for a study, the same tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynlab.app import analyze, bench, export, figures, models, posttrain, report, study
from dynlab.cli import main
from dynlab.errors import DynlabInputError

#: (command line, the same call from Python); ``{tmp}``: the test's folder.  Each is refused.
CASES = [
    (["study", "group-tracking", "--groups", "C2,,S3", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("group-tracking", groups="C2,,S3", out=f"{t}/out")),
    (["study", "group-tracking", "--preset", "nope", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("group-tracking", preset="nope", out=f"{t}/out")),
    (["study", "group-tracking", "--models", "all,tanh-rnn", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("group-tracking", models="all,tanh-rnn", out=f"{t}/out")),
    (["study", "group-tracking", "--groups", "S7", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("group-tracking", groups="S7", out=f"{t}/out")),
    (["study", "nonlinearity", "--device", "tpu", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("nonlinearity", device="tpu", out=f"{t}/out")),
    (["study", "group-tracking", "--workers", "2", "--out", "{tmp}/out"],
     lambda t: study.run_tracking_study("group-tracking", workers=2, out=f"{t}/out")),
    (["study", "group-tracking", "--out", " "], lambda t: study.run_tracking_study("group-tracking", out=" ")),
    (["study", "copying", "--depths", "0.5", "--out", "{tmp}/out"],
     lambda t: study.run_lm_study("copying", depths="0.5", out=f"{t}/out")),
    (["study", "babilong", "--kinds", "qa4", "--out", "{tmp}/out"],
     lambda t: study.run_lm_study("babilong", kinds="qa4", out=f"{t}/out")),
    (["study", "length-generalization", "--steps", "0", "--out", "{tmp}/out"],
     lambda t: study.run_lm_study("length-generalization", knobs={"--steps": 0}, out=f"{t}/out")),
    (["study", "copying", "--seq-len", "32", "--out", "{tmp}/out"],
     lambda t: study.run_lm_study("copying", knobs={"--seq-len": 32}, out=f"{t}/out")),
    (["study", "passkey", "--config", "{tmp}/missing.toml", "--out", "{tmp}/out"],
     lambda t: study.run_lm_study("passkey", config=Path(f"{t}/missing.toml"), out=f"{t}/out")),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--intervention", "nope", "--out", "{tmp}/out"],
     lambda t: posttrain.post_train(f"{t}/ckpt", intervention="nope", out=f"{t}/out")),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--task", "babi", "--intervention", "tbtt",
      "--out", "{tmp}/out"],
     lambda t: posttrain.post_train(f"{t}/ckpt", task="babi", intervention="tbtt", out=f"{t}/out")),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--out", "{tmp}/out"],
     lambda t: posttrain.post_train(f"{t}/ckpt", out=f"{t}/out")),
    (["lm", "export", "{tmp}/run", "{tmp}/hf", "--dtype", "int8"],
     lambda t: export.export(f"{t}/run", f"{t}/hf", dtype="int8")),
    (["lm", "export", "{tmp}/run", "{tmp}/hf"], lambda t: export.export(f"{t}/run", f"{t}/hf")),
    (["bench", "train", "--hidden", "0"], lambda t: bench.run_bench_train(hidden=0)),
    (["bench", "train", "--ensembles", "16,x"], lambda t: bench.run_bench_train(ensembles="16,x")),
    (["bench", "lm", "--widths", "12"], lambda t: bench.run_bench_lm(widths="12")),
    (["bench", "lm", "--json", ""], lambda t: bench.run_bench_lm(json_out="")),
    (["bench", "lm", "--mixer", "rwkv"], lambda t: bench.run_bench_lm(mixer="rwkv")),
    (["analyze", "{tmp}/nothing"], lambda t: analyze.analyze(f"{t}/nothing")),
    (["analyze", "{tmp}/nothing", "--device", "gpu"], lambda t: analyze.analyze(f"{t}/nothing", device="gpu")),
    (["figures", "{tmp}/study", "--out", ""], lambda t: figures.figures(f"{t}/study", out="")),
    (["report", ""], lambda t: report.report([""])),
]


@pytest.mark.parametrize("argv, call", CASES, ids=[" ".join(a[:3]) for a, _ in CASES])
def test_the_python_call_refuses_what_the_command_refuses_in_its_words(argv, call, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    line = capsys.readouterr().err
    with pytest.raises(DynlabInputError) as info:
        call(tmp_path)
    assert line == f"error: {info.value}\n" and line.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written by either


def test_an_unknown_study_is_refused_naming_the_studies_of_its_kind():
    with pytest.raises(DynlabInputError, match=r"unknown lm study 'group-tracking'; allowed: length-generalization, "):
        study.run_lm_study("group-tracking")
    with pytest.raises(DynlabInputError, match=r"unknown tracking study 'nope'; allowed: group-tracking, nonlinearity$"):
        study.run_tracking_study("nope")


@pytest.fixture
def made(monkeypatch, tmp_path):
    """The options and specs a study is run with, the run itself replaced (nothing trains but
    the executor is started, as run_study starts it once the specs are checked)."""
    import dynlab.runner.driver

    made: list = []

    def run_study(s, options, **kwargs):
        made.append((options, [x.spec_hash() for x in s.make_specs(options)], kwargs["analyze"], kwargs["out"]))
        with kwargs["executor"]():
            pass
        return tmp_path / "dataset.nc"

    monkeypatch.setattr(dynlab.runner.driver, "run_study", run_study)
    return made


def test_a_tracking_study_from_python_gets_the_options_specs_and_notes_of_the_command(made, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["study", "group-tracking", "--models", "tanh-rnn,tanh-rnn", "--groups", "C2,c2,S3", "--seeds", "1,2",
                 "--preset", "smoke", "-q", "--no-analysis", "--out", out]) == 0
    cli = capsys.readouterr()
    said: list[tuple[str, bool]] = []
    path = study.run_tracking_study("group-tracking", models="tanh-rnn,tanh-rnn", groups="C2,c2,S3", seeds="1,2",
                                    preset="smoke", quiet=True, analyze=False, out=out,
                                    echo=lambda text, err=False: said.append((text, err)))
    assert cli.out == f"dataset: {path}\n"
    assert made[0] == made[1] and len(made[0][1]) == 2 * 2  # groups C2, S3 x seeds 1, 2
    assert made[0][0].extra["groups"] == ("C2", "S3") and made[0][2] is False
    assert [line for line, err in said if err] == cli.err.splitlines() == [
        "note: --models tanh-rnn,tanh-rnn names tanh-rnn 2 times; it runs once",
        "note: --groups C2,c2,S3 names C2 2 times; it runs once"]


def test_an_lm_study_from_python_gets_the_options_and_specs_of_the_command(made, tmp_path, capsys):
    out, config = str(tmp_path / "out"), tmp_path / "c.toml"
    config.write_text("d_model = 16\n[train]\nsteps = 7\n")
    assert main(["study", "passkey", "--models", "gla", "--lengths", "128,256", "--depths", "0,1", "--steps", "5",
                 "--config", str(config), "--preset", "smoke", "--out", out]) == 0
    capsys.readouterr()
    study.run_lm_study("passkey", models="gla", lengths="128,256", depths="0,1", knobs={"--steps": 5}, config=config,
                       preset="smoke", out=out)
    assert made[0] == made[1]
    extra = made[0][0].extra
    assert extra["task"] == {"eval_lengths": [128, 256], "depths": [0.0, 1.0]}
    assert extra["train"] == {"steps": 5} and extra["model"] == {"d_model": 16}  # the option wins over the file


def test_the_tables_are_the_commands(capsys):
    assert main(["study", "list"]) == 0
    assert capsys.readouterr().out.splitlines() == study.study_table()
    lines = study.study_table()
    from dynlab.studies import CATALOG

    assert [line.split()[0] for line in lines] == ["study", *CATALOG]
    assert main(["models"]) == 0
    assert capsys.readouterr().out.splitlines() == models.model_table()


def test_report_from_python_is_the_commands(capsys, repo_root):
    path = repo_root / "benchmarks" / "results" / "bench_train_cpu.json"
    assert main(["report", str(path)]) == 0
    ((where, text),) = report.report([path])
    assert capsys.readouterr().out == f"## {where}\n\n{text}\n" and "| " in text


def _cli_defaults(*path: str) -> dict[str, object]:
    import typer

    from dynlab.cli import app

    command = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {p.name: p.default for p in command.params}


@pytest.mark.parametrize("path, function, skip", [
    (("study", "group-tracking"), study.run_tracking_study, {"analyze": "no_analysis"}),
    (("study", "copying"), study.run_lm_study, {}),
    (("lm", "post-train"), posttrain.post_train, {}),
    (("bench", "train"), bench.run_bench_train, {}),
    (("bench", "lm"), bench.run_bench_lm, {}),
    (("figures",), figures.figures, {}),
    (("analyze",), analyze.analyze, {}),
], ids=lambda x: " ".join(x) if isinstance(x, tuple) else None)
def test_the_python_defaults_are_the_commands(path, function, skip):
    """A keyword left out means what the option left out means."""
    import inspect

    cli = _cli_defaults(*path)
    python = {k: v.default for k, v in inspect.signature(function).parameters.items()
              if v.default is not inspect.Parameter.empty}
    shared = set(cli) & set(python)
    assert shared and shared >= set(python) - {"echo", "knobs"} - set(skip), (cli, python)  # knobs: the --steps, … options
    assert {k: python[k] for k in shared} == {k: cli[k] for k in shared}
    for ours, theirs in skip.items():  # an option said the other way round (--no-analysis)
        assert python[ours] is (not cli[theirs])


def test_the_notes_of_a_refused_call_are_not_said_by_the_next(made, tmp_path):
    said: list[str] = []

    def echo(text, err=False):
        said.append(text)

    with pytest.raises(DynlabInputError, match="unknown device 'tpu'"):
        study.run_tracking_study("group-tracking", models="tanh-rnn,tanh-rnn", device="tpu", out=str(tmp_path / "o"),
                                 echo=echo)
    study.run_tracking_study("group-tracking", models="tanh-rnn", groups="C2", preset="smoke", out=str(tmp_path / "o"),
                             echo=echo)
    assert said == [] and len(made) == 1
