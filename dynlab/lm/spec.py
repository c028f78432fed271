"""Frozen run specifications for the LM length-generalization study (subclasses of :class:`dynlab.spec.Spec`).

The hash of an :class:`LMRunSpec` is the run id. A user text file is named by its
absolute path and the SHA-256 of its content, so an edited file gets new runs.

Long module: the LM run specs and the task run specs are built from the same data, model and
intervention parts and the same size limits, and they are the spec vocabulary that the
studies and the command line import from this one path.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynlab.spec import (
    MAX_EVAL_LENGTHS,
    MAX_EVAL_TOKENS,
    MAX_EVAL_LENGTH,
    MAX_LENGTH,
    MAX_LM_MEMORY_BYTES,
    MAX_STATE_BYTES,
    MAX_STEPS,
    Batch,
    Length,
    Lengths,
    Samples,
    Seed,
    Spec,
    Steps,
    StepsOrZero,
    Width,
    check_limit,
    check_state_bytes,
)
from dynlab.errors import DynlabInputError
from dynlab.runtime import MAX_THREADS
from dynlab.lm.train.memory import check_eval_memory, check_train_memory
from dynlab.lm.data.tokenizer import BYTE_VOCAB, TokenizerSpec
from dynlab.lm.data.tokens import RECORD as TOKENS_RECORD
from dynlab.lm.data.tokens import is_token_folder, open_token_folder
from dynlab.names import BABI_KINDS, INTERVENTION_NAMES, MIXER_NAMES, PRECISIONS, SOURCES, TASK_INTERVENTION_NAMES, TBTT, TBTT_ON_TASKS

__all__ = [
    "ANCHOR_MLP_RATIO", "CHINCHILLA_TOKENS_PER_PARAM", "LMDataSpec", "LMModelSpec", "InterventionSpec", "LMTrainSpec",
    "LMEvalSpec", "LMInitSpec", "LMPostSpec", "LMRunSpec", "anchor_model_fields", "check_eval_size",
    "LMTaskSpec", "TaskTrainSpec", "TaskEvalSpec", "TaskPostSpec", "WarmStartSpec", "LMTaskRunSpec", "LEGACY_MODEL_FIELDS",
]

MixerName = Literal[MIXER_NAMES]
#: Training precisions (:func:`dynlab.lm.train.engine.fit`).
Precision = Literal[PRECISIONS]
InterventionName = Literal[INTERVENTION_NAMES]
DistanceName = Literal["tv", "js", "cos"]

#: The block layout of each mixer's anchor model, used by every study preset: Mamba-1 and
#: Mamba-2 blocks are norm + mixer with no MLP (mamba-ssm's and Hugging Face's LMs, so
#: they export with ``dynlab lm export``); GLA blocks have an MLP (flash-linear-attention's
#: GLA). A preset's or the user's ``mlp_ratio`` overrides it.
ANCHOR_MLP_RATIO: dict[str, int] = {"mamba2": 0, "mamba1": 0, "gla": 2}

#: Tokens per parameter of a compute-optimal model (Hoffmann et al. 2022): "1x Chinchilla".
#: dynlab counts every parameter of the LM, embedding and head included.
CHINCHILLA_TOKENS_PER_PARAM = 20


def anchor_model_fields(mixer: str, **fields: Any) -> dict[str, Any]:
    """``LMModelSpec`` fields for ``mixer``: its anchor's ``mlp_ratio`` (:data:`ANCHOR_MLP_RATIO`)
    unless ``fields`` set one, then ``fields``."""
    return {"mixer": mixer, "mlp_ratio": ANCHOR_MLP_RATIO[mixer], **fields}


class LMDataSpec(Spec):
    """Text source and the tokenizer that reads it; validation tail fraction.

    ``source``: ``"shakespeare"`` (the plays shipped with dynlab), a path to a UTF-8 file, or a
    token folder written by ``dynlab data prepare`` (:mod:`dynlab.lm.data.tokens`: its splits are
    fixed there, so ``val_fraction`` is not used). For a file, ``content_sha256`` (filled in
    from the file when not given; for a token folder, from its record) is part of the run
    id, so editing the file never reuses runs trained on the old text.

    ``tokenizer`` (:class:`~dynlab.lm.data.tokenizer.TokenizerSpec`): the UTF-8 bytes by
    default (left out of the run id then); a token folder brings its own, and naming
    another one for it is refused.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("tokenizer",)

    source: str = "shakespeare"
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0, allow_inf_nan=False)
    content_sha256: str | None = None
    tokenizer: TokenizerSpec = TokenizerSpec()

    @model_validator(mode="before")
    @classmethod
    def _hash_file(cls, data: Any, info: ValidationInfo) -> Any:
        stored = bool(info.context and info.context.get("stored"))  # a run's spec.json: as it was made
        if isinstance(data, dict) and data.get("source", "shakespeare") not in SOURCES and not data.get("content_sha256"):
            p = Path(str(data["source"])).expanduser()
            if is_token_folder(p):
                data = {**data, "content_sha256": hashlib.sha256((p / TOKENS_RECORD).read_bytes()).hexdigest()}
            elif p.is_file():
                data = {**data, "content_sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        if isinstance(data, dict) and data.get("source") not in (None, *SOURCES) and "tokenizer" not in data and not stored:
            p = Path(str(data["source"])).expanduser()
            if is_token_folder(p):  # a token folder brings its tokenizer
                data = {**data, "tokenizer": open_token_folder(p).tokenizer}
        return data

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: str) -> str:
        if v in SOURCES:
            return v
        p = Path(v).expanduser()
        if not p.is_file() and not is_token_folder(p):
            raise ValueError(f"source {v!r} is neither one of {SOURCES}, an existing text file, nor a token folder "
                             "(dynlab data prepare)")
        return str(p.resolve())

    @model_validator(mode="after")
    def _tokenizer_of_folder(self, info: ValidationInfo) -> LMDataSpec:
        if info.context and info.context.get("stored"):  # a run's spec.json: the folder may have been remade since
            return self
        if self.source not in SOURCES and is_token_folder(Path(self.source)):
            own = open_token_folder(Path(self.source)).tokenizer
            if (own.kind, own.sha256, own.n_ids) != (self.tokenizer.kind, self.tokenizer.sha256, self.tokenizer.n_ids):
                raise ValueError(f"the token folder {self.source!r} was made with the tokenizer {own.label}, not with "
                                 f"{self.tokenizer.label}, the model's; allowed: a token folder of the model's tokenizer "
                                 "(dynlab data prepare --tokenizer)")
        return self

    @property
    def token_folder(self) -> bool:
        """True when the source is a token folder (``dynlab data prepare``)."""
        return self.source not in SOURCES and is_token_folder(Path(self.source))


