"""group-tracking with more groups (--groups A4, C2xS3, …): task, training and analyses unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynlab.cli import main
from dynlab.runner.driver import open_study
from dynlab.studies.group_tracking import make_specs
from dynlab.runner.protocol import StudyOptions


@pytest.mark.parametrize("name, order", [("A4", 12), ("D4", 8), ("S4", 24), ("A5", 60), ("S5", 120),
                                         ("C2xS3", 12), ("C3xC3", 9)])
def test_more_groups_make_specs(name, order):
    from dynlab.tracking.groups import get_group

    (spec,) = make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": (name,)}))
    assert spec.task.group == name and get_group(name).order == order


@pytest.mark.slow
def test_a4_and_c2xs3_end_to_end_with_analyses(tmp_path, capsys):
    code = main(["study", "group-tracking", "--models", "tanh-rnn", "--groups", "A4,C2xS3", "--preset", "smoke",
                 "--out", str(tmp_path), "-q"])
    assert code == 0, capsys.readouterr().err
    ds = open_study(tmp_path / "group-tracking")
    # 20 smoke steps never reach the training length: evaluated and analysed, not learned
    assert list(ds["group"].values) == ["A4", "C2xS3"] and list(ds["status"].values) == ["not-learned"] * 2
    # |A4| = 4!/2 and |C2 × S3| = 2·3!: 12 classes each
    assert list(ds["group_order"].values) == [math.factorial(4) // 2, 2 * math.factorial(3)]
    acc = ds["accuracy"].values
    assert np.isfinite(acc).all() and ((acc >= 0) & (acc <= 1)).all()
    # the analyses ran to the longest evaluated length; U has at most |G| - 1 dimensions
    assert ds.sizes["t"] == int(ds["length"].max())
    assert (ds["n_present"].values <= 12).all() and (ds["k_U"].values <= 11).all()
    assert set(ds["failure_mode"].values) <= {"saturation", "climb", "robust"}
    bad = ["study", "group-tracking", "--groups", "Z9", "--models", "tanh-rnn", "--preset", "smoke"]
    assert main([*bad, "--out", str(tmp_path)]) == 2


def test_paper_preset_has_at_least_113_models_to_length_1000():
    from dynlab.tracking.models import BUILTIN_ARCHS

    specs = make_specs(StudyOptions(preset="paper"))
    assert len(specs) >= 113 and len({s.spec_hash() for s in specs}) == len(specs)
    assert {s.model.arch for s in specs} == set(BUILTIN_ARCHS) and {s.task.group for s in specs} == {"C2", "C6", "S3"}
    assert {s.seed for s in specs} == {0, 1, 2, 3, 4}
    assert {max(s.eval.lengths) for s in specs} == {1000} and {s.train.curriculum.max_length for s in specs} == {60}
    more = make_specs(StudyOptions(preset="paper", extra={"groups": ("A5", "S5")}))
    assert len(more) == len(BUILTIN_ARCHS) * 2 * 5
