"""Studies copying, passkey, babilong end to end (tiny overrides); post-training a dynlab run; CLI bad input."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first)

from dynlab.cli import main  # noqa: E402
from dynlab.figures import write_figures  # noqa: E402
from dynlab.runner.driver import open_study, run_study  # noqa: E402
from dynlab.studies import STUDIES, get_study  # noqa: E402
from dynlab.runner.protocol import StudyOptions  # noqa: E402

TINY_MODEL = {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8}
TINY = {
    "copying": {"task": {"train_min": 3, "train_max": 5, "eval_lengths": [3, 10]}},
    "passkey": {"task": {"train_min": 104, "train_max": 110, "eval_lengths": [110, 140], "depths": [0.0, 1.0]}},
    "babilong": {"task": {"train_min": 160, "train_max": 170, "eval_lengths": [170, 200], "n_facts": 3,
                          "babi_kinds": ["qa1", "qa6"]}},
}


def _options(name: str, **kw) -> StudyOptions:
    extra = {"model": TINY_MODEL, "train": {"steps": 2, "batch_size": 2}, "eval": {"n_samples": 3, "chunk_len": 64},
             "post": {"steps": 2}, **TINY[name]}
    return StudyOptions(preset="quick", seeds=(0,), extra={**extra, **kw})


def test_studies_registered_with_quick_presets_of_the_protocol():
    """One run per (mixer, seed): trained from the zero state, then post-trained per arm with the zero control."""
    for name, arms in (("copying", ("zero", "state-passing", "fitted-noise")),
                       ("passkey", ("zero", "fitted-noise", "state-passing")),
                       ("babilong", ("zero", "state-passing", "fitted-noise"))):
        study = get_study(name)
        assert name in STUDIES and {"quick", "paper"} <= set(study.presets)
        specs = study.make_specs(StudyOptions(preset="quick"))
        assert [s.seed for s in specs] == [0, 1, 2]
        assert all(s.intervention.kind == "zero" and s.post.interventions == arms for s in specs)
        # Mamba's width-4 convolution; babilong's quick preset widens it to 5 (a stated rule, its docstring)
        assert all(s.model.mixer == "mamba2" and s.model.conv_kernel == (5 if name == "babilong" else 4)
                   for s in specs)
        # the zero control is always there, first
        only = study.make_specs(StudyOptions(preset="quick", extra={"interventions": ["state-passing"]}))
        assert only[0].post.interventions == ("zero", "state-passing")
    copying = get_study("copying").make_specs(StudyOptions(preset="paper"))[0].task
    assert (copying.train_min, copying.train_max) == (50, 100) and 300 in copying.eval_lengths
    passkey = get_study("passkey").make_specs(StudyOptions(preset="quick"))[0].task
    assert max(passkey.eval_lengths) >= 16 * passkey.train_max  # the contrast reaches 16x the training length
    babi = get_study("babilong").make_specs(StudyOptions(preset="quick"))[0]
    assert (babi.task.babi_tokens, babi.task.babi_questions, babi.warm_start) == ("words", "all", None)
    assert max(babi.task.eval_lengths) >= 16 * babi.task.train_max and "qa1" in babi.task.babi_kinds


@pytest.mark.parametrize("name, extra, match", [
    ("copying", {"interventions": ["tbtt"]}, "unknown intervention 'tbtt'"),
    ("passkey", {"task": {"eval_lengths": [40]}}, "passkey length 40 is too short"),
    ("passkey", {"task": {"depths": [-0.1]}}, r"depth -0.1 is outside \[0, 1\]"),
    ("babilong", {"task": {"babi_kinds": ["qa4"]}}, "babi_kinds"),
    ("babilong", {"task": {"eval_lengths": [20]}}, "too short to hold 3 facts"),
    ("babilong", {"task": {"babi_tokens": "bpe"}}, "babi_tokens"),
    ("copying", {"source": "/no/such.txt"}, "uses no filler text"),
    ("passkey", {"source": "/no/such.txt"}, "neither one of"),
])
def test_bad_task_selections_raise(name, extra, match):
    with pytest.raises(ValueError, match=match):
        get_study(name).make_specs(StudyOptions(preset="quick", extra=extra))


@pytest.mark.slow
@pytest.mark.parametrize("name, dims", [("copying", ("run", "length")), ("passkey", ("run", "length", "depth")),
                                        ("babilong", ("run", "length", "kind"))])
def test_tiny_task_study_dataset_and_panels(name, dims, tmp_path):
    """learned_at = 0 makes the 2-step model count as learned, so the post-training arms run."""
    options = _options(name, eval={"n_samples": 3, "chunk_len": 64, "learned_at": 0.0})
    path = run_study(get_study(name), options, out=tmp_path, device="cpu")
    ds = open_study(path)
    assert ds["accuracy"].dims == dims
    for var in ("accuracy", "token_accuracy", "exact_match", "length", "contrast_mean", "in_range_accuracy"):
        assert ds[var].attrs["long_name"] and "units" in ds[var].attrs, var
    spec = get_study(name).make_specs(options)[0]
    assert list(ds["phase"].values) == ["base"] + ["post"] * len(spec.post.interventions)
    assert list(ds["intervention"].values) == ["zero", *spec.post.interventions]
    assert set(ds["run_id"].values) == {spec.run_id} and list(ds["status"].values) == ["ok"] * ds.sizes["run"]
    assert ds["arch"].dims == ("run",) and list(ds["arch"].values) == ["mamba2"] * ds.sizes["run"]
    acc = ds["accuracy"].values
    assert np.all((acc >= 0) & (acc <= 1))
    headline = ds["token_accuracy"] if name == "copying" else ds["exact_match"]
    np.testing.assert_array_equal(acc, headline.values)
    assert (ds["exact_match"] <= ds["token_accuracy"] + 1e-12).all()  # all tokens right implies each token right
    # the contrast is the arm's accuracy minus the control's (one seed: no interval)
    arm = spec.post.interventions[1]
    rows = {iv: i for i, iv in enumerate(ds["intervention"].values) if ds["phase"].values[i] == "post"}
    diff = ds["accuracy"].isel(run=rows[arm]) - ds["accuracy"].isel(run=rows["zero"])
    np.testing.assert_allclose(ds["contrast_mean"].sel(mixer="mamba2", contrast=arm).values, diff.values)
    assert int(ds["contrast_n"].sel(mixer="mamba2", contrast=arm)) == 1
    from dynlab.results.vocabulary import check_dataset

    assert check_dataset(ds) == []  # every variable is in the one vocabulary, with its units
    if name == "babilong":
        from dynlab.lm.data.babi import babi_chance

        assert [float(ds["chance"].sel(kind=k)) for k in ("qa1", "qa6")] == [babi_chance(k, 3) for k in ("qa1", "qa6")]
    figs = write_figures(ds, tmp_path / "figs", get_study(name).panels)
    assert figs.written and not figs.skipped, figs.skipped
    plt.close("all")


@pytest.mark.slow
def test_a_run_that_did_not_learn_gets_no_arms_and_no_contrast(tmp_path):
    path = run_study(get_study("copying"), _options("copying"), out=tmp_path, device="cpu")
    ds = open_study(path)
    assert list(ds["status"].values) == ["not-learned"] and list(ds["phase"].values) == ["base"]
    assert "contrast_mean" not in ds and float(ds["in_range_accuracy"].values[0]) < 0.9
    assert "in-range accuracy" in str(ds["reason"].values[0])


@pytest.mark.slow
def test_post_training_a_dynlab_run_zero_steps_reproduces_its_evaluation(tmp_path):
    from dynlab.lm.train.posttrain import PostTrainSpec, PostTrainTrainSpec, checkpoint_digest, post_train
    from dynlab.lm.spec import InterventionSpec
    from dynlab.studies.length_generalization import STUDY

    tiny = {"model": TINY_MODEL, "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
            "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 4,
                     "effrem_samples": 2, "state_points": 8}, "interventions": ["zero"]}
    options = StudyOptions(preset="quick", extra=tiny)
    run_study(STUDY, options, out=tmp_path, device="cpu")
    spec = STUDY.make_specs(options)[0]
    run = tmp_path / "length-generalization" / "runs" / spec.spec_hash()
    stored = json.loads((run / "result.json").read_text())
    post = PostTrainSpec(checkpoint=str(run), checkpoint_sha256=checkpoint_digest(run), eval=spec.eval,
                         intervention=InterventionSpec(kind="tbtt"),
                         train=PostTrainTrainSpec(steps=0, batch_size=2, seq_len=16))
    result, _ = post_train(post, "cpu")
    np.testing.assert_allclose(result["ppl"], stored["ppl"], rtol=1e-5, atol=0)  # float32 sums: thread count may differ
    np.testing.assert_allclose(result["state_std"], stored["state_std"], rtol=1e-5, atol=0)
    assert stored["state_t"][0] == 1 and stored["state_t"][-1] == 64  # from t = 1 to the evaluation length
    # CLI: post-train two steps of fitted noise and store the run with its dataset
    rc = main(["lm", "post-train", "--checkpoint", str(run), "--intervention", "fitted-noise", "--steps", "2",
               "--batch-size", "2", "--eval-multiple", "2", "--samples", "2", "--out", str(tmp_path / "pt"),
               "--device", "cpu"])
    assert rc == 0
    (folder,) = (tmp_path / "pt" / "post-train" / "runs").iterdir()
    ds = open_study(folder / "dataset.nc")
    assert ds.attrs["intervention"] == "fitted-noise" and np.isfinite(ds["ppl"].sel(t=slice(1, None))).all()
    from dynlab.results.vocabulary import check_dataset

    assert check_dataset(ds) == []  # the post-training dataset speaks the vocabulary too
    assert json.loads((folder / "result.json").read_text())["train_steps"] == 2


@pytest.mark.parametrize("argv, match", [
    (["lm", "post-train", "--checkpoint", "{tmp}"], "is not a model"),
    (["lm", "post-train", "--checkpoint", "{tmp}/nothing"], "is not a model (no such folder)"),
    (["lm", "post-train", "--checkpoint", "{tmp}", "--task", "sorting"], "unknown task kind 'sorting'"),
    (["study", "passkey", "--lengths", "50"], "passkey length 50 is too short"),
    (["study", "passkey", "--depths", "0.5,1.5"], r"depth 1.5 is outside [0, 1]"),
    (["study", "babilong", "--kinds", "qa1,qa9"], "unknown kind 'qa9'"),
    (["study", "copying", "--depths", "0.5"], "study copying takes no --depths"),
    (["study", "length-generalization", "--source", "{tmp}/empty.txt"], "is empty"),
    (["study", "passkey", "--source", "{tmp}/nothing.txt"], "neither one of"),
])
def test_cli_bad_input_one_line_exit_2_nothing_written(argv, match, tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("")
    out = tmp_path / "out"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and match in err, err
    assert not out.exists()


def test_lm_study_help_names_mixers_and_no_groups(capsys):
    for name in ("length-generalization", "copying", "passkey", "babilong"):
        assert main(["study", name, "--help"]) == 0
        text = capsys.readouterr().out
        assert "mamba2, mamba1, gla" in text and "--source" in text and "--groups" not in text, name
    assert main(["study", "copying", "--groups", "S3"]) == 2


@pytest.mark.parametrize("learned_at, check_at, steps_run", [(0.0, None, 3), (1.0, None, 7), (0.0, 1.0, 7)])
def test_until_learned_stops_at_the_first_passed_check_and_the_cap_otherwise(learned_at, check_at, steps_run):
    """A check every 3 steps: learned_at 0 passes the first check; 1.0 is never reached by a
    7-step model; check_at 1.0 keeps training to the cap although learned_at 0 is met."""
    from dynlab.lm.run.task import train_and_evaluate_task

    spec = get_study("copying").make_specs(_options(
        "copying", train={"steps": 7, "batch_size": 2, "until_learned": True, "check_every": 3, "check_samples": 2,
                          "check_at": check_at},
        eval={"n_samples": 3, "chunk_len": 64, "learned_at": learned_at}))[0]
    result, _ = train_and_evaluate_task(spec, "cpu")
    assert result["train_steps"] == steps_run
    assert result["status"] == ("ok" if learned_at == 0.0 else "not-learned")


def _attempt_spec(attempts: int, learned_at: float, steps: int = 4):
    train = {"steps": steps, "batch_size": 2, "until_learned": True, "check_every": 2, "check_samples": 2,
             "attempts": attempts}
    return get_study("copying").make_specs(_options(
        "copying", train=train, post={"steps": 1},
        eval={"n_samples": 3, "chunk_len": 64, "learned_at": learned_at}))[0]


def test_attempts_redraw_an_unlearned_model_from_the_attempt_seed():
    """learned_at 1.0 is out of reach of a few steps: every attempt runs to its cap and the
    next one starts from build_model(init_seed = seed + k · ATTEMPT_SEED_OFFSET); with 0
    steps per attempt the run's final weights are exactly the last attempt's fresh draw."""
    import torch

    from dynlab.lm.run.text import build_model
    from dynlab.lm.run.task import ATTEMPT_SEED_OFFSET, train_and_evaluate_task

    spec = _attempt_spec(3, 1.0, steps=0)
    result, weights = train_and_evaluate_task(spec, "cpu")
    assert result["status"] == "not-learned" and result["train_attempts"] == 3
    assert [a["init_seed"] for a in result["attempts"]] == [spec.seed + k * ATTEMPT_SEED_OFFSET for k in range(3)]
    assert not any(a["learned"] for a in result["attempts"])
    last, first = build_model(spec, init_seed=spec.seed + 2 * ATTEMPT_SEED_OFFSET), build_model(spec)
    for name, value in last.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    assert any(not torch.equal(weights[n], v) for n, v in first.state_dict().items())
    # with steps, every attempt trains to the cap and the run counts all their steps
    result, _ = train_and_evaluate_task(_attempt_spec(2, 1.0, steps=3), "cpu")
    assert [a["train_steps"] for a in result["attempts"]] == [3, 3] and result["train_steps"] == 6


def test_attempts_keep_a_model_that_passes_the_check_at_its_cap():
    """check_every 10 > the 3-step cap: no scheduled check, so learned_at 0.0 is met only by
    the check at the cap, and the first model is kept."""
    from dynlab.lm.run.task import train_and_evaluate_task

    spec = _attempt_spec(3, 0.0, steps=3)
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"check_every": 10})})
    result, _ = train_and_evaluate_task(spec, "cpu")
    assert result["train_attempts"] == 1 and result["attempts"][0] == {**result["attempts"][0], "learned": True,
                                                                          "train_steps": 3}
    assert result["status"] == "ok"


def test_attempts_keep_a_model_that_learns_at_once_and_its_run_id():
    """Attempt 0 is the run without the rule: the same weights and loss; attempts = 1 leaves the run id as it was."""
    import torch

    from dynlab.lm.run.task import train_and_evaluate_task

    one, three = _attempt_spec(1, 0.0), _attempt_spec(3, 0.0)
    r1, w1 = train_and_evaluate_task(one, "cpu")
    r3, w3 = train_and_evaluate_task(three, "cpu")
    assert r3["train_attempts"] == 1 and r3["attempts"][0]["learned"] and r3["train_steps"] == 2 == r1["train_steps"]
    assert "train_attempts" not in r1 and r1["train_loss"] == r3["train_loss"]
    for name, value in w1.items():
        torch.testing.assert_close(w3[name], value, rtol=0, atol=0)
    assert "attempts" not in one.hashed_fields()["train"] and one.run_id != three.run_id


def test_babilong_kinds_preset_starts_from_the_quick_presets_first_qa1_model():
    """The kinds preset's warm start is quick's qa1 training with one attempt (the same model,
    task, text and seed: its first attempt), and it then learns qa1, qa6, qa7 together."""
    study = get_study("babilong")
    for quick, kinds in zip(study.make_specs(StudyOptions(preset="quick")), study.make_specs(StudyOptions(preset="kinds"))):
        assert kinds.warm_start.task == quick.task and kinds.model == quick.model and kinds.seed == quick.seed
        assert kinds.warm_start.train == quick.train.model_copy(update={"attempts": 1})
        assert kinds.task.babi_kinds == kinds.eval.learn_kinds == ("qa1", "qa6", "qa7")
        assert kinds.task.model_copy(update={"babi_kinds": ("qa1",)}) == quick.task


@pytest.mark.parametrize("update, match", [
    ({"until_learned": False}, "needs train.until_learned"),
    ({"until_learned": True, "warm": True}, "with a warm start is not supported"),
    ({"attempts": 1, "until_learned": True, "warm": True, "warm_train": {"attempts": 3, "until_learned": True}},
     "warm_start.train.attempts 3 is not supported"),
    ({"attempts": 1, "until_learned": False, "check_at": 0.95}, "check_at 0.95 needs train.until_learned"),
])
def test_attempts_need_the_learned_check_and_no_warm_start(update, match):
    from dynlab.lm.spec import LMTaskRunSpec, LMTaskSpec, TaskTrainSpec, WarmStartSpec

    update = dict(update)
    spec = _attempt_spec(1, 0.9)
    warm_train = update.pop("warm_train", {})
    warm = WarmStartSpec(task=LMTaskSpec(kind="copying", train_min=2, train_max=4, eval_lengths=(4,)),
                         train=TaskTrainSpec(steps=3, batch_size=2, **warm_train)) if update.pop("warm", False) else None
    data = spec.model_dump()
    data["train"].update(**{"attempts": 2, **update})
    data["warm_start"] = None if warm is None else warm.model_dump()
    with pytest.raises(ValueError, match=match):
        LMTaskRunSpec.model_validate(data)


def test_a_warm_start_trains_the_same_model_on_its_task_first():
    """The run with a warm start equals: train on the warm-start task, then on the run's task."""
    import torch

    from dynlab.lm.run.text import build_model
    from dynlab.lm.spec import LMTaskSpec, TaskTrainSpec, WarmStartSpec
    from dynlab.lm.run.task import train_and_evaluate_task, train_task, warm_start_spec

    spec = get_study("passkey").make_specs(_options("passkey"))[0]
    warm = WarmStartSpec(task=LMTaskSpec(kind="copying", train_min=2, train_max=4, eval_lengths=(4,)),
                         train=TaskTrainSpec(steps=3, batch_size=2, threads=1))
    spec = spec.model_copy(update={"warm_start": warm, "post": None})
    result, weights = train_and_evaluate_task(spec, "cpu")
    assert result["warm_start"]["train_steps"] == 3 and 0.0 <= result["warm_start"]["in_range_accuracy"] <= 1.0
    model = build_model(spec)
    with torch.random.fork_rng():
        train_task(model, warm_start_spec(spec))
        train_task(model, spec)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)
    cold, _ = train_and_evaluate_task(spec.model_copy(update={"warm_start": None}), "cpu")
    assert cold["train_loss"] != result["train_loss"]


