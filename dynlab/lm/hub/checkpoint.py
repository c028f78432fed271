"""Loading the models LM runs start from: a spec's fresh model (:func:`build_model`), a
finished dynlab LM run or a Hugging Face Mamba / Mamba-2 folder (:func:`load_checkpoint`),
a run's pretrained starting point (:func:`load_init`), and the tokenizer a checkpoint is
read with (:func:`checkpoint_tokenizer`).

A checkpoint is read with the tokenizer it was trained with: the ``tokenizer.json`` in a
Hugging Face folder, or the one a dynlab run's spec records; without one, only a model of
exactly 256 ids reads UTF-8 bytes. A tokenizer whose ids do not fit the model's vocabulary
is refused before anything is written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from dynlab.errors import DynlabInputError
from dynlab.lm.hub.hf import hf_config_summary, is_hf_checkpoint, load_hf_checkpoint
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.spec import LMDataSpec, LMRunSpec, LMTaskRunSpec
from dynlab.lm.data.tokenizer import BYTE_VOCAB, HFTokenizer, TokenizerSpec, check_fits
from dynlab.spec import load_spec

__all__ = ["build_model", "checkpoint_config", "checkpoint_digest", "checkpoint_model_fields", "checkpoint_tokenizer",
           "load_checkpoint", "load_init", "model_vocab"]


def build_model(spec: LMRunSpec, init_seed: int | None = None) -> RecurrentLM:
    """The untrained model of ``spec``, parameters drawn from a generator seeded with
    ``init_seed`` (None: ``spec.seed``); with ``spec.init``, the checkpoint's model
    (:func:`load_init`)."""
    if getattr(spec, "init", None) is not None:
        return load_init(spec)
    m = spec.model
    seed = spec.seed if init_seed is None else init_seed
    return RecurrentLM(m.mixer, d_model=m.d_model, n_layers=m.n_layers, mlp_ratio=m.mlp_ratio, norm_eps=m.norm_eps,
                       vocab_size=m.vocab_size,
                       generator=torch.Generator().manual_seed(seed), **m.mixer_kwargs())


def load_init(spec: LMRunSpec) -> torch.nn.Module:
    """The pretrained model ``spec.init`` names (:func:`dynlab.lm.hub.checkpoint.load_checkpoint`),
    refused in one line when its files changed since the spec was made or its vocabulary
    does not hold the data's tokenizer."""
    assert spec.init is not None
    path = spec.init.checkpoint
    if checkpoint_digest(path) != spec.init.sha256:
        raise DynlabInputError(f"checkpoint {path!r} changed since the study was made (its SHA-256 differs); "
                               "allowed: the checkpoint the run names, unchanged, or a new study folder")
    model, _ = load_checkpoint(path)
    check_fits(spec.data.tokenizer, model_vocab(model), f"checkpoint {path!r}")
    return model



def _not_a_model(path: Path, why: str) -> DynlabInputError:
    return DynlabInputError(
        f"checkpoint {str(path)!r} is not a model ({why}); allowed: a dynlab LM run folder "
        "(spec.json + model.safetensors) or a Hugging Face Mamba/Mamba2 folder (config.json + weights)"
    )


