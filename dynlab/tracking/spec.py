"""Paper A's run spec: a tracker trained on a group word problem, and its evaluation.

:class:`RunSpec` is one run (task, model, training with its curriculum, evaluation); its
hash is the run id (:meth:`dynlab.spec.Spec.spec_hash`).  Sizes are checked against the
limits of :mod:`dynlab.spec` when a spec is made, before anything is built.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from dynlab.spec import (
    MAX_BATCH,
    MAX_EVAL_LENGTHS,
    MAX_LENGTH,
    MAX_SAMPLES,
    MAX_STEPS,
    MAX_WIDTH,
    Seed,
    Spec,
    Width,
    check_state_bytes,
)

__all__ = ["CurriculumSpec", "EvalSpec", "ModelSpec", "RunSpec", "TaskSpec", "TrainSpec"]


class TaskSpec(Spec):
    """A group word problem (docs/error-control.md): tokens are group elements, labels running products."""

    kind: Literal["word-problem"] = "word-problem"
    group: str = Field(description="group name, e.g. C2, C6, S3, A5, C2xS3")

    @field_validator("group")
    @classmethod
    def _known_group(cls, v: str) -> str:
        from dynlab.tracking.groups import group_name

        return group_name(v)  # from the name: a spec of S7 is made without building S7


class ModelSpec(Spec):
    """A tracker: ``layers`` cells of ``arch`` with width ``hidden`` and a readout."""

    arch: str
    hidden: Width = 64
    layers: int = Field(1, ge=1, le=16)
    nonlinearity: str | None = None
    d_embed: int | None = Field(None, ge=1, le=MAX_WIDTH)
    d_state: int = Field(4, ge=1, le=256)
    readout: Literal["linear", "mlp"] = "linear"

    @field_validator("arch")
    @classmethod
    def _known_arch(cls, v: str) -> str:
        from dynlab.tracking.models import get_cell

        get_cell(v)
        return v

    @field_validator("nonlinearity")
    @classmethod
    def _known_phi(cls, v: str | None) -> str | None:
        from dynlab.tracking.models import NONLINEARITIES

        if v is not None and v not in NONLINEARITIES:
            raise ValueError(f"unknown nonlinearity {v!r}; allowed: {', '.join(NONLINEARITIES)}")
        return v


class CurriculumSpec(Spec):
    """Length curriculum up to ``max_length`` (paper: 60); the loss is on every position.

    ``mode="adaptive"`` (default): batches start at ``min_length``; whenever a batch's
    per-token accuracy reaches ``advance_at``, the length grows to
    ``L + max(1, floor(L·growth))``, capped at ``max_length``.  The engine records the
    length reached, so a run that never reaches ``max_length`` is visible (its status is
    ``not-learned``).  Why 0.95 and not 0.99: the loss covers every position, so a batch at
    0.95 per-token accuracy reads almost every prefix; demanding 0.99 stalled models that
    can represent the group at short lengths (tanh-rnn on C6 stopped at length 8 with 0.97
    per-token accuracy in 5 of 5 seeds of the quick preset, and on S3 in 3 of 5) because the
    cosine schedule had decayed the learning rate before the last 2 % was squeezed out.
    ``mode="linear"``: L(step) grows linearly from ``min_length`` to ``max_length`` over
    the first ``ramp_fraction`` of the steps, then stays at ``max_length``.
    """

    mode: Literal["adaptive", "linear"] = "adaptive"
    min_length: int = Field(2, ge=1, le=MAX_LENGTH)
    max_length: int = Field(60, ge=1, le=MAX_LENGTH)
    advance_at: float = Field(0.95, gt=0.0, le=1.0)
    growth: float = Field(0.25, gt=0.0)
    ramp_fraction: float = Field(0.5, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> CurriculumSpec:
        if self.min_length > self.max_length:
            raise ValueError(f"curriculum min_length={self.min_length} exceeds max_length={self.max_length}")
        return self

    def next_length(self, length: int, step: int, total_steps: int, batch_accuracy: float) -> int:
        """Length of the batch after ``step`` (which had ``length`` and ``batch_accuracy``)."""
        if self.mode == "linear":
            ramp = self.ramp_fraction * total_steps
            if ramp <= 0 or step + 1 >= ramp:
                return self.max_length
            frac = (step + 1) / ramp
            return int(round(self.min_length + frac * (self.max_length - self.min_length)))
        if batch_accuracy >= self.advance_at:
            return min(self.max_length, length + max(1, int(length * self.growth)))
        return length

    def first_length(self, total_steps: int) -> int:
        if self.mode == "linear" and self.ramp_fraction * total_steps <= 0:
            return self.max_length
        return self.min_length


class TrainSpec(Spec):
    """Optimisation: AdamW with linear warm-up then cosine decay, gradient clipping.

    ``schedule="curriculum"`` (default): after the warm-up the learning rate stays at ``lr``
    until the curriculum first reaches its ``max_length``; the cosine decay to 0 then runs
    over the remaining steps.  ``schedule="cosine"``: the decay runs from the end of the
    warm-up to ``steps`` whatever the curriculum does.  Why the default: with a fixed
    cosine a run still climbing the curriculum late meets a learning rate already near 0
    and stalls at a short length (see :class:`CurriculumSpec`); holding the rate until the
    training length is reached spends the decay where it helps, on the full length.

    ``tail_steps`` (None: train all ``steps``): stop ``tail_steps`` steps after the
    curriculum first reaches its ``max_length``; ``steps`` is then a cap, spent in full
    only by a run whose curriculum never completes, and the cosine decay runs over the
    tail (``schedule="curriculum"`` only).  A run that completes its curriculum early
    stops early instead of training the rest of the cap at the full length
    (:func:`dynlab.tracking.train.budget.group_budget` sets it for groups larger than order 6).
    Left out of the run id while None (:attr:`Spec.hash_omit_at_default`).

    ``lr_length`` (None: off): while the batch's curriculum length L exceeds ``lr_length``,
    the learning rate of the step (warm-up, hold or decay as above) is multiplied by
    ``lr_length / L``.  Why: a change of the recurrent weights moves the state at position
    L about L times as much as at position 1, so the same rate that learns the short
    lengths throws a model that has just passed length 22–27 out of its solution (S4 at
    width 128, lr 3e-3: the loss climbed from 0.6 to 2.6 within 150 steps of reaching
    length 27 and the curriculum never moved again); scaling the rate as 1/L keeps the
    per-step change of the long-range state about constant.
    (:func:`dynlab.tracking.train.budget.group_budget` sets it for groups larger than order 12.)
    Left out of the run id while None.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("tail_steps", "lr_length")

    steps: int = Field(600, ge=1, le=MAX_STEPS)
    batch_size: int = Field(128, ge=1, le=MAX_BATCH)
    lr: float = Field(3e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(20, ge=0, le=MAX_STEPS)
    clip: float = Field(1.0, gt=0)
    schedule: Literal["curriculum", "cosine"] = "curriculum"
    curriculum: CurriculumSpec = CurriculumSpec()
    tail_steps: int | None = Field(None, ge=1, le=MAX_STEPS)
    lr_length: int | None = Field(None, ge=1, le=MAX_LENGTH)

    @model_validator(mode="after")
    def _tail_needs_curriculum(self) -> TrainSpec:
        if self.tail_steps is not None and self.schedule != "curriculum":
            raise ValueError(f"tail_steps={self.tail_steps} needs schedule='curriculum', got {self.schedule!r}; "
                             "allowed: tail_steps=None with schedule='cosine'")
        return self

    def end_step(self, reached: int | None) -> int:
        """The step this run stops before: ``steps``, or ``min(steps, reached + tail_steps)``
        once the curriculum first reached its ``max_length`` at step ``reached``."""
        if self.tail_steps is None or reached is None:
            return self.steps
        return min(self.steps, reached + self.tail_steps)


class EvalSpec(Spec):
    """Length extrapolation: accuracy at ``lengths`` from ``n_samples`` fresh sequences.

    ``threshold`` is the accuracy a length must reach to count as passed in the max-pass
    length mp.  Accuracy is also recorded at every length up to ``max(lengths)``; the
    dense mp pools it over a window of ±``mp_window``·L lengths against sampling noise
    (:func:`dynlab.tracking.evaluate.max_pass_length_dense`).  Sequences are streamed in
    ``chunk``-step pieces with the recurrent state carried, so memory does not grow with
    length.
    """

    lengths: tuple[int, ...] = (10, 20, 40, 60, 100, 200, 300, 500, 700, 1000)
    n_samples: int = Field(256, ge=1, le=MAX_SAMPLES)
    batch_size: int = Field(256, ge=1, le=MAX_BATCH)
    chunk: int = Field(250, ge=1, le=MAX_LENGTH)
    threshold: float = Field(0.9, gt=0, le=1)
    mp_window: float = Field(0.05, ge=0, lt=1)
    seed_offset: int = 10_000

    @field_validator("lengths")
    @classmethod
    def _sorted_positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(int(x) < 1 for x in v):
            raise ValueError(f"lengths must be positive integers, got {list(v)}")
        if len(v) > MAX_EVAL_LENGTHS or any(int(x) > MAX_LENGTH for x in v):
            raise ValueError(
                f"lengths: at most {MAX_EVAL_LENGTHS} lengths of at most {MAX_LENGTH}; got {len(v)} up to {max(int(x) for x in v)}"
            )
        return tuple(sorted(set(int(x) for x in v)))


class RunSpec(Spec):
    """Everything that determines one trained model and its evaluation."""

    task: TaskSpec
    model: ModelSpec
    train: TrainSpec = TrainSpec()
    eval: EvalSpec = EvalSpec()
    seed: Seed = 0

    @model_validator(mode="after")
    def _fits(self) -> RunSpec:
        """Refuse a run whose state block would exceed :data:`~dynlab.spec.MAX_STATE_BYTES`."""
        per_step = self.model.hidden * self.model.d_state * self.model.layers * 4  # bytes per sequence step
        for what, batch, steps in (
            ("train.batch_size × train.curriculum.max_length", self.train.batch_size, self.train.curriculum.max_length),
            ("eval.batch_size × eval.chunk", self.eval.batch_size, min(self.eval.chunk, max(self.eval.lengths))),
        ):
            check_state_bytes(f"{what} × hidden × d_state × layers × 4 bytes", batch, steps, per_step)
        return self

    @property
    def run_id(self) -> str:
        return self.spec_hash()