def test_babi_panel_draws_each_kinds_chance_level(repo_root):
    """The dotted lines of the bAbI panel sit at babi_chance(kind, n_facts) of the dataset's runs, in the kind's colour."""
    from dynlab.lm.figures.tasks import babi_panel
    from dynlab.lm.data.babi import babi_chance
    from dynlab.results.schema import open_dataset

    ds = open_dataset(repo_root / "benchmarks/results/datasets/babilong-kinds.nc")
    fig, ax = plt.subplots()
    babi_panel(ds, ax, intervention="zero")
    dotted = [line for line in ax.lines if line.get_linestyle() == ":" and len(line.get_ydata()) == 2]
    solid = {line.get_label(): line.get_color() for line in ax.lines if line.get_linestyle() == "-"}
    assert len(dotted) == 3
    for kind, line in zip(("qa1", "qa6", "qa7"), dotted):
        assert line.get_ydata()[0] == pytest.approx(babi_chance(kind, 3)) and line.get_color() == solid[kind]
    plt.close(fig)


def test_confirm_counts_a_lucky_check_that_fails_the_in_range_test_as_a_failed_attempt(monkeypatch):
    """With ``train.confirm`` a passed check is confirmed on fresh samples, and a model that
    then tests below learned_at in range is a failed attempt: the next model is drawn.
    The in-range scores are scripted in the order they are asked for (check, confirmation,
    in-range test per attempt), so the rule alone decides what happens."""
    from dynlab.lm.run import task as task_run

    asked: list[tuple[int, str]] = []
    script = iter([1.0, 1.0, 0.5,   # attempt 0: check and confirmation pass, the in-range test fails
                   1.0, 1.0, 0.95,  # attempt 1: all pass
                   0.95])           # the run's own test (status)
    real_evaluate = task_run.evaluate_task

    def evaluate(model, spec, part="val", seed_offset=task_run.EVAL_SEED_OFFSET):
        asked.append((spec.eval.n_samples, part))
        return real_evaluate(model, spec, part, seed_offset)

    monkeypatch.setattr(task_run, "evaluate_task", evaluate)
    monkeypatch.setattr(task_run, "in_range_accuracy", lambda result, spec: next(script))
    spec = _attempt_spec(3, 0.9, steps=4)
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"confirm": True})})
    result, _ = task_run.train_and_evaluate_task(spec, "cpu")
    assert [a["learned"] for a in result["attempts"]] == [False, True]
    assert [a["in_range_test"] for a in result["attempts"]] == [0.5, 0.95]
    assert [a["train_steps"] for a in result["attempts"]] == [2, 2] and result["status"] == "ok"
    # check (check_samples, training text), confirmation (the test's n_samples, training text), in-range test (val)
    assert asked[:3] == [(2, "train"), (3, "train"), (3, "val")]