#: Fields of :class:`LMModelSpec` added with the short convolution, and what a stored
#: spec (a run folder's ``spec.json``) without them means: dynlab's earlier layout (no
#: convolution, RMSNorm epsilon of the dtype, a norm inside Mamba-1).
LEGACY_MODEL_FIELDS: dict[str, Any] = {"conv_kernel": 0, "norm_eps": None, "mamba1_inner_norm": True}


#: The length-generalization study's ``quick`` model: 2 layers, width 64, 4 heads x 32
#: channels, N = 64, near-integrator heads (initial step sizes in [1e-5, 1e-3]); with
#: :func:`anchor_model_fields` (no MLP) 101 848 parameters.
QUICK_LM_LAYOUT = {"d_model": 64, "n_layers": 2, "n_heads": 4, "head_dim": 32, "d_state": 64, "chunk_size": 32,
                   "dt_min": 1e-5, "dt_max": 1e-3}

#: The ``budget`` preset's model: the quick layout at width 16, 2 heads x 16, N = 32 (14 460 parameters).
BUDGET_LM_LAYOUT = {**QUICK_LM_LAYOUT, "d_model": 16, "n_heads": 2, "head_dim": 16, "d_state": 32}


class LMModelSpec(Spec):
    """Byte-level LM: ``n_layers`` blocks of ``mixer`` at width ``d_model``.

    Per mixer: mamba2 uses ``n_heads × head_dim`` channels with state ``d_state`` and initial
    step sizes log-uniform in [dt_min, dt_max]; mamba1 uses ``n_heads·head_dim`` channels
    (grouped into ``n_heads`` for the state layout) with state ``d_state``; gla uses
    ``n_heads`` heads with keys of size ``d_state`` and values of size ``head_dim``.
    Every mixer has a short causal convolution of width ``conv_kernel`` (0: none; see
    :mod:`dynlab.lm.models.mixers`). ``mlp_ratio = 0`` gives Mamba's MLP-free blocks (the layout
    that exports to Hugging Face, :mod:`dynlab.lm.hub.export`). ``norm_eps``: epsilon of every
    RMSNorm (None: the dtype's machine epsilon). ``mamba1_inner_norm``: the RMSNorm before
    Mamba-1's output projection that real Mamba-1 lacks (old run folders have it).
    ``vocab_size``: rows of the embedding and the head, at least the tokenizer's ids (256:
    bytes; left out of the run id then).
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("vocab_size",)

    mixer: MixerName = "mamba2"
    d_model: Width = 64
    n_layers: int = Field(2, ge=1, le=64)
    n_heads: int = Field(4, ge=1, le=256)
    head_dim: int = Field(16, ge=1, le=1024)
    d_state: int = Field(16, ge=1, le=1024)
    mlp_ratio: int = Field(2, ge=0, le=16)
    chunk_size: int = Field(64, ge=1)
    dt_min: float = Field(1e-3, gt=0.0, allow_inf_nan=False)
    dt_max: float = Field(1e-1, gt=0.0, allow_inf_nan=False)
    conv_kernel: int = Field(4, ge=0, le=64)
    norm_eps: float | None = Field(1e-5, gt=0.0, lt=1.0, allow_inf_nan=False)
    mamba1_inner_norm: bool = False
    vocab_size: int = Field(BYTE_VOCAB, ge=2, le=2**20)

    @model_validator(mode="before")
    @classmethod
    def _stored_layout(cls, data: Any, info: ValidationInfo) -> Any:
        if info.context and info.context.get("stored") and isinstance(data, dict):
            data = {**LEGACY_MODEL_FIELDS, **data}
        return data

    @model_validator(mode="after")
    def _dt_order(self) -> LMModelSpec:
        if self.dt_min > self.dt_max:
            raise ValueError(f"dt_min={self.dt_min} exceeds dt_max={self.dt_max}")
        need = 16 * self.parameter_bound()  # float32 weights, gradients and AdamW's two moments
        if need > MAX_LM_MEMORY_BYTES:
            raise ValueError(f"a model of up to {self.parameter_bound():,} parameters (d_model, n_layers, n_heads × "
                             f"head_dim, d_state, mlp_ratio) needs {need / 2**30:.1f} GiB for its weights, gradients "
                             f"and AdamW moments; allowed: at most {MAX_LM_MEMORY_BYTES / 2**30:.0f} GiB (a smaller model)")
        return self

    def parameter_bound(self) -> int:
        """An upper bound of the model's parameter count, without building it (checked
        before anything is built): per layer the projections of ``n_heads·head_dim``
        channels and their ``d_state`` inputs (GLA: keys and gates of ``d_state`` per head), Mamba-1's step-size and state projections
        and its per-channel state matrix, the convolution, and the MLP; the embedding and
        the head (``tests/lm/test_spec_limits.py`` holds it against built models)."""
        inner = self.n_heads * self.head_dim
        dt_rank = -(-self.d_model // 16)  # Mamba-1's step-size projection rank
        keys = self.n_heads * self.d_state  # GLA's keys (and gates) of every head
        per_layer = (self.d_model * (3 * inner + 3 * keys + 2 * self.d_state + 2 * self.n_heads)
                     + inner * (3 * self.d_state + 2 * dt_rank + 4) + 2 * self.mlp_ratio * self.d_model ** 2
                     + (inner + 2 * keys + 2 * self.d_state) * (self.conv_kernel + 1) + 4 * self.d_model)
        return self.n_layers * per_layer + 2 * self.vocab_size * self.d_model + self.d_model

    def mixer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the mixer class for this spec."""
        common: dict[str, Any] = dict(chunk_size=self.chunk_size, conv_kernel=self.conv_kernel)
        if self.mixer == "mamba2":
            return dict(n_heads=self.n_heads, head_dim=self.head_dim, d_state=self.d_state,
                        dt_min=self.dt_min, dt_max=self.dt_max, **common)
        if self.mixer == "mamba1":
            return dict(d_inner=self.n_heads * self.head_dim, d_state=self.d_state, n_heads=self.n_heads,
                        inner_norm=self.mamba1_inner_norm, **common)
        return dict(n_heads=self.n_heads, key_dim=self.d_state, value_dim=self.head_dim, **common)


