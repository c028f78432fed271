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


def _fake_study(root: Path, results: dict[str, dict], fields: dict | None = None) -> Path:
    """A study folder of runs with the given result.json files (spec fields: a passkey run's)."""
    (root / "runs").mkdir(parents=True)
    (root / ".dynlab-study").write_text(json.dumps({"dynlab": "study folder", "study": "passkey"}) + "\n")
    for i, (rid, result) in enumerate(results.items()):
        (root / "runs" / rid).mkdir()
        spec = {"spec": "TaskSpec", "fields": fields or {"arch": "mamba2", "seed": i}}
        (root / "runs" / rid / "spec.json").write_text(json.dumps(spec))
        (root / "runs" / rid / "result.json").write_text(json.dumps(result))
    return root


def test_a_task_runs_accuracy_per_depth_and_its_arms_and_damaged_curves(tmp_path, capsys):
    """Passkey's accuracy is a row of depths per length: one tag per depth, each arm's under
    post/<arm>/; a damaged curve (a null step, a string value) is left out, not a crash."""
    good = {"status": "ok", "lengths": [128, 256], "depths": [0.0, 0.5], "accuracy": [[1.0, 0.75], [0.5, 0.25]],
            "post": {"fitted-noise": {"status": "ok", "accuracy": [[1.0, 1.0], [0.75, 0.5]]}},
            "loss_curve_step": [1, 2], "loss_curve": [2.0, "x"]}
    bad = {"status": "ok", "lengths": [1, None], "accuracy": [0.5, 0.5]}
    study = _fake_study(tmp_path / "passkey", {"a" * 16: good, "b" * 16: bad})
    log = tmp_path / "tb"
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 0
    assert f"wrote the TensorBoard log of 1 of 2 runs to {log}" in capsys.readouterr().out
    (folder,) = (p for p in log.iterdir() if p.is_dir())
    assert _read(folder) == {"eval/accuracy/depth=0.0": [(128, 1.0), (256, 0.5)],
                             "eval/accuracy/depth=0.5": [(128, 0.75), (256, 0.25)],
                             "post/fitted-noise/eval/accuracy/depth=0.0": [(128, 1.0), (256, 0.75)],
                             "post/fitted-noise/eval/accuracy/depth=0.5": [(128, 1.0), (256, 0.5)]}


def test_a_run_renamed_or_gone_since_leaves_no_folder_behind(tmp_path, capsys):
    """The log is rebuilt: a run whose name changed (a swept setting appeared) or whose
    result no longer reads has no folder left from the earlier call."""
    result = {"status": "ok", "lengths": [5, 20], "accuracy": [1.0, 0.5]}
    study = _fake_study(tmp_path / "s", {"a" * 16: result})
    log = tmp_path / "tb"
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 0
    first = sorted(p.name for p in log.iterdir() if p.is_dir())
    (study / "runs" / ("b" * 16)).mkdir()
    (study / "runs" / ("b" * 16) / "spec.json").write_text(json.dumps({"spec": "TaskSpec", "fields": {
        "arch": "mamba2", "seed": 1, "model": {"d_model": 32}}}))
    (study / "runs" / ("b" * 16) / "result.json").write_text(json.dumps(result))
    assert main(["runs", str(study), "--tensorboard", str(log)]) == 0
    capsys.readouterr()
    second = sorted(p.name for p in log.iterdir() if p.is_dir())
    assert len(first) == 1 and len(second) == 2 and first[0] not in second


@pytest.mark.parametrize("case", ["empty", "study", "other-study", "link-loop"])
def test_log_folders_refused_in_one_line(study, tmp_path, capsys, case):
    if case == "empty":
        target = ""
    elif case == "study":
        (tmp_path / "fresh").mkdir()
        (tmp_path / "fresh" / ".dynlab-study").write_text("{}")
        target = str(tmp_path / "fresh")
    elif case == "other-study":
        (tmp_path / "tb").mkdir()
        (tmp_path / "tb" / ".dynlab-tensorboard").write_text("written by dynlab runs --tensorboard\nstudy: /elsewhere\n")
        target = str(tmp_path / "tb")
    else:
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        target = str(tmp_path / "loop")
    assert main(["runs", str(study), "--tensorboard", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "--tensorboard" in err[0] and "allowed:" in err[0]