def load_checkpoint(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """Load a dynlab LM run or an HF Mamba/Mamba2 folder. Returns (model in eval mode, provenance dict).

    The provenance holds ``kind`` (``dynlab`` | ``hf``), the mixer/model type and, for a
    dynlab run, its spec's training length ``seq_len``.
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        raise _not_a_model(p, "a file, not a folder" if p.exists() else "no such folder")
    if (p / "spec.json").is_file():
        if not (p / "model.safetensors").is_file():
            raise _not_a_model(p, "a dynlab run without model.safetensors: it did not finish or diverged")
        _check_run_folder(p)
        try:
            doc = json.loads((p / "spec.json").read_text())
            if isinstance(doc, dict) and doc.get("spec") == "PostTrainSpec":
                return _load_post_trained(p, doc)
            cls = {"LMRunSpec": LMRunSpec, "LMTaskRunSpec": LMTaskRunSpec}[doc["spec"]]
            spec = load_spec(doc, cls)
        except KeyError:
            raise _not_a_model(p, "its spec.json is not an LM run spec") from None
        except (json.JSONDecodeError, TypeError, ValueError, OSError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _not_a_model(p, f"unreadable spec.json: {why}") from None
        if getattr(spec, "init", None) is not None:
            raise _not_a_model(p, "a run of a pretrained checkpoint keeps no weights of its own; its checkpoint "
                                  f"is {spec.init.checkpoint!r}")  # type: ignore[union-attr]
        model = build_model(spec)  # type: ignore[arg-type]
        try:
            weights = load_file(str(p / "model.safetensors"))
            # a task run also stores its post-training arms (post.<intervention>.<name>): the checkpoint is the trained model
            model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("post.")})
        except Exception as exc:  # safetensors and load_state_dict raise their own error types
            raise _not_a_model(p, f"weights do not load: {type(exc).__name__}") from None
        seq_len = spec.train.seq_len if isinstance(spec, LMRunSpec) else spec.task.train_max
        return model.eval(), {"kind": "dynlab", "mixer": spec.model.mixer, "spec": doc["fields"], "seq_len": seq_len,
                              "tokenizer": spec.data.tokenizer.model_dump()}
    if (p / "config.json").is_file():
        if not is_hf_checkpoint(p):
            raise _not_a_model(p, "config.json names no mamba2 or mamba model_type")
        if not any(p.glob("*.safetensors")) and not any(p.glob("pytorch_model*.bin")):
            raise _not_a_model(p, "a Hugging Face config.json without weights: no *.safetensors or pytorch_model.bin")
        model = load_hf_checkpoint(p)
        own = HFTokenizer(p).spec().model_dump() if (p / "tokenizer.json").is_file() else None
        return model.eval(), {"kind": "hf", "mixer": model.mixer_name, "config": hf_config_summary(model),
                              "tokenizer": own}
    raise _not_a_model(p, "neither spec.json nor config.json in it")


def _load_post_trained(p: Path, doc: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A run written by ``lm post-train`` (its spec.json a ``PostTrainSpec``), as a model:
    a post-trained Hugging Face model from the ``hf/`` folder saved with it; a post-trained
    dynlab model built from its original run's spec (``checkpoint_meta`` in result.json)
    with the post-trained weights.  The training length is the post-training's."""
    if (p / "hf").is_dir():
        model, meta = load_checkpoint(p / "hf")
        return model, {**meta, "post_trained": True, "seq_len": doc["fields"]["train"]["seq_len"],
                       "tokenizer": _post_tokenizer(doc)}
    try:
        meta = json.loads((p / "result.json").read_text())["checkpoint_meta"]
        fields, seq_len = meta["spec"], int(doc["fields"]["train"]["seq_len"])
    except (OSError, ValueError, KeyError, TypeError):
        raise _not_a_model(p, "a post-train run whose result.json does not name its model's spec") from None
    spec = None
    for cls in (LMRunSpec, LMTaskRunSpec):
        try:
            spec = load_spec(fields, cls)
            break
        except ValueError:
            continue
    if meta.get("kind") != "dynlab" or spec is None:
        raise _not_a_model(p, "a post-train run whose model spec does not read")
    model = build_model(spec)  # type: ignore[arg-type]
    try:
        model.load_state_dict(load_file(str(p / "model.safetensors")))
    except Exception as exc:  # safetensors and load_state_dict raise their own error types
        raise _not_a_model(p, f"weights do not load: {type(exc).__name__}") from None
    return model.eval(), {"kind": "dynlab", "mixer": spec.model.mixer, "spec": fields, "seq_len": seq_len,
                          "post_trained": True, "tokenizer": _post_tokenizer(doc)}


def _post_tokenizer(doc: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer a post-training run read its text with (its spec's data)."""
    return LMDataSpec.model_validate(doc["fields"].get("data", {}), context={"stored": True}).tokenizer.model_dump()


def model_vocab(model: torch.nn.Module) -> int:
    """Rows of a loaded model's embedding: the ids it can read."""
    return int(model.vocab_size)


def checkpoint_tokenizer(meta: dict[str, Any], model: torch.nn.Module, given: TokenizerSpec | None = None,
                         path: str | Path = "") -> TokenizerSpec:
    """The tokenizer a checkpoint is read with: its own (``meta["tokenizer"]``, from
    :func:`load_checkpoint`; a ``given`` one, ``--tokenizer``, must be the same), else
    ``given``, else the byte tokenizer when the model has exactly 256 ids; checked to fit the
    model's vocabulary. One line otherwise."""
    vocab = model_vocab(model)
    own = meta.get("tokenizer")
    if given is not None and own:
        mine = TokenizerSpec.model_validate(own)
        if (mine.kind, mine.sha256) != (given.kind, given.sha256):
            raise DynlabInputError(f"checkpoint {str(path)!r} was trained with the tokenizer {mine.label}, not "
                                   f"{given.label}; allowed: its own tokenizer (leave --tokenizer out)")
    if given is not None:
        tok = given
    elif own:
        tok = TokenizerSpec.model_validate(meta["tokenizer"])
    elif vocab == BYTE_VOCAB:
        tok = TokenizerSpec()
    else:
        raise DynlabInputError(f"checkpoint {str(path)!r} has a vocabulary of {vocab} ids and no tokenizer.json; "
                               f"allowed: --tokenizer PATH (the tokenizer it was trained with), or a checkpoint "
                               f"folder holding its tokenizer.json (the byte tokenizer fits only {BYTE_VOCAB} ids)")
    check_fits(tok, vocab, f"checkpoint {str(path)!r}")
    return tok


def _check_run_folder(p: Path) -> None:
    """Refuse a dynlab run folder whose run files (spec.json, result.json,
    model.safetensors) fail its ``checksums.json`` — a changed byte, a truncated or
    missing file, an unreadable checksum list — or whose run did not end with weights.
    Reads only; the folder may have any name and sit anywhere. A folder written before
    checksums existed (no ``checksums.json``) is taken as it is."""
    from dynlab.results.store import CHECKSUMS, CORE_FILES, file_problem

    if not (p / CHECKSUMS).exists():
        return
    try:
        listed = json.loads((p / CHECKSUMS).read_text())["files"]
        if not isinstance(listed, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _not_a_model(p, f"damaged run ({CHECKSUMS} unreadable: {type(exc).__name__})") from None
    bad = []
    for name in CORE_FILES:
        want = listed.get(name)
        if (p / name).is_file() and not isinstance(want, dict):
            problem: str | None = f"not in {CHECKSUMS}"
        else:
            problem = file_problem(p / name, want or {})
        if problem is not None:
            bad.append(f"{name}: {problem}")
    if bad:
        raise _not_a_model(p, f"damaged run ({'; '.join(bad)})")
    try:
        status = json.loads((p / "result.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        raise _not_a_model(p, "unreadable result.json") from None
    if status not in ("ok", "not-learned"):
        raise _not_a_model(p, f"its run ended {status!r}, not with trained weights")


def checkpoint_config(meta: dict[str, Any]) -> dict[str, Any]:
    """What a run records of its checkpoint's own layout (``LMInitSpec.config``; ``meta`` of
    :func:`load_checkpoint`): a Hugging Face config's summary
    (:func:`dynlab.lm.hub.hf.hf_config_summary`) or a dynlab run's model fields."""
    return dict(meta.get("config") or meta.get("spec", {}).get("model") or {})


def checkpoint_model_fields(model: torch.nn.Module, meta: dict[str, Any]) -> dict[str, Any]:
    """:class:`~dynlab.lm.spec.LMModelSpec` fields that describe a loaded checkpoint for the dataset's
    coordinates: its mixer, width, layers and vocabulary (its other sizes stay in its own
    config; the run's ``n_params`` counts the loaded model)."""
    if meta.get("kind") == "dynlab":
        m = meta["spec"]["model"]
        return {"mixer": m.get("mixer", "mamba2"), "d_model": m["d_model"], "n_layers": m["n_layers"], "mlp_ratio": 0,
                "vocab_size": int(model.vocab_size)}
    c = meta["config"]
    return {"mixer": "mamba2" if c.get("model_type") == "mamba2" else "mamba1", "d_model": c["hidden_size"],
            "n_layers": c["num_hidden_layers"], "mlp_ratio": 0, "vocab_size": int(model.vocab_size)}


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 over the names and bytes of the checkpoint's weight and config files (part of
    the run id), read in blocks; a post-training run's ``hf/`` folder, where its weights load
    from, counts too (its files named ``hf/<name>``)."""
    p = Path(path)
    h = hashlib.sha256()
    files = [f for f in sorted(p.iterdir()) if f.is_file()]
    if (p / "hf").is_dir() and (p / "spec.json").is_file():
        files += [f for f in sorted((p / "hf").iterdir()) if f.is_file()]
    for f in files:
        if f.suffix in (".safetensors", ".json", ".bin"):
            h.update(f.relative_to(p).as_posix().encode())
            with f.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 24), b""):
                    h.update(block)
    return h.hexdigest()


