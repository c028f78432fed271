"""The parts both of paper B's run specs are built from: the text (:class:`LMDataSpec`), the
model (:class:`LMModelSpec`) and the initial-state intervention (:class:`InterventionSpec`),
with the anchor layouts of the study presets and the tokenizer-vocabulary rule.

A user text file is named by its absolute path and the SHA-256 of its content, so an edited
file gets new runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dynlab.spec import MAX_LM_MEMORY_BYTES, Spec, Width
from dynlab.lm.data.tokenizer import BYTE_VOCAB, TokenizerSpec
from dynlab.lm.data.tokens import RECORD as TOKENS_RECORD
from dynlab.lm.data.tokens import is_token_folder, open_token_folder
from dynlab.names import INTERVENTION_NAMES, MIXER_NAMES, PRECISIONS, SOURCES

__all__ = [
    "ANCHOR_MLP_RATIO", "BUDGET_LM_LAYOUT", "CHINCHILLA_TOKENS_PER_PARAM", "DistanceName", "InterventionName",
    "InterventionSpec", "LEGACY_MODEL_FIELDS", "LMDataSpec", "LMModelSpec", "MixerName", "Precision",
    "QUICK_LM_LAYOUT", "anchor_model_fields", "check_tokenizer_fits", "vocab_from_tokenizer",
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


