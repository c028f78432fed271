"""Stated size limits are checked before anything is built: group order and points,
lengths, sample counts, batches, widths and the state block of one batch."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import dynlab.tracking.groups as groups_mod
from dynlab.spec import (
    MAX_BATCH,
    MAX_EVAL_LENGTH,
    MAX_EVAL_LENGTHS,
    MAX_LENGTH,
    MAX_SAMPLES,
    MAX_STATE_BYTES,
    MAX_STEPS,
    MAX_WIDTH,
)
from dynlab.tracking.spec import CurriculumSpec, EvalSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.tracking.groups import MAX_DEGREE, MAX_ORDER, get_group, group_order


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
    from dynlab.runner.protocol import StudyOptions

    for study in STUDIES.values():
        for preset in study.presets:
            if preset == "pretrained":  # needs a checkpoint: tests/studies/test_pretrained_preset.py
                continue
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


# -- the bounded field types and helpers of dynlab.spec, and where they are applied ----------
from pydantic import BaseModel, ValidationError  # noqa: E402

from dynlab.tracking.selection import MAX_ANALYSIS_ORDER  # noqa: E402

from dynlab.spec import (  # noqa: E402
    MAX_ENSEMBLE,
    Batch,
    EnsembleSize,
    Length,
    Lengths,
    Samples,
    Steps,
    StepsOrZero,
    Width,
    check_limit,
    check_state_bytes,
)
from dynlab.errors import DynlabInputError  # noqa: E402


class _Sizes(BaseModel):
    length: Length = 10
    lengths: Lengths = (10, 20)
    batch: Batch = 16
    samples: Samples = 64
    steps: Steps = 600
    steps0: StepsOrZero = 0
    width: Width = 64
    ensemble: EnsembleSize = 16


@pytest.mark.parametrize("field, limit", [("length", MAX_LENGTH), ("batch", MAX_BATCH), ("samples", MAX_SAMPLES),
                                          ("steps", MAX_STEPS), ("steps0", MAX_STEPS), ("width", MAX_WIDTH),
                                          ("ensemble", MAX_ENSEMBLE)])
def test_each_bounded_type_takes_its_limit_and_refuses_one_more_naming_it(field, limit):
    assert getattr(_Sizes(**{field: limit}), field) == limit
    with pytest.raises(ValidationError) as info:
        _Sizes(**{field: limit + 1})
    assert field in str(info.value) and f"{limit}" in str(info.value).replace("_", "")
    low = 0 if field == "steps0" else 1
    assert getattr(_Sizes(**{field: low}), field) == low
    with pytest.raises(ValidationError):
        _Sizes(**{field: low - 1})


def test_lengths_are_bounded_each_and_in_number():
    assert _Sizes(lengths=(1, MAX_LENGTH)).lengths == (1, MAX_LENGTH)
    for bad in ((10, MAX_LENGTH + 1), (), tuple(range(1, MAX_EVAL_LENGTHS + 2)), (0,)):
        with pytest.raises(ValidationError, match="lengths"):
            _Sizes(lengths=bad)


def test_check_limit_and_check_state_bytes_are_one_line_input_errors():
    assert check_limit("hidden", 8, 16) == 8
    for bad in (17, 0, 2.5, True, "8"):
        with pytest.raises(DynlabInputError, match=r"^hidden=.*; allowed: an integer from 1 to 16$"):
            check_limit("hidden", bad, 16)
    assert check_state_bytes("b × t × s", 2, 3, 4) == 24
    with pytest.raises(DynlabInputError, match=r"^b × t × s = 16.0 GiB of states per batch; allowed: at most 8 GiB"):
        check_state_bytes("b × t × s", 2**20, 2**12, 4)


@pytest.fixture
def no_benchmark(monkeypatch):
    """Fail the test if a benchmark starts measuring anything."""
    import dynlab.bench.machine
    import dynlab.bench.trackers

    def refuse(*args, **kwargs):
        raise AssertionError("the benchmark ran before its options were checked")

    # patched where they are called: the machine's probes in machine.py, the trainings in trackers.py
    for module, name in ((dynlab.bench.machine, "gemm_rate"), (dynlab.bench.machine, "memory_bandwidth"),
                         (dynlab.bench.trackers, "train_tracker"), (dynlab.bench.trackers, "train_ensemble"),
                         (dynlab.bench.trackers, "time_baseline")):
        monkeypatch.setattr(module, name, refuse)


@pytest.mark.parametrize("kwargs, what", [
    (dict(hidden=1_000_000), f"hidden (--hidden)=1000000; allowed: an integer from 1 to {MAX_WIDTH}"),
    (dict(batch=MAX_BATCH + 1), f"from 1 to {MAX_BATCH}"),
    (dict(length=MAX_LENGTH + 1), f"from 1 to {MAX_LENGTH}"),
    (dict(ensembles=(16, 10_000_000)), f"ensemble size (--ensembles)=10000000; allowed: an integer from 1 to {MAX_ENSEMBLE}"),
    (dict(ensembles=(0,)), "ensemble size"),
    (dict(steps=MAX_STEPS + 1), f"from 1 to {MAX_STEPS}"),
    (dict(steps=2, warmup=2), "warmup=2"),
    (dict(repeats=0), "repeats"),
    (dict(hidden=8192, batch=65536, length=100_000), "GiB of states per batch"),
])
def test_bench_sizes_are_refused_before_anything_runs(no_benchmark, kwargs, what):
    from dynlab.bench import bench_train

    with pytest.raises(DynlabInputError) as info:
        bench_train("tanh-rnn", **kwargs)
    assert what in str(info.value) and "\n" not in str(info.value)


def _read_only_folder(tmp_path):
    """A folder this process cannot write in: a read-only tmpfs as root, else mode 0555."""
    import os
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() == 0:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                          capture_output=True).returncode:
            pytest.skip("a read-only folder needs a mount as root")
        return folder, lambda: subprocess.run(["umount", str(folder)], capture_output=True)
    folder.chmod(0o555)
    return folder, lambda: folder.chmod(0o755)


def test_bench_json_path_is_refused_before_anything_runs(no_benchmark, tmp_path):
    from dynlab.bench import bench_train, check_json_path, write_json

    for bad, why in ((tmp_path, "is a folder"), (tmp_path / "no" / "b.json", "does not exist")):
        with pytest.raises(DynlabInputError, match=why):
            bench_train("tanh-rnn", json_out=bad)
    folder, undo = _read_only_folder(tmp_path)
    try:
        with pytest.raises(DynlabInputError, match="not writable"):
            bench_train("tanh-rnn", json_out=folder / "b.json")
        with pytest.raises(DynlabInputError, match="not writable"):
            write_json([], folder / "b.json")
    finally:
        undo()
    assert check_json_path(tmp_path / "b.json") == tmp_path / "b.json" and not (tmp_path / "b.json").exists()
    write_json([], tmp_path / "b.json")
    assert (tmp_path / "b.json").read_text().startswith("{")


@pytest.mark.slow
def test_a_group_too_large_for_the_analyses_is_refused_before_anything_is_written(tmp_path):
    """S7 trains (order 5040 ≤ MAX_ORDER) but its analyses would not fit: refused up front,
    naming the limit, unless the study runs without analyses."""
    from dynlab.tracking.analysis.spec import AnalysisSpec
    from dynlab.tracking.analysis.pipeline import analyze_tracker
    from dynlab.runner.driver import run_study
    from dynlab.studies import get_study
    from dynlab.runner.protocol import StudyOptions
    from dynlab.tracking.task import WordProblem

    study = get_study("group-tracking")
    options = StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("S7",)})
    with pytest.raises(DynlabInputError, match=rf"group S7 \(order 5040\) .* at most {MAX_ANALYSIS_ORDER}") as info:
        run_study(study, options, out=tmp_path / "out", device="cpu")
    assert "--no-analysis" in str(info.value) and not (tmp_path / "out").exists()
    assert group_order("A5xC2") <= MAX_ANALYSIS_ORDER < group_order("S6")  # S5, A5, C256 are analysed
    with pytest.raises(DynlabInputError, match="too large for the error-control analysis"):
        analyze_tracker(None, WordProblem(get_group("S7")), AnalysisSpec(), horizon=10, t_ref=5)


def test_lm_specs_refuse_sizes_beyond_the_stated_limits():
    """Every LM size field is bounded by dynlab.spec's limits, in the Python API as on the command line."""
    from pydantic import ValidationError

    from dynlab.spec import MAX_BATCH, MAX_LENGTH, MAX_STEPS
    from dynlab.lm.spec import LMEvalSpec, LMRunSpec, LMTaskSpec, LMTrainSpec, TaskTrainSpec

    with pytest.raises(ValidationError, match="less than or equal to 65536"):
        LMTrainSpec(batch_size=MAX_BATCH + 1)
    with pytest.raises(ValidationError, match="less than or equal to 10000000"):
        TaskTrainSpec(steps=MAX_STEPS + 1)
    with pytest.raises(ValidationError, match="less than or equal to 100000"):
        LMTaskSpec(kind="copying", train_min=1, train_max=2, eval_lengths=(MAX_LENGTH + 1,))
    with pytest.raises(ValidationError, match="samples of"):
        LMTaskSpec(kind="copying", train_min=1, train_max=2, eval_lengths=(60_000,))
    with pytest.raises(ValidationError, match="evaluation length"):
        LMRunSpec(train=LMTrainSpec(seq_len=50_000), eval=LMEvalSpec(length_multiple=32))