class InterventionSpec(Spec):
    """Initial-state intervention used in training (docs/length-generalization.md); knobs of other kinds are ignored."""

    kind: InterventionName = "zero"
    sigma: float = Field(0.1, ge=0.0, allow_inf_nan=False)
    beta: float = Field(0.1, ge=0.0, lt=1.0, allow_inf_nan=False)
    reset_prob: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)

    def make(self, kind: str | None = None):
        """The :class:`~dynlab.lm.train.interventions.Intervention` of this spec's knobs, of kind
        ``kind`` (None: the spec's own), e.g. a post-training arm of the same knobs."""
        from dynlab.lm.train.interventions import make_intervention

        return make_intervention(self.kind if kind is None else kind, sigma=self.sigma, beta=self.beta,
                                 reset_prob=self.reset_prob)


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


def vocab_from_tokenizer(data: Any, stored: bool = False) -> Any:
    """Run-spec fields ``data`` with ``model.vocab_size`` set to the tokenizer's ``n_ids``
    when the model leaves it out and the data's tokenizer is not the byte one (the fields
    as they are otherwise)."""
    if not isinstance(data, dict) or "data" not in data:
        return data
    model = data.get("model", {})
    if isinstance(model, LMModelSpec) or (isinstance(model, dict) and "vocab_size" in model):
        return data
    source = data["data"]
    tok = (source.tokenizer if isinstance(source, LMDataSpec)
           else LMDataSpec.model_validate(source, context={"stored": stored}).tokenizer if isinstance(source, dict)
           else None)
    if tok is None or tok.kind == "byte":
        return data
    return {**data, "model": {**(model if isinstance(model, dict) else {}), "vocab_size": tok.n_ids}}


