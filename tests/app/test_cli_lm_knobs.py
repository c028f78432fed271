"""The LM studies from the shell: the ``smoke`` presets end to end, and the common knobs
(``--steps``, ``--d-model``, ``--n-layers``, ``--batch-size``, ``--lr``, ``--seq-len``,
``--config FILE.toml``) reaching the trained model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynlab.cli import main
from dynlab.runner.driver import open_study

LM_STUDIES = ("length-generalization", "copying", "passkey", "babilong")


@pytest.mark.parametrize("name", LM_STUDIES)
def test_smoke_preset_trains_end_to_end(tmp_path, capsys, name):
    """Every LM study's smoke preset trains, evaluates and writes a dataset whose runs are ok
    and whose training loss is below the loss of guessing a byte uniformly (ln 256)."""
    code = main(["study", name, "--preset", "smoke", "--out", str(tmp_path), "--device", "cpu", "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    ds = open_study(tmp_path / name)
    assert ds.attrs["preset"] == "smoke"
    assert set(map(str, ds["status"].values)) == {"ok"}
    loss = np.asarray(ds["train_loss"].values, dtype=float)
    assert np.all(np.isfinite(loss)) and np.all(loss < np.log(256))
    if name != "length-generalization":  # the post-training arms ran too (every model counts as learned)
        assert "post" in set(map(str, ds["phase"].values))


def _spec(run_dir):
    return json.loads((run_dir / "spec.json").read_text())["fields"]


def test_knobs_and_config_reach_the_trained_model(tmp_path, capsys):
    """--d-model, --n-layers, --steps, --batch-size, --lr, --seq-len and a --config file
    change the run specs (new run ids), are recorded in the manifest, and the trained
    model has the width and depth asked for (its saved weights, not only its spec)."""
    from safetensors.torch import load_file

    base = ["study", "length-generalization", "--preset", "smoke", "--models", "mamba2", "--device", "cpu", "-q",
            "--interventions", "zero"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    config = tmp_path / "small.toml"
    config.write_text('steps = 7\nlr = 0.002\n[model]\nd_state = 8\n[eval]\nn_samples = 4\n')
    argv = [*base, "--out", str(tmp_path / "b"), "--d-model", "24", "--n-layers", "2", "--batch-size", "4",
            "--seq-len", "32", "--config", str(config), "--steps", "9"]
    assert main(argv) == 0, capsys.readouterr().err
    ids_a = json.loads((tmp_path / "a/length-generalization/manifest.json").read_text())["run_ids"]
    manifest = json.loads((tmp_path / "b/length-generalization/manifest.json").read_text())
    assert set(ids_a).isdisjoint(manifest["run_ids"])
    assert manifest["extra"]["model"] == {"d_model": 24, "n_layers": 2, "d_state": 8}
    assert manifest["extra"]["train"] == {"steps": 9, "lr": 0.002, "batch_size": 4, "seq_len": 32}  # --steps wins
    (run,) = (tmp_path / "b/length-generalization/runs").iterdir()
    spec = _spec(run)
    assert (spec["model"]["d_model"], spec["model"]["n_layers"], spec["model"]["d_state"]) == (24, 2, 8)
    assert (spec["train"]["steps"], spec["train"]["batch_size"], spec["train"]["seq_len"]) == (9, 4, 32)
    assert spec["eval"]["n_samples"] == 4
    weights = load_file(run / "model.safetensors")
    embedding = [v for k, v in weights.items() if "embedding" in k]
    assert [tuple(v.shape) for v in embedding] == [(256, 24)]
    assert len({k.split(".")[1] for k in weights if k.startswith("blocks.")}) == 2
    result = json.loads((run / "result.json").read_text())
    assert result["train_steps"] == 9


def test_task_study_knobs(tmp_path, capsys):
    """A task study takes the knobs and [task] fields from --config; its run spec has them."""
    config = tmp_path / "c.toml"
    config.write_text('[task]\ntrain_max = 6\neval_lengths = [6, 12]\n[post]\nsteps = 3\n')
    argv = ["study", "copying", "--preset", "smoke", "--device", "cpu", "-q", "--out", str(tmp_path),
            "--steps", "5", "--d-model", "8", "--config", str(config), "--interventions", "state-passing"]
    assert main(argv) == 0, capsys.readouterr().err
    (run,) = (tmp_path / "copying/runs").iterdir()
    spec = _spec(run)
    assert spec["model"]["d_model"] == 8 and spec["train"]["steps"] == 5 and spec["post"]["steps"] == 3
    assert spec["task"]["train_max"] == 6 and spec["task"]["eval_lengths"] == [6, 12]
    assert spec["post"]["interventions"] == ["zero", "state-passing"]


BAD_KNOBS = [
    (["--steps", "-3"], "--steps -3: Input should be greater than or equal to 1"),
    (["--lr", "0"], "--lr 0.0: Input should be greater than 0"),
    (["--d-model", "0"], "--d-model 0"),
    (["--seq-len", "1"], "--seq-len 1"),
    (["--steps", "many"], "'--steps'"),
    (["--config", "{cfg}"], "unknown key 'stepz'; allowed: steps, d_model, n_layers, batch_size, lr, seq_len"),
]
BAD_CONFIGS = {
    "top": ("stepz = 3\n", "unknown key 'stepz'; allowed: steps, d_model, n_layers, batch_size, lr, seq_len"),
    "field": ("[train]\nstepz = 3\n", "train.stepz: unknown key 'stepz' in [train]; allowed: steps, batch_size"),
    "value": ('[train]\nsteps = "many"\n', "train.steps = 'many': Input should be a valid integer"),
    "range": ("[eval]\nn_samples = 0\n", "eval.n_samples = 0: Input should be greater than or equal to 1"),
    "fixed": ('[model]\nmixer = "gla"\n', "unknown key 'mixer' in [model]; allowed: d_model, n_layers"),
    "twice": ("steps = 3\n[train]\nsteps = 4\n", "steps is given twice"),
    "table": ("model = 3\n", "model = 3 is not a table"),
    "toml": ("[train\n", "is not TOML"),
}


def _one_error_line(capsys, code, tmp_path, message):
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "out").exists()
    return err


@pytest.mark.parametrize("flags,message", BAD_KNOBS, ids=[" ".join(f) for f, _ in BAD_KNOBS])
def test_bad_knob_is_one_line_exit_2(tmp_path, capsys, flags, message):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("stepz = 3\n")
    flags = [f.replace("{cfg}", str(cfg)) for f in flags]
    code = main(["study", "length-generalization", "--preset", "smoke", "--out", str(tmp_path / "out"), "-q", *flags])
    _one_error_line(capsys, code, tmp_path, message)


@pytest.mark.parametrize("name", BAD_CONFIGS)
def test_bad_config_is_one_line_exit_2(tmp_path, capsys, name):
    text, message = BAD_CONFIGS[name]
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    code = main(["study", "length-generalization", "--preset", "smoke", "--out", str(tmp_path / "out"), "-q",
                 "--config", str(cfg)])
    assert str(cfg) in _one_error_line(capsys, code, tmp_path, message)  # the file is named


def test_task_study_refuses_seq_len(tmp_path, capsys):
    code = main(["study", "passkey", "--preset", "smoke", "--out", str(tmp_path / "out"), "-q", "--seq-len", "64"])
    _one_error_line(capsys, code, tmp_path, "study passkey trains on its task's lengths, not a seq_len; allowed: "
                                            "task.train_min and task.train_max")
