"""The training budget scaled by group (dynlab.tracking.train.budget) and TrainSpec.tail_steps."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.errors import DynlabInputError
from dynlab.studies.group_tracking import make_specs
from dynlab.runner.protocol import StudyOptions
from dynlab.tracking.train import train_tracker
from dynlab.tracking.train.budget import group_budget, width_factor
from dynlab.tracking.train.engine import lr_at

import torch

QUICK_MODEL, QUICK_TRAIN = {"hidden": 64}, {"steps": 600, "batch_size": 128, "lr": 3e-3}


def _digest(specs) -> str:
    return hashlib.sha256(",".join(s.run_id for s in specs).encode()).hexdigest()[:16]


@pytest.mark.regression_pin
@pytest.mark.parametrize("preset, n, digest", [("quick", 24, "e050e28d7dcf9d7a"), ("sweep", 120, "97049842ab8e78b7"),
                                               ("paper", 120, "9c7e657d80e8960b"), ("smoke", 24, "630b9ce245d09821")])
def test_default_groups_keep_their_run_ids(preset, n, digest):
    """C2, C6, S3 × all architectures: the run ids made before the rule and tail_steps existed
    (digests of main at 5fd753f), so every stored run of these presets is found again.

    Pins: the sha256 of each preset's run ids, printed from dynlab itself.  Regenerate (only
    when the run ids change on purpose, which retrains every stored run of the presets):
    ``python -c "from dynlab.studies.group_tracking import make_specs; from dynlab.runner.protocol import
    StudyOptions; import hashlib; [print(p, hashlib.sha256(','.join(s.run_id for s in
    make_specs(StudyOptions(preset=p))).encode()).hexdigest()[:16]) for p in
    ('quick', 'sweep', 'paper', 'smoke')]"``."""
    specs = make_specs(StudyOptions(preset=preset))
    assert len(specs) == n and _digest(specs) == digest
    assert all(s.train.tail_steps is None and "tail_steps" not in s.canonical_json() for s in specs)


# group → (hidden, steps, tail_steps, batch_size, lr_length) at the quick preset's base, written
# out from the rule in the module docstring: width 64·m with m the least power of two, m² ≥
# order/6, doubled above order 12; cap ceil(600·2·order/6); tail 300; above order 12 batch
# 4·128 and lr_length 10.
EXPECTED = {
    "C2": (64, 600, None, 128, None), "C6": (64, 600, None, 128, None), "S3": (64, 600, None, 128, None),
    "C2xC2": (64, 600, None, 128, None), "C4": (64, 600, None, 128, None),
    "C7": (128, 1400, 300, 128, None), "D4": (128, 1600, 300, 128, None), "A4": (128, 2400, 300, 128, None),
    "C12": (128, 2400, 300, 128, None), "C2xS3": (128, 2400, 300, 128, None),
    "C13": (256, 2600, 300, 512, 10), "S4": (256, 4800, 300, 512, 10), "C5xC5": (512, 5000, 300, 512, 10),
    "A5": (512, 12000, 300, 512, 10), "S5": (1024, 24000, 300, 512, 10),
}


@pytest.mark.parametrize("group", list(EXPECTED))
def test_budget_scales_as_documented(group):
    model, train = group_budget(group, QUICK_MODEL, QUICK_TRAIN)
    got = (model["hidden"], train["steps"], train.get("tail_steps"), train["batch_size"], train.get("lr_length"))
    assert got == EXPECTED[group]
    assert train["lr"] == 3e-3  # the base rate is not scaled (lr_length lowers it above length 10)


def test_budget_reaches_the_quick_preset_specs():
    specs = make_specs(StudyOptions(preset="quick", models=("tanh-rnn", "mamba"), extra={"groups": ("S3", "A4", "A5")}))
    got = {(s.task.group, s.model.arch): (s.model.hidden, s.train.steps, s.train.tail_steps, s.train.batch_size,
                                          s.train.lr_length) for s in specs}
    assert got == {(g, a): EXPECTED[g] for g in ("S3", "A4", "A5") for a in ("tanh-rnn", "mamba")}
    # a user's override still wins over the scaled budget; paper and smoke are not scaled
    (spec,) = make_specs(StudyOptions(preset="quick", models=("tanh-rnn",),
                                      extra={"groups": ("A4",), "train": {"steps": 50}, "model": {"hidden": 32}}))
    assert (spec.model.hidden, spec.train.steps, spec.train.tail_steps) == (32, 50, 300)
    for preset, hidden in (("paper", 128), ("smoke", 16)):
        (spec,) = make_specs(StudyOptions(preset=preset, models=("tanh-rnn",), seeds=(0,), extra={"groups": ("A4",)}))
        assert spec.model.hidden == hidden and spec.train.tail_steps is None


def test_groups_preset():
    from dynlab.tracking.groups import get_group
    from dynlab.tracking.models import BUILTIN_ARCHS

    specs = make_specs(StudyOptions(preset="groups"))
    groups = {s.task.group for s in specs}
    assert len(groups - {"C2", "C6", "S3"}) >= 8 and {s.seed for s in specs} == {0, 1, 2}
    assert {s.model.arch for s in specs} == set(BUILTIN_ARCHS) and len(specs) == len(groups) * len(BUILTIN_ARCHS) * 3
    orders = {get_group(g).order for g in groups}
    assert min(orders) >= 4 and max(orders) <= 60
    assert {get_group(g).is_abelian() for g in groups} == {True, False}


def test_width_factor():
    assert [width_factor(n) for n in (1, 6, 7, 24, 25, 96, 97)] == [1, 1, 2, 2, 4, 4, 8]


