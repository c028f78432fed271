"""What every run spec shares: the frozen, hashed spec base and the stated size limits.

Every spec is a pydantic model with ``frozen=True`` and ``extra="forbid"``: an unknown
field or a bad value is refused at construction with a message naming the field.
:meth:`Spec.spec_hash` hashes the canonical JSON of the spec (sorted keys, its class
name and :data:`SPEC_VERSION`), so two equal specs always share a run folder and a
changed field never reuses a stale run.  The hash reads the class *name*, not its
module: a spec class moved to another module keeps every run id.  The specs of the two
papers subclass :class:`Spec`: :mod:`dynlab.tracking.spec` (word problems) and
:mod:`dynlab.lm.spec` (language models).
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dynlab.errors import DynlabInputError, format_validation_error

__all__ = [
    "SPEC_VERSION",
    "Spec",
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
    "check_limit",
    "check_state_bytes",
    "MAX_BATCH",
    "MAX_ENSEMBLE",
    "MAX_EVAL_LENGTHS",
    "MAX_LENGTH",
    "MAX_EVAL_TOKENS",
    "MAX_SAMPLES",
    "MAX_SEED",
    "MAX_LM_MEMORY_BYTES",
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
#: Longest LM evaluation from the zero state (streamed in chunks, so its memory does not
#: grow with it): 2**20 tokens, beyond paper B's 128K.
MAX_EVAL_LENGTH = 2**20
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
#: Most memory an LM may need, in bytes, for each of: its weights with gradients and AdamW
#: moments, a training step (a stack's members together) and an evaluation, as estimated by
#: :mod:`dynlab.lm.train.memory` (an upper bound, within 4 times the measured peak): one 80 GB
#: accelerator's.  Above it the run could not be held by any single device it is made for;
#: the ``paper`` presets (GPU scale) stay below it.
MAX_LM_MEMORY_BYTES = 80 * 2**30
#: Most models trained together in one ensemble (``dynlab bench train --ensembles``).
MAX_ENSEMBLE = 1024
#: Most tokens one LM evaluation streams: validation windows × evaluation length (the
#: streamed windows are read chunk by chunk; the bound keeps one evaluation's compute in reach).
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

    @classmethod
    def check_work_item(cls, specs: list[Spec]) -> None:
        """Refuse, before anything is written, specs that one work item runs at once (a
        study's :meth:`~dynlab.runner.protocol.Study.work_items`: a stack, an ensemble) when together
        they cannot run: one line of bad input.  No check here; a spec class with one says
        it (:meth:`dynlab.lm.spec.LMRunSpec.check_work_item`: a stack's memory)."""

    def canonical_json(self) -> str:
        return json.dumps(
            {"spec": type(self).__name__, "version": SPEC_VERSION, "fields": self.hashed_fields()},
            sort_keys=True,
            separators=(",", ":"),
        )

    def spec_hash(self) -> str:
        """16 hex digits of SHA-256 over :meth:`canonical_json` — the run id."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]


def load_spec(data: dict[str, Any] | str, cls: type[Spec]) -> Spec:
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
