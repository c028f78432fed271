"""Export a dynlab :class:`~dynlab.lm.models.model.RecurrentLM` to a Hugging Face ``transformers`` model.

:func:`to_hf` builds the equivalent ``Mamba2ForCausalLM`` (mixer ``mamba2``) or
``MambaForCausalLM`` (mixer ``mamba1``) with every weight copied under its HF name;
:func:`export_hf` writes it as an HF folder (``config.json`` + ``model.safetensors``,
``save_pretrained``) that ``from_pretrained`` loads from local files and that
:func:`dynlab.lm.hub.hf.load_hf_checkpoint` wraps again, with a byte-level tokenizer that
``AutoTokenizer`` loads (ids = the text's UTF-8 bytes, as dynlab's) and a model card
``README.md`` (layout, training budget, data, evaluation; its header the Hub's metadata,
``license`` from ``export_hf(..., license=...)``, default ``unknown``; :mod:`dynlab.lm.hub.card`).

Only layouts HF can express export; anything else raises
:class:`~dynlab.errors.DynlabInputError` naming the problem:

- mixer ``mamba2`` or ``mamba1``. No HF class computes dynlab's GLA (:data:`GLA_REFUSAL`):
  transformers has no GLA model, and flash-linear-attention's ``GLAForCausalLM`` (its
  ``fla.models``, which the ``fla-core`` package lacks) differs in three places that
  copying weights cannot bridge: it RMS-normalises each head's output (one weight of
  the head's width, shared by the heads) before the ``swish`` output gate, where dynlab
  normalises the gated output of all heads together (one weight per channel); its forget
  gate is a rank-16 projection with a bias (``gate_low_rank_dim``, not a ``GLAConfig``
  field), where dynlab's is one ``d_model × H·K`` matrix; and every block has a SwiGLU MLP,
  where dynlab's has a GELU MLP or none. q, k, v, the convolutions, the gate normaliser
  16 and the query scale would map. Exporting GLA would need a dynlab GLA in fla's
  layout, or a model class shipped with the export;
- ``mlp_ratio == 0`` (HF's Mamba blocks are norm + mixer, no MLP);
- ``conv_kernel >= 1`` (HF's mixers always have the convolution);
- Mamba-1 without the inner norm (``inner_norm=False``; HF's Mamba-1 has none);
- ``norm_eps`` a number (HF's RMSNorms take a fixed epsilon, not the dtype's);
- inner width ``= expand × d_model`` for an integer ``expand`` (HF derives the inner width
  from ``expand``).

The config is set so that the numbers match dynlab's: one group for B and C
(``n_groups = 1``), untied head (``tie_word_embeddings = False``), the residual stream
kept in the model's dtype (``residual_in_fp32 = False``, as dynlab; in float32 the two
settings agree), ``layer_norm_epsilon = norm_eps`` (every RMSNorm, the gated one of Mamba-2
included), ``vocab_size = 256`` (bytes) and a Mamba-2 step-size limit of ``(0, inf)``
(no clamping). The HF models compute their RMSNorms (and parts of their scans) in
float32 internally, so a float64 export agrees with dynlab to float32 rounding of those
steps; a float32 export agrees to float32 rounding.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.names import HF_EXPORT_ALLOWED, HF_EXPORT_FILES, HF_EXPORT_MARKER
from dynlab.lm.hub.hf import require_transformers
from dynlab.outputs import current_umask, probe_folder, refuse_foreign_folder
from dynlab.results.folder import check_owned_folder, claim_owned_folder
from dynlab.lm.hub.card import DEFAULT_LICENSE, check_license
from dynlab.lm.models.mixers import Mamba1Mixer, Mamba2Mixer
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.data.tokenizer import TokenizerSpec

__all__ = ["EXPORTABLE_MIXERS", "GLA_REFUSAL", "HF_EXPORT_ALLOWED", "HF_EXPORT_FILES", "check_exportable", "export_hf", "hf_config", "hf_state_dict", "to_hf"]

EXPORTABLE_MIXERS = ("mamba2", "mamba1")
# HF_EXPORT_FILES (what an export writes; a folder holding others is not replaced) and
# HF_EXPORT_ALLOWED: dynlab.names, re-exported

#: Why a GLA model does not export (the module docstring has the details).
GLA_REFUSAL = ("mixer 'gla': no Hugging Face class computes dynlab's GLA (transformers has none; fla's GLAForCausalLM, "
               "package flash-linear-attention, norms each head before the output gate where dynlab norms all heads "
               "after it, has a rank-16 forget gate where dynlab's is one full matrix, and a SwiGLU MLP in every block "
               "where dynlab's is GELU or none); an export would need a dynlab GLA in fla's layout")


def _refuse(problem: str, allowed: str) -> DynlabInputError:
    return DynlabInputError(f"cannot export to Hugging Face: {problem}; allowed: {allowed}")


def check_exportable(model: nn.Module) -> None:
    """Raise :class:`DynlabInputError` (one line: the problem and what is allowed) unless ``model`` exports."""
    if not isinstance(model, RecurrentLM):
        raise _refuse(f"{type(model).__name__} is not a dynlab RecurrentLM", "a dynlab RecurrentLM (or its run folder)")
    if model.mixer_name == "gla":
        raise _refuse(GLA_REFUSAL, "mixer mamba2 or mamba1")
    if model.mixer_name not in EXPORTABLE_MIXERS:
        raise _refuse(f"mixer {model.mixer_name!r}", "mixer mamba2 or mamba1")
    block = model.blocks[0]
    if block.has_mlp:
        raise _refuse("the blocks have an MLP (mlp_ratio > 0)", "mlp_ratio = 0 (HF Mamba blocks are norm + mixer)")
    mixer = block.mixer
    if mixer.conv1d is None:
        raise _refuse("no convolution (conv_kernel = 0)", "conv_kernel >= 1")
    if isinstance(mixer, Mamba1Mixer) and mixer.norm is not None:
        raise _refuse("Mamba-1 with the inner norm (inner_norm / mamba1_inner_norm = True)",
                      "Mamba-1 without inner norm, as HF's")
    if block.mixer_norm.eps is None:
        raise _refuse("norm_eps = None (the dtype's machine epsilon)", "norm_eps a positive number, e.g. 1e-5")
    if mixer.d_inner % model.d_model:
        raise _refuse(f"inner width {mixer.d_inner} is not an integer multiple of d_model = {model.d_model}",
                      "inner width = expand x d_model with an integer expand")


def _common_config(model: RecurrentLM, mixer: nn.Module) -> dict[str, Any]:
    return dict(vocab_size=model.vocab_size, hidden_size=model.d_model, num_hidden_layers=model.n_layers,
                state_size=mixer.d_state, expand=mixer.d_inner // model.d_model, conv_kernel=mixer.conv_kernel,
                use_bias=False, use_conv_bias=True, hidden_act="silu",
                layer_norm_epsilon=float(model.blocks[0].mixer_norm.eps), residual_in_fp32=False,
                tie_word_embeddings=False, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def hf_config(model: RecurrentLM):
    """The ``Mamba2Config`` / ``MambaConfig`` of ``model`` (checked by :func:`check_exportable`)."""
    check_exportable(model)
    tf = require_transformers("exporting to Hugging Face")
    mixer = model.blocks[0].mixer
    common = _common_config(model, mixer)
    if isinstance(mixer, Mamba2Mixer):
        return tf.Mamba2Config(num_heads=mixer.n_heads, head_dim=mixer.head_dim, n_groups=1,
                               chunk_size=mixer.chunk_size, time_step_limit=(0.0, float("inf")),
                               time_step_min=mixer.dt_min, time_step_max=mixer.dt_max, **common)
    return tf.MambaConfig(time_step_rank=mixer.dt_rank, use_mambapy=False, **common)


def hf_state_dict(model: RecurrentLM) -> dict[str, torch.Tensor]:
    """Every weight of ``model`` under its HF name (detached copies, dtype and device kept).

    Both mixers: ``in_proj`` (Mamba-2 rows ``[z, xBC, dt]`` = HF's ``[gate, xBC, dt]``;
    Mamba-1 rows ``[x, z]`` = HF's ``[x, gate]``), ``conv1d.weight [C, 1, K]`` and bias,
    ``A_log``, ``D``, ``out_proj``; Mamba-2 also ``dt_bias`` and the gated ``norm``;
    Mamba-1 also ``x_proj`` (rows ``[dt, B, C]``) and ``dt_proj`` (weight and bias).
    """
    check_exportable(model)
    out: dict[str, torch.Tensor] = {"backbone.embeddings.weight": model.embedding.weight}
    for i, block in enumerate(model.blocks):
        pre, m = f"backbone.layers.{i}.", block.mixer
        out[pre + "norm.weight"] = block.mixer_norm.weight
        names = ["in_proj.weight", "conv1d.weight", "conv1d.bias", "A_log", "D", "out_proj.weight"]
        names += ["dt_bias", "norm.weight"] if isinstance(m, Mamba2Mixer) else ["x_proj.weight", "dt_proj.weight",
                                                                                "dt_proj.bias"]
        params = dict(m.named_parameters())
        for name in names:
            out[pre + "mixer." + name] = params[name]
    out["backbone.norm_f.weight"] = model.final_norm.weight
    out["lm_head.weight"] = model.head.weight
    return {k: v.detach().clone() for k, v in out.items()}


def to_hf(model: RecurrentLM) -> nn.Module:
    """The HF causal LM equal to ``model`` (same weights, dtype and device; eval mode).

    Built on the meta device and filled with ``load_state_dict(strict=True, assign=True)``,
    so no random initialisation runs (and the global RNG is untouched).
    """
    tf = require_transformers("exporting to Hugging Face")
    config = hf_config(model)
    cls = tf.Mamba2ForCausalLM if config.model_type == "mamba2" else tf.MambaForCausalLM
    with torch.device("meta"):
        hf = cls(config)
    weights = hf_state_dict(model)
    expected = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in weights.items()}
    if expected != got:  # a transformers version with other names or shapes
        diff = sorted(set(expected.items()) ^ set(got.items()))
        raise DynlabInputError(f"this transformers version lays out {cls.__name__} differently: {diff[:4]}")
    hf.load_state_dict(weights, strict=True, assign=True)
    dtype = model.embedding.weight.dtype
    hf.config.dtype = dtype
    return hf.eval()


def _run_record(run: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """A run folder's ``spec.json``, ``result.json`` (None when unreadable) and run id (the
    spec's hash): a study's LM or task run, or a run ``dynlab lm post-train`` wrote."""
    import json

    from dynlab.lm.train.posttrain import PostTrainSpec
    from dynlab.lm.spec import LMRunSpec, LMTaskRunSpec
    from dynlab.spec import load_spec

    doc = json.loads((run / "spec.json").read_text())
    kinds = {"LMRunSpec": LMRunSpec, "LMTaskRunSpec": LMTaskRunSpec, "PostTrainSpec": PostTrainSpec}  # every LM run kind
    spec = load_spec(doc, kinds[doc["spec"]])
    try:
        result = json.loads((run / "result.json").read_text())
    except (OSError, ValueError):
        result = None
    return doc, result, spec.spec_hash()


def _model_info(hf: nn.Module) -> dict[str, Any]:
    """What the model card says of the exported model's layout (its HF config)."""
    c = hf.config
    return {"model_type": c.model_type, "architecture": type(hf).__name__,
            "n_params": sum(p.numel() for p in hf.parameters()), "dtype": str(next(hf.parameters()).dtype).split(".")[-1],
            "d_model": c.hidden_size, "n_layers": c.num_hidden_layers, "n_heads": getattr(c, "num_heads", None),
            "head_dim": getattr(c, "head_dim", None), "d_state": c.state_size, "expand": c.expand,
            "conv_kernel": c.conv_kernel, "chunk_size": getattr(c, "chunk_size", None)}


def check_export_folder(out: Path, what: str) -> None:
    """Refuse an export folder that dynlab must not write in, before anything is loaded: a
    run or study folder, a folder inside one, or a folder holding files an export did not
    write.  A folder is an earlier export when it holds :data:`dynlab.names.HF_EXPORT_MARKER`
    (or, from before the marker, only export file names with dynlab's model card as
    README.md); file names alone do not make one (a user's README.md or another model's
    config.json would be replaced)."""
    refuse_foreign_folder(out, what, own=HF_EXPORT_FILES, allowed=HF_EXPORT_ALLOWED)  # a folder inside one too
    check_owned_folder(out, HF_EXPORT_MARKER, HF_EXPORT_FILES, what, HF_EXPORT_ALLOWED, legacy=_card_of_dynlab)


def _card_of_dynlab(folder: Path) -> bool:
    """Whether ``folder/README.md`` is the model card an export writes (:func:`dynlab.lm.hub.card.model_card`)."""
    try:
        return "tags: [dynlab," in (folder / "README.md").read_text(encoding="utf-8", errors="replace")[:2000]
    except OSError:
        return False


def export_hf(model_or_run_folder: RecurrentLM | str | Path, out_dir: str | Path,
              dtype: torch.dtype | None = None, license: str = DEFAULT_LICENSE) -> Path:
    """Write ``model_or_run_folder`` as a Hugging Face folder ``out_dir``: config.json +
    model.safetensors, the tokenizer the run was trained with (tokenizer.json,
    tokenizer_config.json; the byte-level one for a model given as such) and
    the model card README.md (:mod:`dynlab.lm.hub.card`).

    ``model_or_run_folder`` is a :class:`RecurrentLM` or a dynlab LM run folder
    (``spec.json`` + ``model.safetensors``, loaded with
    :func:`dynlab.lm.hub.checkpoint.load_checkpoint`). ``dtype`` casts the weights (None: kept).
    ``license``: the card's license, a Hub identifier (:mod:`dynlab.lm.hub.card`; ``unknown``: not
    stated, the default, as the weights are the exporter's to license). Returns ``out_dir``.
    """
    check_license(license)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise DynlabInputError(f"export folder {str(out)!r} is a file; allowed: a folder (new or existing)")
    check_export_folder(out, "export folder")
    model = model_or_run_folder
    spec_doc = result = run_id = None
    tokenizer = TokenizerSpec()
    if isinstance(model, (str, Path)):
        from dynlab.lm.hub.checkpoint import load_checkpoint

        run = Path(model).expanduser()
        if not (run / "spec.json").is_file():
            raise _refuse(f"{str(model)!r} is not a dynlab LM run folder (no spec.json)",
                          "a dynlab RecurrentLM or its run folder (spec.json + model.safetensors)")
        model, meta = load_checkpoint(run)
        spec_doc, result, run_id = _run_record(run)
        tokenizer = TokenizerSpec.model_validate(meta.get("tokenizer") or {})
    tok = tokenizer.make()  # refused here, before anything is written, when its file moved or changed
    hf = to_hf(model)
    if tok.eos_id is not None:  # a subword tokenizer's end-of-document id, not id 0
        hf.config.pad_token_id = hf.config.bos_token_id = hf.config.eos_token_id = tok.eos_id
    if dtype is not None:
        hf = hf.to(dtype)
        hf.config.dtype = dtype
    for folder in (out, out.absolute().parent):  # the export is written beside the folder, then renamed into place
        problem = probe_folder(folder)
        if problem is not None:
            where = "" if folder == out else f": {folder}"
            raise DynlabInputError(f"export folder {str(out)!r}{where} {problem}; allowed: a writable folder (made "
                                   "when missing) in a writable folder")
    from dynlab.lm.hub.card import model_card

    card = model_card(_model_info(hf), spec_doc, result, run_id, license)

    def write(folder: Path) -> None:
        hf.save_pretrained(str(folder), safe_serialization=True)
        tok.save(folder)  # the tokenizer the model was trained with
        (folder / "README.md").write_text(card, encoding="utf-8")

    _write_export(out, write)
    return out


def _write_export(out: Path, write: Callable[[Path], None]) -> None:
    """Write an export into a temporary folder beside ``out`` (its marker first, then
    ``write(folder)``: the weights, the tokenizer, the card) and rename it to ``out`` once
    complete (:func:`dynlab.results.files.replace_folder`; an earlier export there is
    replaced).  A failure (a full disk, Ctrl-C) removes the temporary folder and the
    folders made for it: ``out`` stays as it was, and a fresh export leaves nothing."""
    from dynlab.results.files import make_dir, missing_folders, remove_empty_folders, replace_folder, staging_folder

    out = out.absolute()
    made = missing_folders(out.parent)
    make_dir(out.parent)
    tmp = staging_folder(out)
    try:
        claim_owned_folder(tmp, HF_EXPORT_MARKER)  # the marker first: a later export knows the folder as its own
        write(tmp)
        for path in tmp.iterdir():  # save_pretrained makes some files 0600 (temporary files renamed): the umask's mode
            if path.is_file() and not path.name.startswith("."):
                path.chmod(0o666 & ~current_umask())
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        remove_empty_folders(made)
        raise
