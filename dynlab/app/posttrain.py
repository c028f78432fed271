"""``dynlab lm post-train``: a checkpoint post-trained with an initial-state intervention,
then evaluated; its options checked before anything is loaded, its output folder probed,
its :class:`~dynlab.lm.train.posttrain.PostTrainSpec` built with errors in the options' words."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynlab.app.checks import (DEFAULT_OUT, check_device, check_source_option, checkpoint_folder, in_range,
                               optional_path, out_folder)
from dynlab.app.folders import check_out
from dynlab.errors import DynlabInputError, in_option_words
from dynlab.names import INTERVENTION_NAMES, PRECISIONS, TBTT, TBTT_ON_TASKS

#: ``lm post-train --task`` kind -> the study whose quick preset gives its task grid.
POST_TRAIN_TASKS = {"copying": "copying", "passkey": "passkey", "babi": "babilong"}


def is_post_train_folder(folder: Path) -> bool:
    """Whether ``folder`` is the ``post-train/`` folder ``lm post-train`` writes in its
    ``--out``: it holds only ``runs/``, whose folders are run folders, and it is named
    ``post-train`` or one of its runs is a post-training (its ``spec.json``)."""
    import json
    import os

    from dynlab.results.folder import RUN_ID

    try:
        if {n for n in os.listdir(folder) if not n.startswith(".")} != {"runs"} or not (folder / "runs").is_dir():
            return False
        runs = [n for n in os.listdir(folder / "runs") if not n.startswith(".")]
    except OSError:
        return False
    if not all(RUN_ID.fullmatch(n) and (folder / "runs" / n).is_dir() for n in runs):
        return False
    if folder.name == "post-train":
        return True
    for name in runs[:8]:
        try:
            if json.loads((folder / "runs" / name / "spec.json").read_text()).get("spec") == "PostTrainSpec":
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def refuse_nested_post_train(out_dir: Path) -> None:
    """Refuse an ``--out`` that is (or lies in) the ``post-train/`` folder of an earlier
    ``--out``: the run would go to a second ``post-train/`` nested in it."""
    for folder in (out_dir, *out_dir.absolute().parents):
        if is_post_train_folder(folder):
            where = "is" if folder in (out_dir, out_dir.absolute()) else f"lies in {folder},"
            allowed = (f"--out {folder.parent} (its runs are reused)" if folder.name == "post-train"
                       else "another --out, not a folder of post-training runs")
            raise DynlabInputError(f"--out {out_dir} {where} the post-train folder of --out {folder.parent}: a "
                                   f"post-training writes OUT/post-train/runs/<id>, so this would nest a second "
                                   f"post-train/ in it; allowed: {allowed}")


def post_train_places(out: str, checkpoint: Path) -> tuple[Path, Path]:
    """The output folder of ``lm post-train``, checked (not a run or study folder, nor the
    ``post-train/`` folder of another ``--out``; ``OUT/post-train/runs`` probed), then
    ``--checkpoint`` checked to be a folder: both paths, ``~`` expanded."""
    out_dir = out_folder(out)
    from dynlab.outputs import refuse_foreign_folder

    refuse_foreign_folder(out_dir, "--out",
                          allowed="a folder of studies (made when missing), not a run or study folder")
    refuse_nested_post_train(out_dir)
    check_out(out_dir, "post-train", "post-train/runs")  # the run goes to OUT/post-train/runs/<id>
    return out_dir, checkpoint_folder(checkpoint)


def post_train_options(intervention: str, task: str | None, source: str, seq_len: int | None, steps: int,
                       batch_size: int, lr: float, length_multiple: int, samples: int, seed: int, device: str,
                       tokenizer: str | None = None) -> None:
    """Refuse a bad option of ``dynlab lm post-train`` before anything is loaded."""
    from dynlab.spec import MAX_BATCH, MAX_LENGTH, MAX_SAMPLES, MAX_SEED, MAX_STEPS

    if task is not None and task not in POST_TRAIN_TASKS:
        raise DynlabInputError(f"unknown task kind {task!r}; allowed: {', '.join(POST_TRAIN_TASKS)}")
    if intervention not in INTERVENTION_NAMES:
        raise DynlabInputError(f"unknown --intervention {intervention!r}; allowed: {', '.join(INTERVENTION_NAMES)}")
    if task is not None and intervention == TBTT:
        raise DynlabInputError(TBTT_ON_TASKS)
    check_source_option(source)
    optional_path(tokenizer, "--tokenizer", ("byte",), "'byte', a tokenizer.json or a folder holding one")
    if seq_len is not None:
        in_range("--seq-len", seq_len, 2, MAX_LENGTH, "tokens")
    in_range("--steps", steps, 0, MAX_STEPS)
    in_range("--batch-size", batch_size, 1, MAX_BATCH)
    in_range("--eval-multiple", length_multiple, 2, None, "(times --seq-len)")
    in_range("--samples", samples, 1, MAX_SAMPLES, "windows")
    in_range("--seed", seed, 0, MAX_SEED)
    if not lr > 0:
        raise DynlabInputError(f"--lr {lr} is out of range; allowed: a number above 0")
    check_device(device)


def resolve_tokenizer(checkpoint: Path, model: Any, meta: Mapping[str, Any], tokenizer: str | None,
                      source: str) -> Any:
    """The :class:`~dynlab.lm.data.tokenizer.TokenizerSpec` a post-training reads its text with:
    the checkpoint's own, else ``--tokenizer``, else the bytes for a 256-id model
    (:func:`dynlab.lm.hub.checkpoint.checkpoint_tokenizer`: a ``--tokenizer`` other than the
    checkpoint's own is refused); a token folder given as ``--source`` must have been made
    with it. One line, before anything is written."""
    from dynlab.lm.hub.checkpoint import checkpoint_tokenizer
    from dynlab.lm.data.tokenizer import load_tokenizer
    from dynlab.lm.data.tokens import is_token_folder, open_token_folder

    given = None if tokenizer is None else load_tokenizer(tokenizer).spec()
    folder = open_token_folder(Path(source).expanduser()) if is_token_folder(Path(source).expanduser()) else None
    tok = checkpoint_tokenizer(dict(meta), model, given, checkpoint)
    if folder is not None and (folder.tokenizer.kind, folder.tokenizer.sha256) != (tok.kind, tok.sha256):
        whose = "--tokenizer" if tokenizer is not None else "the checkpoint's"
        raise DynlabInputError(f"--source {source!r} was tokenized with {folder.tokenizer.label}, not with {whose} "
                               f"tokenizer {tok.label}; allowed: a token folder prepared with the model's tokenizer "
                               "(dynlab data prepare --tokenizer)")
    return tok


def post_train_spec(checkpoint: Path, intervention: str, task: str | None, task_grid: Mapping[str, Any] | None,
                    source: str, seq_len: int | None, steps: int, batch_size: int,
                    lr: float, length_multiple: int, samples: int, seed: int, tokenizer: str | None = None,
                    precision: str = "fp32") -> Any:
    """The :class:`~dynlab.lm.train.posttrain.PostTrainSpec` of ``dynlab lm post-train``'s options
    (``task_grid``: the task study's quick preset), the text checked to hold the evaluation
    (:func:`dynlab.lm.run.text.check_source`), a validation error said in the options' words."""
    from dynlab.lm.hub.checkpoint import checkpoint_digest, load_checkpoint
    from dynlab.lm.train.posttrain import PostTrainSpec, PostTrainTrainSpec
    from dynlab.lm.run.text import check_source
    from dynlab.lm.spec import InterventionSpec, LMDataSpec, LMEvalSpec, LMTaskSpec, check_eval_size

    model, meta = load_checkpoint(checkpoint)  # one line naming the path when it is not a model
    tok = resolve_tokenizer(checkpoint, model, meta, tokenizer, source)
    length = seq_len if seq_len is not None else int(meta.get("seq_len", 64))
    length_flag = "--seq-len" if seq_len is not None else f"the checkpoint's training length {length} (--seq-len)"
    if task_grid is not None and tok.kind != "byte" and task_grid.get("babi_tokens") == "words":
        task_grid = {**task_grid, "babi_tokens": "bytes"}  # bAbI's word ids stand in for the checkpoint's tokenizer
    with in_option_words({"chunk_len": length_flag, "bin_width": length_flag, "seq_len": length_flag,
                          "n_samples": "--samples", "effrem_samples": "--samples", "length_multiple": "--eval-multiple",
                          "steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "seed": "--seed",
                          "source": "--source", "kind": "--intervention"}):
        task_spec = None if task is None else LMTaskSpec(kind=task, **task_grid)
        evals = LMEvalSpec(length_multiple=length_multiple, n_samples=samples, chunk_len=min(256, length),
                           bin_width=min(16, length), effrem_samples=min(16, samples))
        if task_spec is None:  # the evaluation's size, before the text is read for it
            check_eval_size(length, evals.length_multiple, evals.n_samples)
        said = f"--seq-len {length}" if seq_len is not None else length_flag
        need = {f"the evaluation, {evals.length_multiple} (--eval-multiple) × {said},":
                (evals.length_multiple * length + 1, "a smaller --eval-multiple or --seq-len")}
        if task_spec is not None:
            need[f"the task's longest test sequence, {max(task_spec.eval_lengths)} tokens (--task {task}),"] = (
                max(task_spec.eval_lengths) + 1, "another --task")
        data = check_source(source, LMDataSpec().val_fraction, need, tok)
        return PostTrainSpec(
            checkpoint=str(checkpoint.expanduser().resolve()), checkpoint_sha256=checkpoint_digest(checkpoint),
            data=data, intervention=InterventionSpec(kind=intervention), task=task_spec,
            train=PostTrainTrainSpec(steps=steps, batch_size=batch_size, seq_len=length, lr=lr, precision=precision),
            eval=evals, seed=seed,
        )


def failure_line(run: Path) -> str | None:
    """One line for a post-training run that did not end ``ok`` (``diverged``: its reason,
    no weights kept), None for one that did; read from its ``result.json``."""
    import json

    try:
        result = json.loads((Path(run) / "result.json").read_text())
    except (OSError, ValueError):
        return None
    status = result.get("status") if isinstance(result, dict) else None
    if status in (None, "ok"):
        return None
    return f"status: {status} ({result.get('reason') or 'no reason stored'}); the run keeps no weights and no evaluation"


def post_train(checkpoint: str | Path, intervention: str = "state-passing", steps: int = 100, task: str | None = None,
               source: str = "shakespeare", seq_len: int | None = None, batch_size: int = 16, lr: float = 3e-4,
               length_multiple: int = 16, samples: int = 64, seed: int = 0, out: str = DEFAULT_OUT,
               device: str = "auto", tokenizer: str | None = None, precision: str = "fp32",
               batch_tokens: int | None = None) -> Path:
    """``dynlab lm post-train``: post-train ``checkpoint`` (a dynlab LM run folder or a
    Hugging Face Mamba/Mamba2 folder) with ``intervention``, then evaluate it (on ``task``
    when given); the text read with ``tokenizer`` (None: the checkpoint's own,
    :func:`resolve_tokenizer`); the options checked as the command line checks them; the
    run's folder. ``batch_tokens``: tokens a step over every process (gradient accumulation
    to it). Under ``torchrun`` the processes join one group first and train one model
    (:mod:`dynlab.lm.train.distributed`); rank 0 evaluates and writes."""
    checkpoint = Path(checkpoint)
    post_train_options(intervention, task, source, seq_len, steps, batch_size, lr, length_multiple, samples, seed,
                       device, tokenizer)
    if precision not in PRECISIONS:
        raise DynlabInputError(f"unknown --precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    out_dir, checkpoint = post_train_places(out, checkpoint)
    from importlib import import_module

    from dynlab.lm.train.posttrain import run_post_train

    grid = None if task is None else import_module(f"dynlab.studies.{POST_TRAIN_TASKS[task]}").PRESETS["quick"]["task"]
    spec = post_train_spec(checkpoint, intervention, task, grid, source, seq_len, steps, batch_size,
                           lr, length_multiple, samples, seed, tokenizer, precision)
    spec = _processes(spec, batch_tokens, device)
    return run_post_train(spec, out_dir, device=device)


def _processes(spec: Any, batch_tokens: int | None, device: str) -> Any:
    """``spec`` with the processes ``torchrun`` started (joined into one group here) and
    the accumulation that ``--batch-tokens`` asks for (:func:`dynlab.lm.train.distributed.accum_for_tokens`)."""
    from dynlab.lm.train.distributed import accum_for_tokens, env_world_size, init_world
    from dynlab.runtime import resolve_device

    if batch_tokens is not None and batch_tokens < 1:
        raise DynlabInputError(f"--batch-tokens must be a positive number of tokens, got {batch_tokens}")
    size = env_world_size()
    if size > 1 and spec.task is not None:
        raise DynlabInputError("--task post-trains in one process; allowed under torchrun: text post-training")
    tr = spec.train
    accum = 1 if batch_tokens is None else accum_for_tokens(batch_tokens, tr.batch_size, tr.seq_len, size)
    if accum > 4096:
        raise DynlabInputError(f"--batch-tokens {batch_tokens} needs {accum} micro-batches a step; allowed: at most "
                               "4096 (a larger --batch-size)")
    if size > 1:
        init_world(resolve_device(device).type)
    return spec.model_copy(update={"train": tr.model_copy(update={"accum": accum, "processes": size})})
