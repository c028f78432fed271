"""Train and test one :class:`~dynlab.lm.spec.LMTaskRunSpec`: an LM on a long-context task.

Training: :func:`dynlab.lm.train.fit` on task batches (loss only on the scored targets,
see :mod:`dynlab.lm.tasks`) with the spec's initial-state intervention. Testing always
starts from the zero state, with teacher forcing, streamed in chunks (state carried).

Reported numbers, per test length (× depth for passkey, × kind for babi), over
``eval.n_samples`` test samples:

- ``token_accuracy``: fraction of scored targets whose arg-max prediction is exact;
- ``exact_match``: fraction of samples whose scored targets are all exact;
- ``accuracy``: the task's headline number — ``token_accuracy`` for copying (paper B's
  per-character accuracy), ``exact_match`` for passkey (the whole key) and babi (the
  whole answer word).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import xarray as xr

from dynlab.lm.interventions import make_intervention
from dynlab.lm.run import build_model, corpus_for
from dynlab.lm.spec import LMTaskRunSpec
from dynlab.lm.tasks import BabiTask, TaskBatch, make_task
from dynlab.lm.train import TrainResult, fit, train_summary
from dynlab.results.vocabulary import annotate
from dynlab.train.device import resolve_device
from dynlab.train.engine import train_threads

__all__ = ["EVAL_SEED_OFFSET", "score_batch", "evaluate_task", "train_task", "train_and_evaluate_task",
           "task_result_to_dataset"]

EVAL_SEED_OFFSET = 1_000_003


def _task(spec: LMTaskRunSpec, part: str):
    t = spec.task
    if t.kind == "copying":
        return make_task("copying")
    corpus = corpus_for(spec.data.source, spec.data.val_fraction)
    return make_task(t.kind, getattr(corpus, part), tuple(t.babi_kinds), t.n_facts)


@torch.no_grad()
def score_batch(model: torch.nn.Module, batch: TaskBatch, chunk_len: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced arg-max hits of ``model`` from the zero state.

    Returns ``(hits [B, L - 1] bool, mask [B, L - 1] bool)``: ``hits[b, i]`` says whether the
    arg-max prediction after ``tokens[b, :i + 1]`` equals ``tokens[b, i + 1]``.
    """
    dev = next(model.parameters()).device
    model.eval()
    tokens = batch.tokens.to(dev)
    states = None
    hits = []
    for start in range(0, tokens.shape[1] - 1, chunk_len):
        stop = min(start + chunk_len, tokens.shape[1] - 1)
        logits, states = model(tokens[:, start:stop], states)  # [B, Q, V]
        hits.append((logits.argmax(-1) == tokens[:, start + 1:stop + 1]).cpu())
    return torch.cat(hits, dim=1).numpy(), batch.mask.numpy()


def _scores(model: torch.nn.Module, batch: TaskBatch, chunk_len: int) -> tuple[float, float]:
    hits, mask = score_batch(model, batch, chunk_len)
    token = float(hits[mask].mean())
    exact = float(np.mean([hits[b][mask[b]].all() for b in range(len(hits))]))
    return token, exact


def evaluate_task(model: torch.nn.Module, spec: LMTaskRunSpec) -> dict[str, Any]:
    """Token accuracy and exact match on fresh test samples (grid as in the module docstring)."""
    t = spec.task
    task = _task(spec, "val")
    generator = torch.Generator().manual_seed(spec.seed + EVAL_SEED_OFFSET)
    n, chunk = spec.eval.n_samples, spec.eval.chunk_len
    token, exact = [], []
    if t.kind == "passkey":
        for length in t.eval_lengths:
            row = [_scores(model, task.sample(generator, n, length, depth), chunk) for depth in t.depths]
            token.append([r[0] for r in row])
            exact.append([r[1] for r in row])
    elif t.kind == "babi":
        assert isinstance(task, BabiTask)
        for length in t.eval_lengths:
            row = [_scores(model, task.sample_kind(generator, n, length, kind), chunk) for kind in t.babi_kinds]
            token.append([r[0] for r in row])
            exact.append([r[1] for r in row])
    else:
        for length in t.eval_lengths:
            tok, ex = _scores(model, task.sample(generator, n, length), chunk)
            token.append(tok)
            exact.append(ex)
    headline = token if t.kind == "copying" else exact
    return {"lengths": list(t.eval_lengths), "depths": list(t.depths), "kinds": list(t.babi_kinds),
            "accuracy": headline, "token_accuracy": token, "exact_match": exact}


def train_task(model: torch.nn.Module, spec: LMTaskRunSpec, device: torch.device | str = "cpu",
               progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Train ``model`` in place on ``spec.task`` with ``spec.intervention`` (batches seeded with ``spec.seed``)."""
    iv, tr, t = spec.intervention, spec.train, spec.task
    intervention = make_intervention(iv.kind, sigma=iv.sigma, beta=iv.beta, reset_prob=iv.reset_prob)
    task = _task(spec, "train")
    generator = torch.Generator().manual_seed(spec.seed)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length = int(torch.randint(t.train_min, t.train_max + 1, (1,), generator=generator))
        batch = task.sample(generator, tr.batch_size, length)
        return batch.tokens, batch.mask, torch.ones(tr.batch_size, dtype=torch.bool)

    return fit(model, next_batch, intervention, generator, steps=tr.steps, batch_size=tr.batch_size, lr=tr.lr,
               weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac, device=str(device),
               threads=tr.threads, progress=progress)


def train_and_evaluate_task(spec: LMTaskRunSpec, device: torch.device | str = "cpu",
                            progress: Callable[[int, float], None] | None = None
                            ) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Train ``spec``'s model on its task, then test it. Returns (result, state_dict).

    A run whose training loss or gradient becomes non-finite stops there and is returned
    with ``status = "diverged"`` (the step in ``reason``) and no weights.
    """
    model = build_model(spec)  # type: ignore[arg-type]  (same model fields as LMRunSpec)
    dev = resolve_device(device)
    with train_threads(dev, threads=spec.train.threads):
        res = train_task(model, spec, dev, progress)
        result = train_summary(res)
        if res.status != "ok":
            return result, None
        result.update(evaluate_task(model, spec))
    return result, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def task_result_to_dataset(result: dict[str, Any], kind: str) -> xr.Dataset:
    """One run's accuracies: dims ``length`` (+ ``depth`` for passkey, ``kind`` for babi)."""
    coords: dict[str, Any] = {"length": np.asarray(result["lengths"], dtype=np.int64)}
    dims: tuple[str, ...] = ("length",)
    if kind == "passkey":
        coords["depth"] = np.asarray(result["depths"], dtype=float)
        dims = ("length", "depth")
    elif kind == "babi":
        coords["kind"] = np.asarray(result["kinds"], dtype=str)
        dims = ("length", "kind")
    data = {name: (dims, np.asarray(result[name], dtype=float)) for name in ("accuracy", "token_accuracy", "exact_match")}
    return annotate(xr.Dataset(data, coords=coords))