def check_tokenizer_fits(data: LMDataSpec, model: LMModelSpec) -> None:
    """Refuse a model whose vocabulary does not hold every id of the data's tokenizer."""
    if data.tokenizer.n_ids > model.vocab_size:
        raise ValueError(f"the tokenizer {data.tokenizer.label} gives ids up to {data.tokenizer.n_ids - 1}, beyond the "
                         f"model's vocabulary of {model.vocab_size}; allowed: model.vocab_size >= {data.tokenizer.n_ids}")


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


TaskKind = Literal["copying", "passkey", "babi"]
BabiKind = Literal[BABI_KINDS]


class LMTaskSpec(Spec):
    """A long-context task (see :mod:`dynlab.lm.data.tasks`) with its training and test lengths.

    Lengths are string lengths for ``copying`` and whole-sample token counts otherwise.
    Training draws one length uniformly in ``[train_min, train_max]`` per batch (and, for
    passkey, a uniform depth per sample); testing uses every ``eval_lengths`` (× every
    ``depths`` for passkey). ``babi_kinds``, ``n_facts``, ``babi_tokens`` and
    ``babi_questions`` apply to ``babi`` only (:class:`dynlab.lm.data.tasks.BabiTask`):
    ``babi_tokens="words"`` makes each bAbI word one token (the filler stays bytes; lengths
    count tokens), ``babi_questions="all"`` makes each training sample ask every question
    its story answers (test samples ask one). Both are left out of the run id at their
    defaults (``"bytes"``, ``"one"``), so runs from before they existed keep their ids.
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("babi_tokens", "babi_questions")

    kind: TaskKind = "copying"
    train_min: Length = 50
    train_max: Length = 100
    eval_lengths: Lengths = (50, 100, 150, 200, 300)
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    babi_kinds: tuple[BabiKind, ...] = BABI_KINDS
    n_facts: int = Field(4, ge=1, le=64)
    babi_tokens: Literal["bytes", "words"] = "bytes"
    babi_questions: Literal["one", "all"] = "one"

    @field_validator("depths")
    @classmethod
    def _depths_in_unit_interval(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        for d in v:
            if not 0.0 <= d <= 1.0:
                raise ValueError(f"depth {d} is outside [0, 1]; allowed: fractions between 0 and 1")
        if not v:
            raise ValueError("depths must hold at least one value in [0, 1]")
        return v

    @model_validator(mode="after")
    def _lengths_fit(self) -> LMTaskSpec:
        if self.train_min > self.train_max:
            raise ValueError(f"train_min={self.train_min} exceeds train_max={self.train_max}")
        if not self.eval_lengths:
            raise ValueError("eval_lengths must hold at least one length")
        if self.kind == "copying":  # string lengths: bounded alike under every tokenizer
            check_task_lengths(self)
        else:  # the format (bAbI's kinds and facts) now; the room in tokens with the run's tokenizer
            from dynlab.lm.data.tasks import make_task

            make_task(self.kind, torch.zeros(1, dtype=torch.uint8), tuple(self.babi_kinds), self.n_facts,
                      self.babi_tokens, self.babi_questions)
        return self


def check_task_lengths(task: LMTaskSpec, tokenizer: TokenizerSpec | None = None, prefix: str = "") -> None:
    """Refuse a length of ``task`` its samples do not fit, in the tokens of ``tokenizer``
    (None or bytes: the byte formats): a task bounds its lengths below (room for the needle,
    facts and question) or above (sample size); said as the field's (``train_min: …``,
    ``eval_lengths: …``), so that a command names its option (``--lengths``)."""
    from dynlab.lm.data.tasks import make_task
    from dynlab.lm.data.tokenizer import make_tokenizer

    subword = tokenizer is not None and tokenizer.kind != "byte"
    generator = make_task(task.kind, torch.zeros(1, dtype=torch.uint8), tuple(task.babi_kinds), task.n_facts,
                          task.babi_tokens, task.babi_questions, make_tokenizer(tokenizer) if subword else None)
    how = "" if prefix else "; set the lengths with --lengths or --config [task] train_min, train_max"
    where = f" (in tokens of {tokenizer.label}{how})" if subword and tokenizer is not None else ""
    for name, lengths in (("train_min", (task.train_min,)), ("train_max", (task.train_max,)),
                          ("eval_lengths", task.eval_lengths)):
        for length in lengths:
            try:
                generator.check_length(length)
            except ValueError as exc:
                raise ValueError(f"{prefix}{name}: {exc}{where}") from None


class TaskTrainSpec(Spec):
    """AdamW with warm-up and cosine decay on task batches (loss on the scored targets only).

    ``until_learned``: training stops early once the model has learned — checked every
    ``check_every`` steps on ``check_samples`` fresh samples per in-range test cell drawn
    from the *training* text with their own generator (never the test samples), with the
    rule of :func:`dynlab.lm.run.task.in_range_accuracy` and ``eval.learned_at`` — and
    ``steps`` is the cap (the schedule is that of ``steps``).

    ``attempts`` (with ``until_learned``): a model that has not learned when its ``steps``
    run out (the same check, once more at the cap) is drawn afresh — new parameters from
    ``seed + k · ATTEMPT_SEED_OFFSET`` for attempt k = 1, 2, …, a fresh optimiser and
    schedule, the next batches of the run's stream — and trained again, up to ``attempts``
    models in all. Attempt 0 is the run without the rule (the same parameters and
    batches), so a model that learns at once is the same model with any ``attempts``. The
    run records ``train_attempts`` and each attempt's steps; its ``train_steps`` and
    ``train_time`` count every attempt. The run keeps the last model drawn, learned or not
    (an earlier one is not kept even if it came closer). A stated rule for tasks whose
    learning depends on the initialisation at small scale (:mod:`studies.babilong`); 1 (the
    default): one model. A warm start's training takes one model only.

    ``check_at``: the in-range accuracy the check needs to stop training (None: the
    ``eval.learned_at`` that decides the status). Set above ``learned_at`` so that a model
    stopped on a lucky check does not then test just below it.

    ``confirm`` (with ``until_learned``): a check that passes on its ``check_samples`` is
    confirmed on as many fresh training-text samples per in-range cell as the test draws
    (``eval.n_samples``, a generator of its own), and training stops only when both pass;
    and an attempt whose model stopped or ran to its cap as learned is tested in range
    (the test samples, the rule of the run's status) before it is kept: below
    ``learned_at`` it counts as a failed attempt, and the next one is drawn while
    ``attempts`` remain. So a run never ends ``not-learned`` while it had attempts left
    after a lucky check. Left out of the run id while False (the rule before it existed).
    """

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("attempts", "check_at", "confirm", "precision")

    steps: StepsOrZero = 600
    until_learned: bool = False
    attempts: int = Field(1, ge=1, le=16)
    check_every: int = Field(250, ge=1, le=MAX_STEPS)
    check_samples: Samples = 16
    check_at: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    confirm: bool = False
    precision: Precision = "fp32"
    batch_size: Batch = 16
    lr: float = Field(3e-3, gt=0.0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0.0, allow_inf_nan=False)
    clip: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS, description="torch CPU threads while training and evaluating (None: RUN_THREADS = 1)")


class TaskEvalSpec(Spec):
    """Test: ``n_samples`` fresh samples per (length[, depth][, kind]) from the zero state, streamed in ``chunk_len`` pieces.

    ``learned_at``: the run is ``ok`` (learned) when its *in-range accuracy* — the mean
    headline accuracy over the test cells with length ≤ ``task.train_max`` (for babi, of
    the kinds in ``learn_kinds`` that are trained) — is at least this; otherwise it is
    ``not-learned`` and is kept out of every contrast.
    """

    n_samples: Samples = 64
    chunk_len: Length = 256
    learned_at: float = Field(0.9, ge=0.0, le=1.0, allow_inf_nan=False)
    learn_kinds: tuple[BabiKind, ...] = ("qa1",)


TaskInterventionName = Literal[TASK_INTERVENTION_NAMES]


class TaskPostSpec(Spec):
    """Paper B's protocol: post-training of the model trained on the task from the zero state.

    From the trained weights, every intervention in ``interventions`` trains ``steps``
    more steps (AdamW from a fresh optimiser, ``lr``, warm-up ``warmup_frac`` then cosine
    decay, the batch size and lengths of training). ``zero`` is the compute-matched
    control: the same steps with zero initial states. All arms see the same batches, drawn
    from a generator seeded with ``seed + POST_SEED_OFFSET``.
    """

    interventions: tuple[TaskInterventionName, ...] = ("zero", "fitted-noise", "state-passing")
    steps: int = Field(500, ge=1, le=10_000_000)
    lr: float = Field(1e-3, gt=0.0, le=10.0, allow_inf_nan=False)
    warmup_frac: float = Field(0.1, ge=0.0, le=1.0, allow_inf_nan=False)

    @field_validator("interventions")
    @classmethod
    def _with_control(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        v = tuple(dict.fromkeys(v))
        if "zero" not in v:
            raise ValueError("post-training interventions must include 'zero', the compute-matched control; "
                             f"got {list(v)}")
        return ("zero", *(x for x in v if x != "zero"))


class WarmStartSpec(Spec):
    """A stated warm start: before training on its task, the run's model (same model
    spec, seed and text) is trained on ``task`` with ``train`` from the zero state — the
    small-scale stand-in for the *pretrained* LMs that paper B post-trains. Nothing is
    loaded from elsewhere: the warm start is recomputed inside the run."""

    task: LMTaskSpec
    train: TaskTrainSpec


class LMTaskRunSpec(Spec):
    """Everything that determines one LM trained and tested on a long-context task.

    ``data`` is the filler text (passkey, babi; its training part for training samples,
    its validation part for test samples). Test samples come from a generator seeded with
    ``seed + 1_000_003``, training samples and noise from one seeded with ``seed``.
    """

    data: LMDataSpec = LMDataSpec()
    model: LMModelSpec = LMModelSpec()
    intervention: InterventionSpec = InterventionSpec()
    task: LMTaskSpec = LMTaskSpec()
    train: TaskTrainSpec = TaskTrainSpec()
    eval: TaskEvalSpec = TaskEvalSpec()
    post: TaskPostSpec | None = None
    warm_start: WarmStartSpec | None = None
    seed: Seed = 0

    @model_validator(mode="after")
    def _attempts_rule(self) -> LMTaskRunSpec:
        if self.train.attempts > 1 and not self.train.until_learned:
            raise ValueError(f"train.attempts {self.train.attempts} needs train.until_learned (an attempt ends "
                             "unlearned only under that check); allowed: attempts = 1, or until_learned = true")
        if self.train.confirm and not self.train.until_learned:
            raise ValueError("train.confirm needs train.until_learned (it confirms the stopping check); "
                             "allowed: confirm = false, or until_learned = true")
        if self.train.check_at is not None and not self.train.until_learned:
            raise ValueError(f"train.check_at {self.train.check_at} needs train.until_learned (it is the stopping "
                             "check's threshold); allowed: check_at unset, or until_learned = true")
        if self.warm_start is not None and self.warm_start.train.attempts > 1:
            raise ValueError(f"warm_start.train.attempts {self.warm_start.train.attempts} is not supported (a warm "
                             "start trains one model); allowed: 1")
        if self.train.attempts > 1 and self.warm_start is not None:
            raise ValueError(f"train.attempts {self.train.attempts} with a warm start is not supported (a new "
                             "attempt would discard the warm-started weights); allowed: attempts = 1 with warm_start")
        return self

    @model_validator(mode="after")
    def _in_range_cells(self) -> LMTaskRunSpec:
        if not any(length <= self.task.train_max for length in self.task.eval_lengths):
            raise ValueError(f"eval_lengths {list(self.task.eval_lengths)} hold no length <= train_max={self.task.train_max}; "
                             "allowed: at least one test length inside the training range (it decides whether the run learned)")
        return self

    @model_validator(mode="before")
    @classmethod
    def _vocab_of_tokenizer(cls, data: Any, info: ValidationInfo) -> Any:
        """A model whose ``vocab_size`` is not given reads every id of the data's tokenizer."""
        return vocab_from_tokenizer(data, bool(info.context and info.context.get("stored")))

    @model_validator(mode="after")
    def _task_through_tokenizer(self, info: ValidationInfo) -> LMTaskRunSpec:
        """The tokenizer fits the model, the task's lengths (and a warm start's) hold its
        samples in that tokenizer's tokens (:func:`check_task_lengths`), and its training and
        test fit in memory (:meth:`_check_memory`; not for a run's stored spec, checked when it
        was made: its tokenizer file may have moved since; the memory not for a checkpoint's
        model either, validation context ``checkpoint_model``: ``model`` does not describe it)."""
        check_tokenizer_fits(self.data, self.model)
        if info.context and info.context.get("stored"):
            return self
        check_task_lengths(self.task, self.data.tokenizer)
        if self.warm_start is not None:
            check_task_lengths(self.warm_start.task, self.data.tokenizer, "warm_start.task.")
        if not (info.context and info.context.get("checkpoint_model")):  # a checkpoint's model: not model's layout
            self._check_memory()
        return self

    def _check_memory(self) -> None:
        """A training step (of the task, and of a warm start's) and the test fit in memory
        (:mod:`dynlab.lm.train.memory`): the longest training sample in tokens (copying: the
        string twice and three marks), the test's samples in pieces of ``eval.chunk_len``."""
        for prefix, task, train in (("", self.task, self.train),
                                    *((("warm_start.", self.warm_start.task, self.warm_start.train),)
                                      if self.warm_start is not None else ())):
            tokens = 2 * task.train_max + 3 if task.kind == "copying" else task.train_max
            check_train_memory(self.model, train.batch_size, tokens, batch_name=f"{prefix}train.batch_size",
                               length_name=f"(the longest sample of {prefix}task.train_max {task.train_max})")
        longest = max(2 * n + 3 if self.task.kind == "copying" else n for n in self.task.eval_lengths)
        check_eval_memory(self.model, max(self.eval.n_samples, self.train.check_samples),
                          min(self.eval.chunk_len, longest), samples_name="eval.n_samples (or train.check_samples)")

    @field_validator("intervention")
    @classmethod
    def _no_tbtt(cls, v: InterventionSpec) -> InterventionSpec:
        if v.kind == TBTT:
            raise ValueError(TBTT_ON_TASKS)
        return v

    @property
    def run_id(self) -> str:
        return self.spec_hash()
