"""``dynlab runs STUDY --tensorboard DIR``: every run's stored curves (a tracker's test
accuracy by length; an LM's training loss and PPL by position) read back from the event files by TensorBoard's own reader equal the
run's result.json; one TensorBoard run per dynlab run, named by its arm; a folder of other
files, or a machine without the tensorboard package, is one ``error:`` line (exit code 2)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from dynlab.cli import main

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

STUDY = ["--models", "tanh-rnn,mamba", "--groups", "C2", "--seeds", "0,1", "--preset", "smoke", "--no-analysis"]


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out")
    with contextlib.redirect_stderr(io.StringIO()):
        assert main(["study", "group-tracking", *STUDY, "--out", str(out), "--device", "cpu"]) == 0
    return out / "group-tracking"


def _read(folder: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def lm_study(tmp_path_factory) -> Path:
    from helpers.lm_runs import smoke_lm_run

    return smoke_lm_run(tmp_path_factory.mktemp("lm"), steps=8).parents[1]


def test_an_lm_runs_loss_and_ppl_curves_read_back_equal_its_result(lm_study, tmp_path, capsys):
    log = tmp_path / "tb"
    assert main(["runs", str(lm_study), "--tensorboard", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)[0]["status"] and "wrote the TensorBoard log of 1 of 1 runs" in captured.err
    (run,) = (lm_study / "runs").iterdir()
    res = json.loads((run / "result.json").read_text())
    (folder,) = (p for p in log.iterdir() if p.is_dir())
    assert folder.name.startswith("arch=mamba2,intervention=zero,seed=") and f"id={run.name[:10]}" in folder.name
    got = _read(folder)
    assert set(got) == {"train/loss", "eval/ppl"}
    assert [s for s, _ in got["train/loss"]] == res["loss_curve_step"] and len(res["loss_curve"]) >= 2
    assert [v for _, v in got["train/loss"]] == pytest.approx(res["loss_curve"], rel=1e-6)
    assert [s for s, _ in got["eval/ppl"]] == res["ppl_binned_t"]
    assert [v for _, v in got["eval/ppl"]] == pytest.approx(res["ppl_binned"], rel=1e-6)


def test_each_runs_curves_read_back_equal_its_result(study, tmp_path, capsys):
    log = tmp_path / "tb"
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 0
    out = capsys.readouterr().out
    results = {p.name: json.loads((p / "result.json").read_text()) for p in (study / "runs").iterdir()}
    assert f"wrote the TensorBoard log of {len(results)} of {len(results)} runs to {log}" in out
    folders = sorted(p for p in log.iterdir() if p.is_dir())
    assert len(folders) == len(results) == 4
    for folder in folders:
        rid = next(r for r in results if f"id={r[:10]}" in folder.name)
        spec = json.loads((study / "runs" / rid / "spec.json").read_text())["fields"]
        assert f"arch={spec['model']['arch'] if 'model' in spec else spec['arch']}" in folder.name
        assert f"seed={spec['seed']}" in folder.name
        res, got = results[rid], _read(folder)
        assert set(got) == {"eval/accuracy"}  # a tracker stores no loss curve
        assert [s for s, _ in got["eval/accuracy"]] == res["lengths"]
        assert [v for _, v in got["eval/accuracy"]] == pytest.approx(res["accuracy"], rel=1e-6)


def test_writing_again_replaces_each_runs_events(study, tmp_path, capsys):
    log = tmp_path / "tb"
    for _ in range(2):
        assert main(["runs", str(study), "--tensorboard", str(log)]) == 0
    capsys.readouterr()
    for folder in (p for p in log.iterdir() if p.is_dir()):
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        points = _read(folder)["eval/accuracy"]
        assert len(points) == len({s for s, _ in points})  # each step once: the old events are gone


def test_a_folder_of_other_files_is_refused_untouched(study, tmp_path, capsys):
    log = tmp_path / "notes"
    log.mkdir()
    (log / "paper.tex").write_text("x")
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--tensorboard" in err[0] and "paper.tex" in err[0] and "allowed:" in err[0]
    assert sorted(p.name for p in log.iterdir()) == ["paper.tex"]


def test_without_the_tensorboard_package_the_option_is_refused(study, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as when it is not installed
    log = tmp_path / "tb"
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 2
    err = capsys.readouterr().err
    assert "tensorboard package" in err and "dynlab[tensorboard]" in err
    assert not log.exists()
