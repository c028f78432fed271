"""The spec of one LM run on text (:class:`LMRunSpec`): its data, model and intervention
(:mod:`dynlab.lm.spec.parts`), training, evaluation, post-training arms and pretrained start.

The hash of an :class:`LMRunSpec` is the run id.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynlab.spec import (
    MAX_EVAL_LENGTHS,
    MAX_EVAL_TOKENS,
    MAX_EVAL_LENGTH,
    MAX_LENGTH,
    Batch,
    Length,
    Samples,
    Seed,
    Spec,
    Steps,
    check_limit,
    check_state_bytes,
)
from dynlab.errors import DynlabInputError
from dynlab.runtime import MAX_THREADS
from dynlab.lm.train.memory import check_eval_memory, check_train_memory
from dynlab.names import INTERVENTION_NAMES
from dynlab.lm.spec.parts import (DistanceName, InterventionName, InterventionSpec, LMDataSpec, LMModelSpec, Precision,
                                  check_tokenizer_fits, vocab_from_tokenizer)

__all__ = ["LMEvalSpec", "LMInitSpec", "LMPostSpec", "LMRunSpec", "LMTrainSpec", "check_eval_size"]


class LMTrainSpec(Spec):
    """AdamW with warm-up and cosine decay; ``seq_len`` is the training length T_train.

    ``engine``: ``"loop"`` trains each run alone (:func:`dynlab.lm.train.engine.fit`);
    ``"stack"`` trains the runs of a study that differ only in seed and intervention
    together, as one stack (:func:`dynlab.lm.train.ensemble.fit_ensemble`: the same batches and
    noise per run, the same update to float rounding; a run's numbers then agree to
    rounding, not bit for bit, with its ``loop`` twin). Left out of the run id while ``loop``.

    ``accum``: gradient accumulation (:func:`dynlab.lm.train.engine.fit`): a step reads ``accum``
    batches of ``batch_size`` (``accum × batch_size × seq_len`` tokens a step); loop engine
    only. Left out of the run id while 1.

    ``precision``: ``fp32`` or ``bf16`` (autocast; float32 weights, optimiser state, loss
    and scans: :func:`dynlab.lm.train.engine.fit`); loop engine only. Left out of the run id while
    fp32.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("engine", "accum", "precision")

    steps: Steps = 600
    batch_size: Batch = 16
    seq_len: int = Field(32, ge=2, le=MAX_LENGTH)
    lr: float = Field(3e-3, gt=0.0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0.0, allow_inf_nan=False)
    clip: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="torch CPU threads while training and evaluating (None: RUN_THREADS = 1)")
    engine: Literal["loop", "stack"] = "loop"
    accum: int = Field(1, ge=1, le=4096)
    precision: Precision = "fp32"

    @model_validator(mode="after")
    def _accum_in_loop(self) -> LMTrainSpec:
        if self.accum > 1 and self.engine != "loop":
            raise ValueError(f"accum {self.accum} needs engine 'loop' (a stack trains without accumulation); "
                             "allowed: accum = 1 with engine 'stack'")
        if self.precision != "fp32" and self.engine != "loop":
            raise ValueError(f"precision {self.precision} needs engine 'loop' (a stack trains in float32); "
                             "allowed: precision 'fp32' with engine 'stack'")
        return self


