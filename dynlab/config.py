"""Frozen, typed run specifications.  The hash of a full spec is the run id and cache key.

Every spec is a pydantic model with ``frozen=True`` and ``extra="forbid"``: an unknown
field or a bad value is refused at construction with a message naming the field.
:meth:`Spec.spec_hash` hashes the canonical JSON of the spec (sorted keys, its class
name and :data:`SPEC_VERSION`), so two equal specs always share a run folder and a
changed field never reuses a stale run.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dynlab.errors import DynlabInputError, format_validation_error

__all__ = [
    "CurriculumSpec",
    "EvalSpec",
    "ModelSpec",
    "RunSpec",
    "SPEC_VERSION",
    "Spec",
    "TaskSpec",
    "TrainSpec",
    "format_validation_error",
    "load_spec",
    "Batch",
    "EnsembleSize",
    "Length",
    "Lengths",
    "Samples",
    "Seed",
    "Steps",
    "StepsOrZero",
    "Width",
    "check_analysable",
    "check_limit",
    "check_state_bytes",
    "MAX_ANALYSIS_ORDER",
    "MAX_BATCH",
    "MAX_ENSEMBLE",
    "MAX_EVAL_LENGTHS",
    "MAX_LENGTH",
    "MAX_EVAL_TOKENS",
    "MAX_SAMPLES",
    "MAX_SEED",
    "MAX_STATE_BYTES",
    "MAX_STEPS",
    "MAX_WIDTH",
    "MAX_WORKERS",
    "max_local_workers",
]

#: Bumped when the meaning of a field changes, so old run folders are not reused.
SPEC_VERSION = 1

# Stated limits, checked when a spec is made, before anything is built or written.
#: Longest sequence: curriculum lengths, evaluation lengths and chunks.
MAX_LENGTH = 100_000
#: Most evaluation sequences per run.
MAX_SAMPLES = 1_048_576
#: Largest batch (training and evaluation).
MAX_BATCH = 65_536
#: Most training steps (and warm-up steps).
MAX_STEPS = 10_000_000
#: Most evaluation lengths per run.
MAX_EVAL_LENGTHS = 1_000
#: Largest width of embeddings (as ``hidden``).
MAX_WIDTH = 8192
#: Largest recurrent-state block one batch may hold, in bytes: batch × steps held ×
#: hidden × d_state × layers × 4 (float32; an upper estimate: dense cells hold hidden, not
#: hidden × d_state, per step).  Training holds ``curriculum.max_length`` steps, evaluation
#: ``min(chunk, max(lengths))``.
MAX_STATE_BYTES = 8 * 2**30
#: Most models trained together in one ensemble (``dynlab bench train --ensembles``).
MAX_ENSEMBLE = 1024
#: Most tokens one LM evaluation streams: validation windows × evaluation length (the
#: windows and their per-position losses are held in memory, 16 bytes a token: 256 MiB).
MAX_EVAL_TOKENS = 2**24
#: Largest seed (a seed must fit a signed 64-bit integer, as torch's generators take it).
MAX_SEED = 2**63 - 1
#: Most worker processes of a local Dask cluster (``--workers``); on a given machine the
#: bound is :func:`max_local_workers`.
MAX_WORKERS = 256


def max_local_workers() -> int:
    """Most worker processes a local Dask cluster may start on this machine: its CPU cores
    (at least 4, at most :data:`MAX_WORKERS`).  Each worker is a Python process with torch
    loaded; more of them than cores only compete for the cores and the memory."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(MAX_WORKERS, max(4, cores))
#: Largest group (order) whose runs get the per-run error-control analyses
#: (:func:`dynlab.analysis.tracking.analyze_tracker`): its per-step work grows as
#: samples × order² and its chunks as samples × steps × order (order 256: about 8 GiB at
#: the paper preset); larger groups train, but are refused the analyses before anything runs.
MAX_ANALYSIS_ORDER = 256