@pytest.mark.parametrize("argv, line", [
    (["lm", "post-train", "--checkpoint", "{run}", "--seq-len", "16", "--eval-multiple", "100000"],
     "error: --eval-multiple 100000 × seq_len 16 = 1600000 tokens is too long; allowed: an evaluation length "
     f"(length_multiple × seq_len) up to {MAX_EVAL_LENGTH}"),
    (["lm", "post-train", "--checkpoint", "{run}", "--samples", str(MAX_SAMPLES)],
     f"error: --samples {MAX_SAMPLES} windows × 256 tokens is too much to evaluate; allowed: at most 16777216 tokens "
     "(here 65536 windows)"),
    (["study", "group-tracking", "--executor", "dask", "--workers", str(10**30)], f"error: --workers {10**30} is out "
     "of range; allowed: 1 to {most} worker processes (this machine's CPU cores, at least 4)"),
    (["study", "copying", "--executor", "dask", "--workers", "100000"], "error: --workers 100000 is out of range; "
     "allowed: 1 to {most} worker processes (this machine's CPU cores, at least 4)"),
], ids=["eval-multiple", "samples", "workers-10**30", "workers-100000"])
def test_every_size_has_its_limit_on_every_path(argv, line, tmp_path, capsys, monkeypatch, data_dir):
    """The evaluation of a post-training (length × windows) and a local cluster's workers
    are bounded, in the command line as in the Python API, before anything starts."""
    import shutil

    import dynlab.executors
    from dynlab.cli import main
    from dynlab.spec import max_local_workers
    from dynlab.lm.spec import check_eval_size

    monkeypatch.setattr(dynlab.executors, "make_executor", lambda *a, **k: pytest.fail("an executor was started"))
    run = tmp_path / "run"
    shutil.copytree(data_dir / "legacy_lm_runs" / "mamba2", run)
    argv = [a.replace("{run}", str(run)) for a in argv]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == line.replace("{most}", str(max_local_workers())) + "\n"
    assert not (tmp_path / "out").exists()
    with pytest.raises(DynlabInputError, match="is too long"):
        check_eval_size(16, 100_000, 1)
    with pytest.raises(DynlabInputError, match="too much to evaluate"):
        check_eval_size(64, 16, MAX_SAMPLES)
    with pytest.raises(DynlabInputError, match="--workers|workers"):
        dynlab.executors.DaskExecutor(workers=100_000)