class LMEvalSpec(Spec):
    """Evaluation from the zero state at ``length_multiple × seq_len`` tokens.

    PPL(t) on ``n_samples`` evenly spaced validation windows, streamed in ``chunk_len``
    pieces (states recorded after each piece); Definition 3.2 on ``bin_width``-token bins;
    EffRem_T at T = the evaluation length, for ``effrem_points`` log-spaced t (and t = 0)
    on ``effrem_samples`` windows; state statistics at ``state_points`` log-spaced positions
    from t = 1 to the evaluation length (0: at the chunk ends only).

    ``checkpoints``: training budgets, in multiples of the model's Chinchilla budget
    (:data:`CHINCHILLA_TOKENS_PER_PARAM` tokens per parameter), at which the model is also
    evaluated during its one training run (:func:`dynlab.lm.run.text.checkpoint_steps`); empty:
    only the trained model. Left out of the run id while empty.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("checkpoints",)

    length_multiple: int = Field(16, ge=2, le=MAX_LENGTH)
    n_samples: Samples = 64
    chunk_len: Length = 32
    bin_width: Length = 16
    effrem_points: int = Field(12, ge=1, le=MAX_EVAL_LENGTHS)
    effrem_samples: Samples = 16
    state_points: int = Field(48, ge=0, le=100_000)
    distances: tuple[DistanceName, ...] = ("tv", "js", "cos")
    checkpoints: tuple[float, ...] = ()

    @field_validator("checkpoints")
    @classmethod
    def _budgets(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (0.0 < c <= 1e6) for c in v):
            raise ValueError(f"checkpoints {list(v)} must be training budgets in Chinchilla multiples; "
                             "allowed: numbers in (0, 1e6]")
        if len(v) > MAX_EVAL_LENGTHS:
            raise ValueError(f"{len(v)} checkpoints; allowed: at most {MAX_EVAL_LENGTHS}")
        return tuple(sorted(set(v)))

    @field_validator("distances")
    @classmethod
    def _has_tv(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("distances must name at least one of tv, js, cos")
        return tuple(dict.fromkeys(v))


def check_eval_size(seq_len: int, length_multiple: int, n_samples: int) -> None:
    """Refuse an LM evaluation longer than :data:`~dynlab.spec.MAX_EVAL_LENGTH` tokens
    (``length_multiple × seq_len``) or streaming more than
    :data:`~dynlab.spec.MAX_EVAL_TOKENS` tokens (``n_samples`` windows of that length):
    one line that starts with the field to change."""
    length = length_multiple * seq_len
    if length > MAX_EVAL_LENGTH:
        raise DynlabInputError(f"length_multiple {length_multiple} × seq_len {seq_len} = {length} tokens is too long; "
                               f"allowed: an evaluation length (length_multiple × seq_len) up to {MAX_EVAL_LENGTH}")
    if n_samples * length > MAX_EVAL_TOKENS:
        raise DynlabInputError(f"n_samples {n_samples} windows × {length} tokens is too much to evaluate; allowed: at "
                               f"most {MAX_EVAL_TOKENS} tokens (here {MAX_EVAL_TOKENS // length} windows)")


class LMPostSpec(Spec):
    """Post-training arms of a trained LM (paper B's Fig. 5 protocol).

    After training, the model is post-trained ``steps`` steps once per intervention in
    ``interventions`` from the same trained weights (``zero``, the compute-matched control,
    always included), on the same text batches for every arm (TBTT excepted: it needs
    consecutive chunks); each arm is evaluated as the trained model. AdamW at ``lr`` with
    ``warmup_frac`` warm-up and cosine decay; the training batch size and length.
    """

    interventions: tuple[InterventionName, ...] = INTERVENTION_NAMES
    steps: Steps = 500
    lr: float = Field(1e-3, gt=0.0, le=10.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("interventions")
    @classmethod
    def _with_control(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(("zero", *v)))


class LMInitSpec(Spec):
    """A pretrained starting point: a checkpoint folder (a Hugging Face Mamba / Mamba-2
    folder or a dynlab LM run, :func:`dynlab.lm.hub.checkpoint.load_checkpoint`) and the SHA-256
    of its weight and config files (:func:`dynlab.lm.hub.checkpoint.checkpoint_digest`), so an
    edited checkpoint gives new runs; ``config``: its own layout as recorded (a Hugging Face
    config's summary or a dynlab run's model fields: the run's ``model`` holds only its
    mixer, width, layers and vocabulary)."""

    checkpoint: str
    sha256: str
    config: dict[str, Any] = {}


class LMRunSpec(Spec):
    """Everything that determines one trained LM and its evaluation (and, with ``post``, its post-training arms).

    ``init``: the run starts from a pretrained checkpoint instead of training: its model is
    the checkpoint's (``model`` then describes it), evaluated as it is, and ``post`` arms
    post-train it (paper B's Fig. 5 protocol on a pretrained model; ``train`` gives their
    batch, length, accumulation, weight decay and clipping). ``post`` and ``init`` are left
    out of the run id while None.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("post", "init")

    data: LMDataSpec = LMDataSpec()
    model: LMModelSpec = LMModelSpec()
    intervention: InterventionSpec = InterventionSpec()
    train: LMTrainSpec = LMTrainSpec()
    eval: LMEvalSpec = LMEvalSpec()
    seed: Seed = 0
    post: LMPostSpec | None = None
    init: LMInitSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _vocab_of_tokenizer(cls, data: Any, info: ValidationInfo) -> Any:
        """A model whose ``vocab_size`` is not given reads every id of the data's tokenizer."""
        return vocab_from_tokenizer(data, bool(info.context and info.context.get("stored")))

    @model_validator(mode="after")
    def _init_in_a_loop(self) -> LMRunSpec:
        if self.init is not None and self.train.engine != "loop":
            raise ValueError("a run from a pretrained checkpoint (init) trains no base model; allowed: train.engine = "
                             "'loop'")
        return self

    @model_validator(mode="after")
    def _bins_fit(self, info: ValidationInfo) -> LMRunSpec:
        if self.eval.bin_width > self.train.seq_len:
            raise ValueError(f"eval.bin_width={self.eval.bin_width} must not exceed train.seq_len={self.train.seq_len}")
        check_limit("evaluation length (eval.length_multiple × train.seq_len)", self.eval_length, MAX_EVAL_LENGTH)
        check_tokenizer_fits(self.data, self.model)
        check_eval_size(self.train.seq_len, self.eval.length_multiple, self.eval.n_samples)
        check_state_bytes("train.batch_size × train.seq_len × d_model × n_layers × 4 bytes", self.train.batch_size,
                          self.train.seq_len, self.model.d_model * self.model.n_layers * 4)
        stored = bool(info.context and info.context.get("stored"))  # a run's spec.json: checked when it was made
        if self.init is None and not stored:  # a pretrained checkpoint runs its own layout (init.config), not model's
            check_train_memory(self.model, self.train.batch_size, self.train.seq_len)
            check_eval_memory(self.model, max(self.eval.n_samples, self.eval.effrem_samples),
                              min(self.eval.chunk_len, self.eval_length),
                              samples_name="eval.n_samples (or eval.effrem_samples)")
        return self

    @classmethod
    def check_work_item(cls, specs: list[Spec]) -> None:
        """Runs of one stack (``train.engine = "stack"``) train at once: their step's memory
        together is refused above the limit (:func:`dynlab.lm.train.memory.check_train_memory`)."""
        first = specs[0]
        if len(specs) > 1 and isinstance(first, LMRunSpec) and first.train.engine == "stack" and first.init is None:
            check_train_memory(first.model, first.train.batch_size, first.train.seq_len, members=len(specs))

    @property
    def run_id(self) -> str:
        return self.spec_hash()

    @property
    def eval_length(self) -> int:
        return self.eval.length_multiple * self.train.seq_len


