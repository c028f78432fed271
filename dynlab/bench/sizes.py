"""The benchmark's sizes, checked before anything runs (:func:`check_bench_sizes`), and the
run spec of one measured model (:func:`bench_spec`)."""

from __future__ import annotations

from pydantic import ValidationError

from dynlab.errors import DynlabInputError, format_validation_error
from dynlab.spec import MAX_BATCH, MAX_ENSEMBLE, MAX_LENGTH, MAX_STEPS, MAX_WIDTH, check_limit
from dynlab.tracking.models import get_cell
from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec

__all__ = ["MAX_REPEATS", "bench_spec", "check_bench_sizes"]

#: Most rounds over the methods (``--repeats``).
MAX_REPEATS = 100


def bench_spec(arch: str, hidden: int, batch: int, length: int, steps: int, seed: int, group: str) -> RunSpec:
    """The run spec of one model the benchmark trains: every sequence ``length`` tokens long."""
    cur = CurriculumSpec(min_length=length, max_length=length)
    return RunSpec(
        task=TaskSpec(group=group),
        model=ModelSpec(arch=arch, hidden=hidden),
        train=TrainSpec(steps=steps, batch_size=batch, curriculum=cur),
        seed=seed,
    )


def check_bench_sizes(
    arch: str,
    hidden: int,
    batch: int,
    length: int,
    ensembles: tuple[int, ...] = (),
    steps: int = 4,
    warmup: int = 1,
    repeats: int = 1,
) -> None:
    """Refuse sizes outside the stated limits (one line naming the option and the allowed
    range): ``hidden`` ≤ :data:`~dynlab.spec.MAX_WIDTH`, ``batch`` ≤
    :data:`~dynlab.spec.MAX_BATCH`, ``length`` ≤ :data:`~dynlab.spec.MAX_LENGTH`, each
    ensemble size ≤ :data:`~dynlab.spec.MAX_ENSEMBLE`, ``warmup`` < ``steps`` ≤
    :data:`~dynlab.spec.MAX_STEPS`, ``repeats`` ≤ :data:`MAX_REPEATS`, and the states of
    one batch within :data:`~dynlab.spec.MAX_STATE_BYTES` (as :class:`~dynlab.tracking.spec.RunSpec`
    estimates them)."""
    get_cell(arch)
    check_limit("hidden (--hidden)", hidden, MAX_WIDTH)
    check_limit("batch (--batch)", batch, MAX_BATCH)
    check_limit("length (--length)", length, MAX_LENGTH)
    check_limit("steps (--steps)", steps, MAX_STEPS)
    check_limit("repeats (--repeats)", repeats, MAX_REPEATS)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or not 0 <= warmup < steps:
        raise DynlabInputError(f"warmup={warmup!r}; allowed: an integer from 0 to steps - 1 = {steps - 1}")
    for n in ensembles:
        check_limit("ensemble size (--ensembles)", n, MAX_ENSEMBLE)
    try:  # the run spec of the benchmark states the training-state limit (RunSpec)
        bench_spec(arch, hidden, batch, length, steps, 0, "S3")
    except ValidationError as exc:
        raise DynlabInputError(f"bench train: {format_validation_error(exc)}") from None
