"""Post-training of a pretrained recurrent LM with an initial-state intervention (paper B; docs/length-generalization.md).

Paper B applies its interventions to *pretrained* checkpoints for a short budget (100
steps on Mamba-2 370M–1.3B; 500–1000 steps of state passing in its Fig. 1) and then
evaluates far beyond the training length. :func:`post_train` does the same for

- any finished dynlab LM run: a run folder ``.../runs/<run_id>/`` holding ``spec.json``
  (an ``LMRunSpec`` or ``LMTaskRunSpec``) and ``model.safetensors``;
- a Hugging Face ``transformers`` ``Mamba2ForCausalLM`` or ``MambaForCausalLM`` folder
  (``config.json`` + weights), loaded with ``from_pretrained(path)`` from local files and
  run through :class:`dynlab.lm.hf.HFRecurrentLM` (initial states through the model's
  own cache). Tokens are bytes (0–255), so the model's vocabulary must hold 256 ids.

Post-training data is the text (``data``; windows of ``train.seq_len`` tokens, the
intervention's own loader, so TBTT gets consecutive chunks) or, when ``task`` is given,
task samples with the loss on the scored tokens only (paper B fine-tunes passkey with
fitted noise). Evaluation is the same as for trained runs: PPL(t), Definition 3.2,
EffRem and state statistics from the zero state at ``eval.length_multiple ×
train.seq_len`` tokens (:func:`dynlab.lm.run.evaluate_lm`), plus the task accuracies
(:func:`dynlab.lm.task_run.evaluate_task`) when ``task`` is given. With ``steps = 0``
the model and every number are those of the checkpoint itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xarray as xr
from pydantic import Field, model_validator
from safetensors.torch import load_file

from dynlab.spec import MAX_LENGTH, Batch, Seed, Spec, StepsOrZero, load_spec
from dynlab.errors import DynlabInputError
from dynlab.names import TBTT, TBTT_ON_TASKS
from dynlab.lm.hf import HFRecurrentLM, hf_config_summary, is_hf_checkpoint, load_hf_checkpoint
from dynlab.lm.dataset import result_to_dataset
from dynlab.lm.run import build_model, corpus_for, evaluate_lm
from dynlab.lm.spec import (
    InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMRunSpec, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec,
    TaskTrainSpec, check_eval_size,
)
from dynlab.lm.task_run import evaluate_task, task_result_to_dataset, train_task
from dynlab.lm.train import train_lm, train_summary
from dynlab.results.vocabulary import annotate
from dynlab.runtime import MAX_THREADS, resolve_device, train_threads

__all__ = ["PostTrainSpec", "PostTrainTrainSpec", "load_checkpoint", "checkpoint_digest", "post_train",
           "post_train_dataset", "run_post_train"]


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
        model = build_model(spec)  # type: ignore[arg-type]
        try:
            weights = load_file(str(p / "model.safetensors"))
            # a task run also stores its post-training arms (post.<intervention>.<name>): the checkpoint is the trained model
            model.load_state_dict({k: v for k, v in weights.items() if not k.startswith("post.")})
        except Exception as exc:  # safetensors and load_state_dict raise their own error types
            raise _not_a_model(p, f"weights do not load: {type(exc).__name__}") from None
        seq_len = spec.train.seq_len if isinstance(spec, LMRunSpec) else spec.task.train_max
        return model.eval(), {"kind": "dynlab", "mixer": spec.model.mixer, "spec": doc["fields"], "seq_len": seq_len}
    if (p / "config.json").is_file():
        if not is_hf_checkpoint(p):
            raise _not_a_model(p, "config.json names no mamba2 or mamba model_type")
        if not any(p.glob("*.safetensors")) and not any(p.glob("pytorch_model*.bin")):
            raise _not_a_model(p, "a Hugging Face config.json without weights: no *.safetensors or pytorch_model.bin")
        model = load_hf_checkpoint(p)
        if model.vocab_size < 256:
            raise _not_a_model(p, f"vocabulary of {model.vocab_size} ids; byte tokens need >= 256")
        return model.eval(), {"kind": "hf", "mixer": model.mixer_name, "config": hf_config_summary(model)}
    raise _not_a_model(p, "neither spec.json nor config.json in it")


def _load_post_trained(p: Path, doc: dict[str, Any]) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A run written by ``lm post-train`` (its spec.json a ``PostTrainSpec``), as a model:
    a post-trained Hugging Face model from the ``hf/`` folder saved with it; a post-trained
    dynlab model built from its original run's spec (``checkpoint_meta`` in result.json)
    with the post-trained weights.  The training length is the post-training's."""
    if (p / "hf").is_dir():
        model, meta = load_checkpoint(p / "hf")
        return model, {**meta, "post_trained": True, "seq_len": doc["fields"]["train"]["seq_len"]}
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
                          "post_trained": True}


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


def checkpoint_digest(path: str | Path) -> str:
    """SHA-256 over the names and bytes of the checkpoint's weight and config files (part of the run id)."""
    p = Path(path)
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if f.is_file() and f.suffix in (".safetensors", ".json", ".bin"):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


class PostTrainTrainSpec(Spec):
    """The short post-training budget: AdamW, warm-up and cosine decay (as in training); ``steps = 0`` allowed."""

    steps: StepsOrZero = 100
    batch_size: Batch = 16
    seq_len: int = Field(64, ge=2, le=MAX_LENGTH)
    lr: float = Field(3e-4, gt=0.0, le=10.0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0.0)
    clip: float = Field(1.0, gt=0.0)
    warmup_frac: float = Field(0.1, ge=0.0, le=1.0)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)


