"""Stated size limits are checked before anything is built: group order and points,
lengths, sample counts, batches, widths and the state block of one batch."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dynlab.groups as groups_mod
from dynlab.config import (
    MAX_BATCH,
    MAX_EVAL_LENGTHS,
    MAX_LENGTH,
    MAX_SAMPLES,
    MAX_STATE_BYTES,
    MAX_STEPS,
    MAX_WIDTH,
    CurriculumSpec,
    EvalSpec,
    ModelSpec,
    RunSpec,
    TaskSpec,
    TrainSpec,
)
from dynlab.groups import MAX_DEGREE, MAX_ORDER, get_group, group_order


@pytest.fixture
def nothing_built(monkeypatch):
    """Fail the test if any group is built (the closure of its generators)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a group was built before its size was checked")

    monkeypatch.setattr(groups_mod, "from_generators", refuse)
    get_group.cache_clear()
    yield
    get_group.cache_clear()


@pytest.mark.parametrize(
    "name, limit",
    [
        ("C100000", f"order ≤ {MAX_ORDER}"),
        ("C1000000", f"order ≤ {MAX_ORDER}"),
        ("C" + "9" * 40, f"order ≤ {MAX_ORDER}"),
        ("S8", f"order ≤ {MAX_ORDER}"),
        ("S1000000", f"order ≤ {MAX_ORDER}"),
        ("A9xC2", f"order ≤ {MAX_ORDER}"),
        ("D2521", f"order ≤ {MAX_ORDER}"),
        ("C71xC72", f"order ≤ {MAX_ORDER}"),
        ("C513", f"at most {MAX_DEGREE} points"),
        ("C2xC511", f"at most {MAX_DEGREE} points"),
    ],
)
def test_too_large_groups_are_refused_from_the_name_naming_the_limit(nothing_built, name, limit):
    with pytest.raises(ValueError, match="too large") as info:
        get_group(name)
    assert limit in str(info.value) and name in str(info.value)
    with pytest.raises(ValueError, match="too large"):
        group_order(name)


def test_group_order_from_the_name_matches_the_built_group():
    for name in ["C1", "C7", "D5", "S4", "A5", "C2xS3", "C3xC3xC2", "S7", "C512", "D256"]:
        expected = {"S7": math.factorial(7), "A5": 60, "S4": 24, "D5": 10, "C2xS3": 12, "C3xC3xC2": 18}
        assert group_order(name) == get_group(name).order == expected.get(name, get_group(name).order)
    assert get_group("C512").order == 512 and get_group("S7").order == MAX_ORDER


@pytest.mark.parametrize("name", ["S5", "D6", "C2xS3", "C4xC3", "A4xC2"])
def test_cayley_table_is_composition_of_the_element_permutations(name):
    """The table built from generator rows equals composing every pair (a·b)(p) = a(b(p))."""
    g = get_group(name)
    index = {e: i for i, e in enumerate(g.elements)}
    composed = np.array([[index[tuple(a[b[p]] for p in range(g.degree))] for b in g.elements] for a in g.elements])
    np.testing.assert_array_equal(g.table, composed)
    assert list(g.elements) == sorted(g.elements)  # identity first, then lexicographic
    for a, b in itertools.product(range(g.order), repeat=2):
        assert g.table[a, g.table[b, g.inverse[b]]] == a


FIELDS = [
    (lambda: CurriculumSpec(max_length=MAX_LENGTH + 1), "max_length"),
    (lambda: CurriculumSpec(min_length=MAX_LENGTH + 1, max_length=MAX_LENGTH), "min_length"),
    (lambda: TrainSpec(steps=MAX_STEPS + 1), "steps"),
    (lambda: TrainSpec(batch_size=MAX_BATCH + 1), "batch_size"),
    (lambda: TrainSpec(warmup_steps=MAX_STEPS + 1), "warmup_steps"),
    (lambda: EvalSpec(n_samples=MAX_SAMPLES + 1), "n_samples"),
    (lambda: EvalSpec(batch_size=MAX_BATCH + 1), "batch_size"),
    (lambda: EvalSpec(chunk=MAX_LENGTH + 1), "chunk"),
    (lambda: EvalSpec(lengths=(10, MAX_LENGTH + 1)), f"at most {MAX_LENGTH}"),
    (lambda: EvalSpec(lengths=tuple(range(1, MAX_EVAL_LENGTHS + 2))), f"at most {MAX_EVAL_LENGTHS} lengths"),
    (lambda: ModelSpec(arch="tanh-rnn", hidden=MAX_WIDTH + 1), "hidden"),
    (lambda: ModelSpec(arch="tanh-rnn", d_embed=MAX_WIDTH + 1), "d_embed"),
]


@pytest.mark.parametrize("make, field", FIELDS, ids=[f for _, f in FIELDS])
def test_each_size_field_has_a_stated_limit(make, field):
    with pytest.raises(ValueError) as info:
        make()
    assert field in str(info.value)


def test_limits_leave_the_presets_alone():
    from dynlab.studies import STUDIES
    from dynlab.study import StudyOptions

    for study in STUDIES.values():
        for preset in study.presets:
            assert study.make_specs(StudyOptions(preset=preset))


def test_a_batch_whose_states_exceed_the_memory_limit_is_refused():
    """Each field within its limit, the product not: B × L × H × N × layers × 4 bytes."""
    model = ModelSpec(arch="mamba", hidden=4096, d_state=64, layers=2)
    train = TrainSpec(batch_size=1024, curriculum=CurriculumSpec(max_length=1000))
    need = 1024 * 1000 * 4096 * 64 * 2 * 4
    assert need > MAX_STATE_BYTES
    with pytest.raises(ValueError, match=r"train.batch_size × train.curriculum.max_length .* GiB of states") as info:
        RunSpec(task=TaskSpec(group="C2"), model=model, train=train)
    assert f"{need / 2**30:.1f} GiB" in str(info.value) and f"at most {MAX_STATE_BYTES // 2**30} GiB" in str(info.value)
    evals = EvalSpec(batch_size=MAX_BATCH, chunk=MAX_LENGTH, lengths=(MAX_LENGTH,))
    with pytest.raises(ValueError, match="eval.batch_size × eval.chunk"):
        RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn"), eval=evals)
    RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=128), train=TrainSpec(batch_size=256))