def test_confirm_rejects_a_check_its_confirmation_does_not_repeat(monkeypatch):
    """A check that passes on its few samples but not on the confirming draw does not stop training."""
    from dynlab.lm.run import task as task_run

    script = iter([1.0, 0.5] * 10 + [0.5] * 10)
    monkeypatch.setattr(task_run, "in_range_accuracy", lambda result, spec: next(script))
    spec = _attempt_spec(1, 0.9, steps=5)
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"confirm": True})})
    result, _ = task_run.train_and_evaluate_task(spec, "cpu")
    assert result["train_steps"] == 5  # checks at 2 and 4 passed but were not confirmed: trained to the cap
    unset = _attempt_spec(1, 0.9)
    assert "confirm" not in unset.hashed_fields()["train"]  # off: the run id of the rule before it


@pytest.mark.parametrize("preset", ["quick", "kinds", "paper"])
def test_every_advertised_babi_kind_runs_in_every_preset(preset, tmp_path, capsys, monkeypatch):
    """--kinds takes each kind it lists: a preset with too few facts for one (qa3 needs 4)
    runs it with the facts it needs, in the command line as in the Python API."""
    import dynlab.runner.driver
    from dynlab.cli import main
    from dynlab.lm.data.babi import BABI_KINDS, MIN_FACTS
    from dynlab.studies import CATALOG, get_study
    from dynlab.runner.protocol import StudyOptions

    assert CATALOG["babilong"].kinds == BABI_KINDS
    for kind in BABI_KINDS:
        specs = get_study("babilong").make_specs(StudyOptions(preset=preset, extra={"task": {"babi_kinds": [kind]}}))
        assert {s.task.babi_kinds for s in specs} == {(kind,)}
        assert all(s.task.n_facts >= MIN_FACTS.get(kind, 1) for s in specs)
    made = {}
    monkeypatch.setattr(dynlab.runner.driver, "run_study",
                        lambda study, options, **kw: made.setdefault("specs", study.make_specs(options)) and tmp_path)
    assert main(["study", "babilong", "--kinds", ",".join(BABI_KINDS), "--preset", preset, "-q", "--device", "cpu",
                 "--out", str(tmp_path / "out")]) == 0, capsys.readouterr().err
    assert made["specs"][0].task.n_facts >= MIN_FACTS["qa3"]