def check_analysable(group: str, study: str) -> None:
    """Refuse the per-run analyses of ``group`` (a group name; its order is read from the
    name, nothing is built) when its order is above :data:`MAX_ANALYSIS_ORDER`: one line
    naming the group, its order, the limit and ``--no-analysis``."""
    from dynlab.groups import group_order

    order = group_order(group)
    if order > MAX_ANALYSIS_ORDER:
        raise DynlabInputError(
            f"group {group} (order {order}) is too large for the per-run analyses of study {study}; "
            f"allowed: groups of order at most {MAX_ANALYSIS_ORDER} (dynlab.config.MAX_ANALYSIS_ORDER), "
            "or the study without analyses (--no-analysis)"
        )

# Bounded field types of the limits above, for every spec (``steps: Steps = 600``): a value
# outside is refused when the spec is made, with a message naming the bound.
#: A sequence length (training, evaluation, chunk): 1 … :data:`MAX_LENGTH`.
Length = Annotated[int, Field(ge=1, le=MAX_LENGTH)]
#: Evaluation lengths: 1 … :data:`MAX_EVAL_LENGTHS` of them, each a :data:`Length`.
Lengths = Annotated[tuple[Length, ...], Field(min_length=1, max_length=MAX_EVAL_LENGTHS)]
#: A batch size: 1 … :data:`MAX_BATCH`.
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]
#: A number of evaluation sequences: 1 … :data:`MAX_SAMPLES`.
Samples = Annotated[int, Field(ge=1, le=MAX_SAMPLES)]
#: A number of training steps: 1 … :data:`MAX_STEPS`.
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
#: A number of training steps where none is allowed: 0 … :data:`MAX_STEPS`.
StepsOrZero = Annotated[int, Field(ge=0, le=MAX_STEPS)]
#: A width (hidden size, embedding, model width): 1 … :data:`MAX_WIDTH`.
Width = Annotated[int, Field(ge=1, le=MAX_WIDTH)]
#: Models in one ensemble: 1 … :data:`MAX_ENSEMBLE`.
EnsembleSize = Annotated[int, Field(ge=1, le=MAX_ENSEMBLE)]
#: A seed: 0 … :data:`MAX_SEED`.
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