class PostTrainSpec(Spec):
    """One post-training run: checkpoint (path and content digest), intervention, budget, data/task, evaluation."""

    checkpoint: str
    checkpoint_sha256: str
    data: LMDataSpec = LMDataSpec()
    intervention: InterventionSpec = InterventionSpec()
    train: PostTrainTrainSpec = PostTrainTrainSpec()
    eval: LMEvalSpec = LMEvalSpec()
    task: LMTaskSpec | None = None
    task_eval: TaskEvalSpec = TaskEvalSpec()
    seed: Seed = 0

    @model_validator(mode="after")
    def _eval_fits(self) -> PostTrainSpec:
        if self.task is None:  # a task run is scored on its task lengths, not on a stream
            check_eval_size(self.train.seq_len, self.eval.length_multiple, self.eval.n_samples)
        return self

    def task_spec(self) -> LMTaskRunSpec:
        """The task run spec used to train on and score ``task`` (its model fields are unused)."""
        if self.task is None:
            raise ValueError("this post-training run has no task")
        tr = self.train
        return LMTaskRunSpec(data=self.data, model=LMModelSpec(), intervention=self.intervention, task=self.task,
                             train=TaskTrainSpec(steps=tr.steps, batch_size=tr.batch_size, lr=tr.lr,
                                                 weight_decay=tr.weight_decay, clip=tr.clip,
                                                 warmup_frac=tr.warmup_frac, threads=tr.threads),
                             eval=self.task_eval, seed=self.seed)


def post_train(spec: PostTrainSpec, device: torch.device | str = "cpu",
               progress: Callable[[int, float], None] | None = None,
               model: torch.nn.Module | None = None) -> tuple[dict[str, Any], torch.nn.Module]:
    """Post-train the checkpoint of ``spec`` with its intervention, then evaluate. Returns (result, model).

    ``result`` holds ``status``, ``train_loss`` (mean over the last 5 % of the steps; NaN
    for 0 steps), ``train_time`` and the evaluation of :func:`dynlab.lm.run.evaluate_lm`
    (and ``task`` accuracies when ``spec.task`` is set). ``model`` may pass the already
    loaded checkpoint.
    """
    if spec.task is not None and spec.intervention.kind == TBTT:
        raise DynlabInputError(TBTT_ON_TASKS)
    if model is None:
        model, _ = load_checkpoint(spec.checkpoint)
    corpus = corpus_for(spec.data.source, spec.data.val_fraction)
    tr, dev = spec.train, resolve_device(device)
    with train_threads(dev, threads=tr.threads):
        if spec.task is not None:
            res = train_task(model, spec.task_spec(), dev, progress)
        else:
            res = train_lm(model, corpus.train, spec.intervention.make(),
                           steps=tr.steps, batch_size=tr.batch_size, seq_len=tr.seq_len, lr=tr.lr,
                           weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac,
                           seed=spec.seed, device=str(dev), threads=tr.threads, progress=progress)
        result = train_summary(res, warm_start=True)  # it starts from a trained checkpoint
        if res.status != "ok":
            return result, model
        model.eval()
        result.update(evaluate_lm(model, spec.eval, tr.seq_len, corpus))
        if not np.all(np.isfinite(result["ppl"])):  # finite training loss, but the weights no longer evaluate
            bad = int(np.argmin(np.isfinite(result["ppl"]))) + 1
            return {**train_summary(res, warm_start=True), "status": "diverged",
                    "reason": f"non-finite PPL in evaluation from t = {bad}"}, model
        if spec.task is not None:
            result["task"] = evaluate_task(model, spec.task_spec())
    return result, model


def post_train_dataset(spec: PostTrainSpec, result: dict[str, Any]) -> xr.Dataset:
    """The LM evaluation of one post-training run (dims ``t``, ``layer``, ``head``; task accuracies as ``task_*``)."""
    ds = result_to_dataset(result)
    if "task" in result and spec.task is not None:
        task = task_result_to_dataset(result["task"], spec.task.kind)
        ds = ds.merge(task.rename({k: f"task_{k}" for k in task.data_vars}))
    annotate(ds)
    ds.attrs.update(checkpoint=spec.checkpoint, intervention=spec.intervention.kind, steps=spec.train.steps,
                    train_length=spec.train.seq_len, spec=spec.canonical_json())
    return ds



def run_post_train(spec: PostTrainSpec, out: str | Path, device: str = "auto",
                   progress: Callable[[int, float], None] | None = None) -> Path:
    """Post-train and store under ``out/post-train/runs/<run id>/`` (result.json, model.safetensors, dataset.nc).

    An HF checkpoint is also saved with ``save_pretrained`` under ``hf/`` in that folder, so
    the post-trained model can be loaded again (and post-trained again). A finished run is
    reused. Returns the run folder.
    """
    from dynlab.results.schema import annotate, write_dataset
    from dynlab.results.store import RunStore

    dev = resolve_device(device)
    model, meta = load_checkpoint(spec.checkpoint)  # refuses a non-model before anything is written
    store = RunStore(Path(out) / "post-train")
    if store.is_done(spec):
        return store.path(spec)
    result, model = post_train(spec, dev, progress, model=model)
    result["checkpoint_meta"] = meta
    ok = result["status"] == "ok"
    weights = {k: v.detach().cpu() for k, v in model.state_dict().items()} if ok else None
    path = store.save(spec, result, weights)
    if ok:
        write_dataset(annotate(post_train_dataset(spec, result)), path / "dataset.nc")
        if isinstance(model, HFRecurrentLM):
            model.hf.save_pretrained(str(path / "hf"))
    return path
