"""Post-training of a pretrained recurrent LM with an initial-state intervention (paper B; docs/length-generalization.md).

Paper B applies its interventions to *pretrained* checkpoints for a short budget (100
steps on Mamba-2 370M–1.3B; 500–1000 steps of state passing in its Fig. 1) and then
evaluates far beyond the training length. :func:`post_train` does the same for

- any finished dynlab LM run: a run folder ``.../runs/<run_id>/`` holding ``spec.json``
  (an ``LMRunSpec`` or ``LMTaskRunSpec``) and ``model.safetensors``;
- a Hugging Face ``transformers`` ``Mamba2ForCausalLM`` or ``MambaForCausalLM`` folder
  (``config.json`` + weights), loaded with ``from_pretrained(path)`` from local files and
  run through :class:`dynlab.lm.hub.hf.HFRecurrentLM` (initial states through the model's
  own cache).

The text is read through one tokenizer (:mod:`dynlab.lm.data.tokenizer`): the one given
(``--tokenizer``), else the checkpoint's own — the ``tokenizer.json`` in a Hugging Face
folder, the tokenizer a dynlab run was trained with — else the UTF-8 bytes, which only a
model of exactly 256 ids may read (:func:`checkpoint_tokenizer`). A tokenizer whose ids do
not fit the model's vocabulary is refused before anything is written.

Post-training data is the text (``data``; windows of ``train.seq_len`` tokens, the
intervention's own loader, so TBTT gets consecutive chunks) or, when ``task`` is given,
task samples with the loss on the scored tokens only (paper B fine-tunes passkey with
fitted noise). Evaluation is the same as for trained runs: PPL(t), Definition 3.2,
EffRem and state statistics from the zero state at ``eval.length_multiple ×
train.seq_len`` tokens (:func:`dynlab.lm.run.text.evaluate_lm`), plus the task accuracies
(:func:`dynlab.lm.run.task.evaluate_task`) when ``task`` is given. With ``steps = 0``
the model and every number are those of the checkpoint itself.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import xarray as xr
from pydantic import Field, ValidationInfo, model_validator

from dynlab.spec import MAX_LENGTH, Batch, Seed, Spec, StepsOrZero
from dynlab.errors import DynlabInputError
from dynlab.names import TBTT, TBTT_ON_TASKS
from dynlab.lm.hub.checkpoint import (  # noqa: F401 - this module's names since before checkpoint.py
    checkpoint_digest, checkpoint_tokenizer, load_checkpoint, model_vocab,
)
from dynlab.lm.train.distributed import barrier, current_world, remove_train_state
from dynlab.lm.hub.hf import HFRecurrentLM
from dynlab.lm.data.tokenizer import check_fits
from dynlab.lm.analysis.metrics import log_binned_ppl
from dynlab.lm.dataset import result_to_dataset
from dynlab.lm.run.text import data_corpus, evaluate_lm
from dynlab.lm.spec import (
    InterventionSpec, LMDataSpec, LMEvalSpec, LMModelSpec, LMTaskRunSpec, LMTaskSpec, TaskEvalSpec,
    Precision, TaskTrainSpec, check_eval_size, check_task_lengths,
)
from dynlab.lm.run.task import evaluate_task, task_result_to_dataset, train_task
from dynlab.lm.train.engine import train_lm, train_summary
from dynlab.results.vocabulary import annotate
from dynlab.runtime import MAX_THREADS, resolve_device, train_threads

__all__ = ["PostTrainSpec", "PostTrainTrainSpec", "load_checkpoint", "checkpoint_digest", "checkpoint_tokenizer", "post_train",
           "post_train_dataset", "run_post_train"]


class PostTrainTrainSpec(Spec):
    """The short post-training budget: AdamW, warm-up and cosine decay (as in training); ``steps = 0`` allowed;
    ``precision`` as :class:`~dynlab.lm.spec.LMTrainSpec`'s (left out of the run id while fp32).
    ``batch_size`` is each process's micro-batch; a step reads ``accum`` of them in each of
    ``processes`` processes (``torchrun``, :mod:`dynlab.lm.train.distributed`): ``batch_size ×
    accum × processes × seq_len`` tokens a step (``--batch-tokens``). Both are left out of
    the run id at 1."""

    hash_omit_at_default: ClassVar[tuple[str, ...]] = ("precision", "accum", "processes")

    steps: StepsOrZero = 100
    batch_size: Batch = 16
    seq_len: int = Field(64, ge=2, le=MAX_LENGTH)
    lr: float = Field(3e-4, gt=0.0, le=10.0, allow_inf_nan=False)
    weight_decay: float = Field(0.1, ge=0.0)
    clip: float = Field(1.0, gt=0.0)
    warmup_frac: float = Field(0.1, ge=0.0, le=1.0)
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)
    precision: Precision = "fp32"
    accum: int = Field(1, ge=1, le=4096)
    processes: int = Field(1, ge=1, le=4096)


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
    def _eval_fits(self, info: ValidationInfo) -> PostTrainSpec:
        if self.task is None:  # a task run is scored on its task lengths, not on a stream
            check_eval_size(self.train.seq_len, self.eval.length_multiple, self.eval.n_samples)
        elif not (info.context and info.context.get("stored")):  # in the tokens of the text's tokenizer
            check_task_lengths(self.task, self.data.tokenizer)
        return self

    def task_spec(self) -> LMTaskRunSpec:
        """The task run spec used to train on and score ``task`` (its model fields are unused)."""
        if self.task is None:
            raise ValueError("this post-training run has no task")
        tr = self.train
        vocab = max(LMModelSpec().vocab_size, self.data.tokenizer.n_ids)  # the model's fields are unused
        fields = dict(data=self.data, model=LMModelSpec(vocab_size=vocab), intervention=self.intervention,
                      task=self.task,
                      train=TaskTrainSpec(steps=tr.steps, batch_size=tr.batch_size, lr=tr.lr,
                                          weight_decay=tr.weight_decay, clip=tr.clip, warmup_frac=tr.warmup_frac,
                                          threads=tr.threads, precision=tr.precision),
                      eval=self.task_eval, seed=self.seed)
        # the checkpoint's model is trained, not one of these fields: no memory estimate from them
        return LMTaskRunSpec.model_validate(fields, context={"checkpoint_model": True})


#: Steps between two saves of a text post-training's state (its ``resume`` file).
SAVE_EVERY = 25


def post_train(spec: PostTrainSpec, device: torch.device | str = "cpu",
               progress: Callable[[int, float], None] | None = None,
               model: torch.nn.Module | None = None, resume: Path | None = None) -> tuple[dict[str, Any], torch.nn.Module]:
    """Post-train the checkpoint of ``spec`` with its intervention, then evaluate. Returns (result, model).

    ``result`` holds ``status``, ``train_loss`` (mean over the last 5 % of the steps; NaN
    for 0 steps), ``train_time`` and the evaluation of :func:`dynlab.lm.run.text.evaluate_lm`
    (and ``task`` accuracies when ``spec.task`` is set). ``model`` may pass the already
    loaded checkpoint. ``resume``: the text post-training's state, saved every
    :data:`SAVE_EVERY` steps and continued from when it exists (:mod:`dynlab.lm.train.distributed`).
    """
    if spec.task is not None and spec.intervention.kind == TBTT:
        raise DynlabInputError(TBTT_ON_TASKS)
    if model is None:
        model, _ = load_checkpoint(spec.checkpoint)
    corpus = data_corpus(spec.data)
    tr, dev = spec.train, resolve_device(device)
    with train_threads(dev, threads=tr.threads):
        if spec.task is not None:
            res = train_task(model, spec.task_spec(), dev, progress)
        else:
            res = train_lm(model, corpus.train, spec.intervention.make(),
                           steps=tr.steps, batch_size=tr.batch_size, seq_len=tr.seq_len, lr=tr.lr,
                           weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac,
                           seed=spec.seed, device=str(dev), threads=tr.threads, progress=progress,
                           precision=tr.precision, accum=tr.accum, resume=resume, save_every=SAVE_EVERY)
        result = train_summary(res, warm_start=True)  # it starts from a trained checkpoint
        world = current_world()
        if res.status != "ok" or (world is not None and not world.main):  # rank 0 alone evaluates
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
    """The LM evaluation of one post-training run (dims ``t``, ``t_log``, ``layer``, ``head``; task accuracies as ``task_*``)."""
    ds = result_to_dataset(result)
    ds["ppl_log"] = log_binned_ppl(ds["ppl"])  # PPL(t) on log-spaced bins, paper B's Fig. 1 axis
    if "task" in result and spec.task is not None:
        task = task_result_to_dataset(result["task"], spec.task.kind)
        ds = ds.merge(task.rename({k: f"task_{k}" for k in task.data_vars}))
    annotate(ds)
    ds.attrs.update(checkpoint=spec.checkpoint, intervention=spec.intervention.kind, steps=spec.train.steps,
                    train_length=spec.train.seq_len, precision=spec.train.precision, spec=spec.canonical_json())
    return ds



def run_post_train(spec: PostTrainSpec, out: str | Path, device: str = "auto",
                   progress: Callable[[int, float], None] | None = None) -> Path:
    """Post-train and store under ``out/post-train/runs/<run id>/`` (result.json, model.safetensors, dataset.nc).

    An HF checkpoint is also saved with ``save_pretrained`` under ``hf/`` in that folder, so
    the post-trained model can be loaded again (and post-trained again). A finished run is
    reused; one a killed post-training left without its dataset (or ``hf/``) is made again.
    A post-training that fails (a full disk, Ctrl-C) leaves no run folder and no empty
    ``runs/``; its training state stays under ``post-train/resume/`` (saved every
    :data:`SAVE_EVERY` steps), so that a rerun continues from it. Returns the run folder.
    """
    from dynlab.results.files import missing_folders, remove_empty_folders
    from dynlab.results.store import RunStore

    dev = resolve_device(device)
    from dynlab.kernels.dispatch import forced_backend_problem

    problem = forced_backend_problem()  # a backend this machine cannot run: the user's choice
    if problem is not None:
        raise DynlabInputError(problem)
    model, meta = load_checkpoint(spec.checkpoint)  # refuses a non-model before anything is written
    check_fits(spec.data.tokenizer, model_vocab(model), f"checkpoint {spec.checkpoint!r}")
    world = current_world()  # under torchrun every rank trains, rank 0 alone evaluates and writes
    if (world.size if world else 1) != spec.train.processes:
        raise DynlabInputError(f"this run was specified for {spec.train.processes} process(es) but "
                               f"{world.size if world else 1} run it (torchrun --nproc_per_node)")
    store = RunStore(Path(out).expanduser() / "post-train")
    path = store.path(spec)
    if store.is_done(spec):
        if _complete(path, isinstance(model, HFRecurrentLM)):
            return path
        if world is None or world.main:
            shutil.rmtree(path)  # its evaluation was never written (a killed post-training): made again
    state = store.root / "resume" / spec.spec_hash()  # a killed post-training continues from its last save
    if world is None or world.main:
        state.parent.mkdir(parents=True, exist_ok=True)
    barrier(world)
    result, model = post_train(spec, dev, progress, model=model, resume=state if spec.train.steps else None)
    if world is not None and not world.main:  # rank 0 writes the run
        return path
    result["checkpoint_meta"] = meta
    ok = result["status"] == "ok"
    # copies: tied weights (Mamba-1's head and embedding) are separate tensors in the file
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()} if ok else None
    made = missing_folders(store.runs)
    try:
        store.save(spec, result, weights)
        if ok:
            _write_evaluation(spec, result, model, path)
    except BaseException:
        if store.changed:  # a run without its evaluation would be reused as finished
            shutil.rmtree(path, ignore_errors=True)
        remove_empty_folders(made)
        raise
    remove_train_state(state)  # the run is stored: its training state is not needed
    remove_empty_folders([state.parent])
    return path


def _complete(path: Path, hf: bool) -> bool:
    """Whether the finished post-training run in ``path`` holds its evaluation: a run that
    did not end ``ok`` keeps none; an ``ok`` one its ``dataset.nc`` (and, from a Hugging
    Face checkpoint, ``hf/``)."""
    import json

    try:
        status = json.loads((path / "result.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return False
    return status != "ok" or ((path / "dataset.nc").is_file() and (not hf or (path / "hf").is_dir()))


def _write_evaluation(spec: PostTrainSpec, result: dict[str, Any], model: torch.nn.Module, path: Path) -> None:
    """Add the evaluation to the stored run in ``path``: ``dataset.nc`` and, for a Hugging
    Face checkpoint, ``hf/`` (written beside it, then renamed: a folder there is whole)."""
    import os

    from dynlab.results.schema import annotate, write_dataset

    write_dataset(annotate(post_train_dataset(spec, result)), path / "dataset.nc")
    if isinstance(model, HFRecurrentLM):
        tmp = path / f".hf.tmp-{os.getpid()}"
        model.hf.save_pretrained(str(tmp))
        spec.data.tokenizer.make().save(tmp)  # the post-trained folder loads with its tokenizer again
        os.rename(tmp, path / "hf")