def check_limit(what: str, value: int, limit: int, lowest: int = 1) -> int:
    """``value`` when ``lowest <= value <= limit``; else a one-line
    :class:`~dynlab.errors.DynlabInputError` naming ``what``, the value and the allowed range
    (for limits checked outside a spec, e.g. a benchmark's sizes)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= limit:
        raise DynlabInputError(f"{what}={value!r}; allowed: an integer from {lowest} to {limit}")
    return value


def check_state_bytes(what: str, batch: int, steps: int, per_step_bytes: int, limit: int = MAX_STATE_BYTES) -> int:
    """The bytes of the recurrent states one batch holds, ``batch × steps ×
    per_step_bytes`` (``per_step_bytes``: bytes of one sequence's state per step, e.g.
    hidden × d_state × layers × 4 in float32), when at most ``limit``
    (:data:`MAX_STATE_BYTES`); else a ``ValueError`` (a pydantic validator turns it into
    a validation error; it is a :class:`~dynlab.errors.DynlabInputError`) naming ``what``,
    the product (e.g. ``"train.batch_size × train.seq_len × d_model × layers × 4 bytes"``),
    and the limit."""
    need = int(batch) * int(steps) * int(per_step_bytes)
    if need > limit:
        raise DynlabInputError(
            f"{what} = {need / 2**30:.1f} GiB of states per batch; "
            f"allowed: at most {limit / 2**30:.0f} GiB (lower the batch, length or width)"
        )
    return need


class Spec(BaseModel):
    """Base of every dynlab spec: frozen, strict about unknown fields, hashable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Fields added after :data:`SPEC_VERSION` 1 that the canonical JSON (hence the run id)
    #: leaves out while they hold their default, the value that means what the spec meant
    #: before the field existed: every run id made before it stays the same.
    hash_omit_at_default: ClassVar[tuple[str, ...]] = ()

    def hashed_fields(self) -> dict[str, Any]:
        """The fields :meth:`canonical_json` writes: ``model_dump(mode="json")`` without the
        :attr:`hash_omit_at_default` fields that hold their default, in nested specs too."""
        out = self.model_dump(mode="json")
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if name in self.hash_omit_at_default and value == field.default:
                del out[name]
            elif isinstance(value, Spec):
                out[name] = value.hashed_fields()
        return out

    def canonical_json(self) -> str:
        return json.dumps(
            {"spec": type(self).__name__, "version": SPEC_VERSION, "fields": self.hashed_fields()},
            sort_keys=True,
            separators=(",", ":"),
        )

    def spec_hash(self) -> str:
        """16 hex digits of SHA-256 over :meth:`canonical_json` — the run id."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]


class TaskSpec(Spec):
    """A group word problem (docs/error-control.md): tokens are group elements, labels running products."""

    kind: Literal["word-problem"] = "word-problem"
    group: str = Field(description="group name, e.g. C2, C6, S3, A5, C2xS3")

    @field_validator("group")
    @classmethod
    def _known_group(cls, v: str) -> str:
        from dynlab.groups import group_name

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
        from dynlab.models import get_cell

        get_cell(v)
        return v

    @field_validator("nonlinearity")
    @classmethod
    def _known_phi(cls, v: str | None) -> str | None:
        from dynlab.models import NONLINEARITIES

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
    (:func:`dynlab.train.budget.group_budget` sets it for groups larger than order 6).
    Left out of the run id while None (:attr:`Spec.hash_omit_at_default`).

    ``lr_length`` (None: off): while the batch's curriculum length L exceeds ``lr_length``,
    the learning rate of the step (warm-up, hold or decay as above) is multiplied by
    ``lr_length / L``.  Why: a change of the recurrent weights moves the state at position
    L about L times as much as at position 1, so the same rate that learns the short
    lengths throws a model that has just passed length 22–27 out of its solution (S4 at
    width 128, lr 3e-3: the loss climbed from 0.6 to 2.6 within 150 steps of reaching
    length 27 and the curriculum never moved again); scaling the rate as 1/L keeps the
    per-step change of the long-range state about constant.
    (:func:`dynlab.train.budget.group_budget` sets it for groups larger than order 12.)
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
    (:func:`dynlab.evaluate.max_pass_length_dense`).  Sequences are streamed in
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
        """Refuse a run whose state block would exceed :data:`MAX_STATE_BYTES`."""
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


def load_spec(data: dict[str, Any] | str, cls: type[Spec] = RunSpec) -> Spec:
    """Parse a spec of class ``cls`` from a dict or JSON text; raise ValueError with one line on failure.

    ``data`` is either the spec's fields or a run folder's ``spec.json`` (the envelope
    ``{"spec": class name, "version": SPEC_VERSION, "fields": {...}}`` that
    :meth:`Spec.canonical_json` writes); an envelope of another spec class or version is refused.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise DynlabInputError(f"invalid {cls.__name__}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise DynlabInputError(f"invalid {cls.__name__}: expected a JSON object, got {type(data).__name__}")
    if set(data) == {"spec", "version", "fields"}:
        if data["spec"] != cls.__name__:
            raise DynlabInputError(f"spec.json holds a {data['spec']!r}, not a {cls.__name__}; allowed: {cls.__name__}")
        if data["version"] != SPEC_VERSION:
            raise DynlabInputError(f"spec.json has version {data['version']!r}; allowed: {SPEC_VERSION}")
        data = data["fields"]
    try:
        # context "stored": a spec read back from disk; a field added later takes the value
        # that its absence meant (e.g. dynlab.lm.spec.LEGACY_MODEL_FIELDS), not its new default
        return cls.model_validate(data, context={"stored": True})
    except ValidationError as exc:
        raise DynlabInputError(f"invalid {cls.__name__}: {format_validation_error(exc)}") from None
