"""The LM study commands refuse a value of the wrong type or size before anything runs: a
``--config`` TOML value of another type than its spec field (``true`` for a number, ``1``
for a bool, ``"0.01"`` for a float), a float that is not finite (option or file), and task
lengths from a file whose samples exceed the length limit; one line, exit code 2, no
folder written."""

from __future__ import annotations

import re

import pytest

from dynlab.cli import main
from dynlab.errors import DynlabInputError


def _refused(tmp_path, capsys, argv, config, message):
    """``dynlab study`` with ``argv`` (and ``config`` as a --config file when given) exits 2
    with one line holding ``message`` and writes no output folder."""
    if config is not None:
        path = tmp_path / "c.toml"
        path.write_text(config)
        argv = [*argv, "--config", str(path)]
    code = main(["study", *argv, "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "out").exists()


LG = ["length-generalization", "--preset", "smoke"]
COPY = ["copying", "--preset", "smoke"]
WRONG_TYPES = {
    "steps-bool": (LG, "steps = true\n", "steps = True: Input should be a valid integer"),
    "d_model-bool": (LG, "d_model = true\n", "d_model = True: Input should be a valid integer"),
    "lr-string": (LG, 'lr = "0.01"\n', "lr = '0.01': Input should be a valid number"),
    "model-bool": (LG, "[model]\nn_heads = false\n", "model.n_heads = False: Input should be a valid integer"),
    "task-steps-bool": (COPY, "steps = true\n", "steps = True: Input should be a valid integer"),
    "until_learned-string": (COPY, '[train]\nuntil_learned = "yes"\n',
                             "train.until_learned = 'yes': Input should be a valid boolean"),
    "until_learned-int": (COPY, "[train]\nuntil_learned = 1\n",
                          "train.until_learned = 1: Input should be a valid boolean"),
    "lengths-bools": (COPY, "[task]\neval_lengths = [true, 8]\n",
                      "task.eval_lengths = [True, 8]: Input should be a valid integer"),
    "task-post-steps-bool": (COPY, "[post]\nsteps = true\n", "post.steps = True: Input should be a valid integer"),
    "lg-post-steps-bool": (["length-generalization", "--preset", "interventions"], "[post]\nsteps = true\n",
                           "post.steps = True: Input should be a valid integer"),
}


@pytest.mark.parametrize("name", WRONG_TYPES)
def test_config_value_of_another_type_is_refused(tmp_path, capsys, name):
    """A TOML value is taken as the type TOML gives it: no bool becomes a number, no number
    a bool, no string a number (before: ``steps = true`` trained 1 step)."""
    argv, config, message = WRONG_TYPES[name]
    _refused(tmp_path, capsys, argv, config, message)


def test_config_values_of_the_field_types_are_taken():
    """Strictness refuses no value of the field's own type: an integer for a float, arrays
    for tuples (of ints, floats, names)."""
    from dynlab.app.lm_config import check_spec_value
    from dynlab.lm.spec import LMEvalSpec, LMTaskSpec, TaskTrainSpec

    where = "--config c.toml"
    for cls, section, field, value in [(TaskTrainSpec, "train", "lr", 1), (TaskTrainSpec, "train", "warmup_frac", 0),
                                       (TaskTrainSpec, "train", "until_learned", True),
                                       (TaskTrainSpec, "train", "check_at", 1),
                                       (LMTaskSpec, "task", "eval_lengths", [4, 8]),
                                       (LMTaskSpec, "task", "depths", [0, 0.5, 1]),
                                       (LMEvalSpec, "eval", "checkpoints", [1, 2.5]),
                                       (LMEvalSpec, "eval", "distances", ["tv", "js"])]:
        check_spec_value(cls, section, field, value, f"{where}: {section}.{field}")


NOT_FINITE = {
    "lg-lr-option": (["--lr", "inf"], None),
    "lg-lr-config": ([], "[train]\nlr = inf\n"),
    "lg-clip": ([], "[train]\nclip = inf\n"),
    "lg-weight_decay": ([], "[train]\nweight_decay = inf\n"),
    "lg-sigma": ([], "[intervention]\nsigma = inf\n"),
    "lg-dt_max": ([], "[model]\ndt_max = inf\n"),
    "lg-warmup_frac-nan": ([], "[train]\nwarmup_frac = nan\n"),
}


@pytest.mark.parametrize("name", NOT_FINITE)
@pytest.mark.parametrize("study", ["length-generalization", "copying"])
def test_non_finite_float_is_refused(tmp_path, capsys, name, study):
    """A float training setting must be finite (before: ``--lr inf`` trained every run to
    divergence and exited 0)."""
    flags, config = NOT_FINITE[name]
    _refused(tmp_path, capsys, [study, "--preset", "smoke", *flags], config, "Input should be a finite number")


@pytest.mark.parametrize("field", ["train_min", "train_max"])
def test_task_lengths_from_config_are_checked_against_the_limit(tmp_path, capsys, field):
    """``[task] train_max`` (and ``train_min``) from a file is held to the task's length limit
    as ``--lengths`` is (before: ``train_max = 60000`` trained on samples of 120k tokens)."""
    config = "[task]\ntrain_min = 60000\ntrain_max = 60000\n" if field == "train_min" else \
        "[task]\ntrain_min = 1\ntrain_max = 60000\n"
    _refused(tmp_path, capsys, COPY, config,
             f"{field}: copying length 60000 makes samples of 120003 tokens; allowed: a string length <= 49998")


def test_task_spec_checks_train_max():
    from dynlab.lm.spec import LMTaskSpec

    with pytest.raises(ValueError, match="train_max: copying length 50000 makes samples of 100003 tokens"):
        LMTaskSpec(kind="copying", train_min=1, train_max=50_000, eval_lengths=(8,))
    assert LMTaskSpec(kind="copying", train_min=1, train_max=49_998, eval_lengths=(8,)).train_max == 49_998


def test_post_arms_are_the_top_level_interventions(tmp_path, capsys, repo_root):
    """``[post] interventions`` is refused, saying where the arms are named; the top-level
    ``interventions`` names them; docs/usage.md lists the ``post`` overrides the check takes."""
    from dynlab.app.lm_config import lm_knob_options
    from dynlab.app.study import lm_study_options
    from dynlab.lm.spec import LMPostSpec
    from dynlab.studies import CATALOG, get_study

    _refused(tmp_path, capsys, ["length-generalization", "--preset", "interventions"],
             '[post]\ninterventions = ["zero"]\n',
             "unknown key 'interventions' in [post] (the post-training arms are the top-level interventions, or "
             "--interventions); allowed: steps, lr, warmup_frac")
    entry = CATALOG["length-generalization"]
    config = tmp_path / "arms.toml"
    config.write_text('interventions = ["state-passing"]\n[post]\nsteps = 7\n')
    assert lm_knob_options(entry, {}, config) == {"interventions": ["state-passing"], "post": {"steps": 7}}
    options = lm_study_options(entry, "mamba2", None, None, None, None, None, "5", "interventions", {}, config)
    (spec,) = get_study(entry.name).make_specs(options)
    assert spec.post.interventions == ("zero", "state-passing") and spec.post.steps == 7
    usage = (repo_root / "docs/usage.md").read_text()
    listed = re.search(r"\(`post` overrides: ([^;)]*)", usage).group(1)
    assert re.findall(r"`(\w+)`", listed) == [f for f in LMPostSpec.model_fields if f != "interventions"]
    with pytest.raises(DynlabInputError, match="unknown key 'interventions' in \\[post\\]"):
        lm_knob_options(CATALOG["copying"], {}, tmp_path / "c.toml")