@pytest.mark.parametrize("group, model, train, words", [
    ("Z9", QUICK_MODEL, QUICK_TRAIN, ["unknown group 'Z9'", "allowed: C<n>"]),
    ("A4", {"hidden": 0}, QUICK_TRAIN, ["model.hidden=0", "allowed: a positive integer"]),
    ("A4", QUICK_MODEL, {"steps": "600"}, ["train.steps='600'", "allowed: a positive integer"]),
    ("A4", {}, QUICK_TRAIN, ["model.hidden=None", "allowed"]),
    ("S4", QUICK_MODEL, {"steps": 600}, ["train.batch_size=None", "allowed: a positive integer"]),
])
def test_bad_input_is_one_line_naming_allowed_values(group, model, train, words):
    with pytest.raises(DynlabInputError) as err:
        group_budget(group, model, train)
    msg = str(err.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_tail_needs_the_curriculum_schedule():
    with pytest.raises(ValueError, match="tail_steps=5 needs schedule='curriculum'"):
        TrainSpec(tail_steps=5, schedule="cosine")
    with pytest.raises(ValueError):
        TrainSpec(tail_steps=0)


def test_tail_steps_changes_the_run_id_only_when_set():
    base = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"))
    same = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"), train=TrainSpec(tail_steps=None))
    tailed = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"), train=TrainSpec(tail_steps=7))
    assert base.run_id == same.run_id != tailed.run_id
    assert '"tail_steps":7' in tailed.canonical_json()


def test_training_stops_tail_steps_after_the_curriculum_completes():
    """The run stops ``tail_steps`` steps after the first batch at max_length, not at the
    cap; its learning rate decays over those steps (written out here: cosine from lr at
    ``reached`` to 0 at ``reached + tail``)."""
    cur = CurriculumSpec(min_length=2, max_length=5, advance_at=0.01, growth=0.5)  # grows every step
    train = TrainSpec(steps=200, batch_size=4, lr=1e-2, warmup_steps=1, curriculum=cur, tail_steps=6)
    spec = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn", hidden=8), train=train)
    res = train_tracker(spec, torch.device("cpu"))
    reached = res.lengths.index(5)
    assert reached < 10 and len(res.losses) == reached + 6 and set(res.lengths[reached:]) == {5}
    for step in range(reached, reached + 6):
        want = 0.5 * 1e-2 * (1 + math.cos(math.pi * (step - reached) / 6))
        assert lr_at(train, step, reached) == pytest.approx(want, rel=1e-12, abs=1e-12)
    # without a tail the same spec trains the whole cap
    full = train_tracker(spec.model_copy(update={"train": train.model_copy(update={"tail_steps": None})}),
                         torch.device("cpu"))
    assert len(full.losses) == 200 and full.losses[:reached + 1] == res.losses[:reached + 1]


def test_lr_length_scales_the_rate_as_one_over_the_length():
    """lr_at with lr_length: the rate of the schedule times lr_length / L above lr_length,
    unchanged at and below it, and unchanged without lr_length (written out here)."""
    tr = TrainSpec(steps=110, lr=1.0, warmup_steps=10, lr_length=10)
    plain = tr.model_copy(update={"lr_length": None})
    assert lr_at(tr, 50, None, 10) == 1.0 and lr_at(tr, 50, None, 4) == 1.0
    assert lr_at(tr, 50, None, 40) == pytest.approx(0.25) and lr_at(tr, 50, None, 60) == pytest.approx(1 / 6)
    assert lr_at(tr, 4, None, 20) == pytest.approx(0.5 * 0.5)  # warm-up 0.5, times 10/20
    want = 0.5 * (1 + math.cos(math.pi * 40 / 80)) * 10 / 60  # decay from reached=30, times 10/60
    assert lr_at(tr, 70, 30, 60) == pytest.approx(want)
    assert lr_at(plain, 70, 30, 60) == pytest.approx(0.5 * (1 + math.cos(math.pi * 40 / 80)))
    assert lr_at(tr, 70, 30) == lr_at(plain, 70, 30)  # no length given: no factor


def test_lr_length_changes_the_run_id_only_when_set():
    base = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"))
    scaled = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"), train=TrainSpec(lr_length=10))
    assert base.run_id == RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn"),
                                  train=TrainSpec(lr_length=None)).run_id != scaled.run_id
    assert '"lr_length":10' in scaled.canonical_json() and "lr_length" not in base.canonical_json()
    with pytest.raises(ValueError):
        TrainSpec(lr_length=0)


def test_training_uses_the_length_scaled_rate(used_lrs):
    """The optimiser's rate at every step is lr_at of that step's batch length: recomputed
    here from the recorded lengths (hold at lr, times lr_length / L once L > lr_length)."""
    used = used_lrs
    cur = CurriculumSpec(min_length=2, max_length=12, advance_at=0.01, growth=0.5)  # grows every step
    train = TrainSpec(steps=30, batch_size=4, lr=1e-2, warmup_steps=1, curriculum=cur, lr_length=3)
    spec = RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn", hidden=8), train=train)
    res = train_tracker(spec, torch.device("cpu"))
    reached = res.lengths.index(12)
    assert set(res.lengths[:reached]) == {2, 3, 4, 6, 9}
    expect = [1e-2 * (3 / L if L > 3 else 1) if s < reached else
              0.5e-2 * (1 + math.cos(math.pi * (s - reached) / (30 - reached))) * 3 / 12
              for s, L in enumerate(res.lengths)]
    np.testing.assert_allclose(used, expect, rtol=1e-12, atol=0)
