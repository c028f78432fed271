"""Train and test one :class:`~dynlab.lm.spec.LMTaskRunSpec`: an LM on a long-context task.

Training: :func:`dynlab.lm.train.engine.fit` on task batches (loss only on the scored targets,
see :mod:`dynlab.lm.data.tasks`) with the spec's initial-state intervention. Testing always
starts from the zero state, with teacher forcing, streamed in chunks (state carried).

Reported numbers, per test length (× depth for passkey, × kind for babi), over
``eval.n_samples`` test samples:

- ``token_accuracy``: fraction of scored targets whose arg-max prediction is exact;
- ``exact_match``: fraction of samples whose scored targets are all exact;
- ``accuracy``: the task's headline number — ``token_accuracy`` for copying (paper B's
  per-character accuracy), ``exact_match`` for passkey (the whole key) and babi (the
  whole answer word).

Status: a trained run is ``ok`` when its in-range accuracy (:func:`in_range_accuracy`)
reaches ``eval.learned_at`` and ``not-learned`` otherwise; ``diverged`` when training
became non-finite.

Post-training (``spec.post``, paper B's protocol): a learned model is post-trained once
per intervention of ``post.interventions`` from its trained weights, ``zero`` being the
compute-matched control, and each arm is tested like the trained model. The result's
``post[intervention]`` holds the arm's status, training loss and accuracies; the weights
of arm ``iv`` are stored beside the trained model's under keys ``post.<iv>.<name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import xarray as xr

from dynlab.lm.run.text import build_model, data_corpus
from dynlab.lm.spec import LMTaskRunSpec
from dynlab.lm.data.tasks import BabiTask, TaskBatch, make_task
from dynlab.lm.data.tokenizer import make_tokenizer
from dynlab.lm.train.engine import TrainResult, fit, train_summary
from dynlab.results.vocabulary import annotate
from dynlab.runtime import resolve_device, train_threads

__all__ = ["CONFIRM_SEED_OFFSET", "EVAL_SEED_OFFSET", "POST_SEED_OFFSET", "score_batch", "evaluate_task", "in_range_accuracy", "train_task",
           "train_attempts", "ATTEMPT_SEED_OFFSET",
           "post_train_arm", "task_for", "train_and_evaluate_task", "task_result_to_dataset", "POST_PREFIX"]

EVAL_SEED_OFFSET = 1_000_003
#: Post-training batches come from a generator seeded with ``seed + POST_SEED_OFFSET``
#: (the same for every arm), the arms' intervention noise from ``seed + POST_SEED_OFFSET + 1``.
POST_SEED_OFFSET = 2_000_003
#: Prefix of a post-training arm's weights in a run's ``model.safetensors``.
POST_PREFIX = "post."


def task_for(spec: LMTaskRunSpec, part: str = "val"):
    """The task object of ``spec`` with its filler from text ``part`` (``"val"``: the test's)."""
    return _task(spec, part)


def _task(spec: LMTaskRunSpec, part: str):
    t = spec.task
    tokenizer = None if spec.data.tokenizer.kind == "byte" else make_tokenizer(spec.data.tokenizer)
    if t.kind == "copying":
        return make_task("copying", tokenizer=tokenizer)
    corpus = data_corpus(spec.data)
    return make_task(t.kind, getattr(corpus, part), tuple(t.babi_kinds), t.n_facts, t.babi_tokens, t.babi_questions,
                     tokenizer)


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


def evaluate_task(model: torch.nn.Module, spec: LMTaskRunSpec, part: str = "val",
                  seed_offset: int = EVAL_SEED_OFFSET) -> dict[str, Any]:
    """Token accuracy and exact match on fresh test samples (grid as in the module docstring).

    ``part``: the text the filler comes from (``"val"``: the test; ``"train"``: the
    early-stopping check); samples are drawn with ``seed + seed_offset``."""
    t = spec.task
    task = _task(spec, part)
    generator = torch.Generator().manual_seed(spec.seed + seed_offset)
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
    """Train ``model`` in place on ``spec.task`` with ``spec.intervention`` (batches seeded with
    ``spec.seed``): one model; :func:`train_attempts` applies ``spec.train.attempts``."""
    generator = torch.Generator().manual_seed(spec.seed)
    return _fit_task(model, spec, generator, device, progress,
                     _LearnedCheck(model, spec) if spec.train.until_learned else None)


def _fit_task(model: torch.nn.Module, spec: LMTaskRunSpec, generator: torch.Generator, device: torch.device | str,
              progress: Callable[[int, float], None] | None, stop: Callable[[int], bool] | None) -> TrainResult:
    tr = spec.train
    intervention = spec.intervention.make()
    return fit(model, _batches(spec, generator), intervention, generator, steps=tr.steps, batch_size=tr.batch_size,
               lr=tr.lr, weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac,
               device=str(device), threads=tr.threads, progress=progress, stop=stop, precision=tr.precision)


#: Attempt k ≥ 1 of ``train.attempts`` draws its parameters from a generator seeded with
#: ``seed + k · ATTEMPT_SEED_OFFSET`` (attempt 0 from ``seed``, as a run without the rule).
ATTEMPT_SEED_OFFSET = 4_000_037


def train_attempts(model: torch.nn.Module, spec: LMTaskRunSpec, device: torch.device | str = "cpu",
                   progress: Callable[[int, float], None] | None = None) -> tuple[TrainResult, list[dict[str, Any]]]:
    """Train ``model`` in place under ``spec.train.attempts`` (:class:`~dynlab.lm.spec.TaskTrainSpec`):
    up to that many freshly drawn models, each until it learns or its ``steps`` run out.

    Returns the last attempt's :class:`TrainResult` and one record per attempt:
    ``{"init_seed", "train_steps", "train_time", "learned"}`` (``learned``: the training-text
    check passed, at a scheduled check or once more at the cap). Attempts share one batch
    stream, so each sees new batches. A diverged attempt ends the run (its status is the run's).
    """
    tr = spec.train
    generator = torch.Generator().manual_seed(spec.seed)
    stop = _LearnedCheck(model, spec) if tr.until_learned else None
    records: list[dict[str, Any]] = []
    for k in range(tr.attempts):
        init_seed = spec.seed + k * ATTEMPT_SEED_OFFSET
        if k:
            model.load_state_dict(build_model(spec, init_seed=init_seed).state_dict())  # type: ignore[arg-type]
        res = _fit_task(model, spec, generator, device, progress, stop)
        steps = len(res.losses)
        # a model that ran to its cap is checked once more there (with one attempt nothing reads it)
        learned = (stop is not None and res.status == "ok"
                   and (steps < tr.steps or ((tr.attempts > 1 or tr.confirm) and stop.passes())))
        record = {"init_seed": init_seed, "train_steps": steps, "train_time": res.seconds, "learned": learned}
        if tr.confirm and learned:  # the check passed: the in-range test decides whether the attempt counts
            score = in_range_accuracy(evaluate_task(model, _in_range_spec(spec)), spec)
            model.train()
            record.update(in_range_test=score, learned=bool(score >= spec.eval.learned_at))
        records.append(record)
        if record["learned"] or res.status != "ok":
            break
    return res, records


#: The early-stopping check of ``train.until_learned`` draws from a generator seeded with
#: ``seed + CHECK_SEED_OFFSET`` on the training text (the test samples are never seen);
#: the confirming check of ``train.confirm`` from one seeded with ``seed + CONFIRM_SEED_OFFSET``.
CHECK_SEED_OFFSET = 3_000_017
CONFIRM_SEED_OFFSET = 5_000_011


class _LearnedCheck:
    """``stop(step)`` of ``train.until_learned``: every ``check_every`` steps before the cap,
    whether the in-range accuracy on ``check_samples`` training-text samples per in-range cell
    reaches ``check_at`` (None: ``learned_at``); :meth:`passes` asks the same now (every call
    draws the same samples)."""

    def __init__(self, model: torch.nn.Module, spec: LMTaskRunSpec) -> None:
        self.model, self.spec = model, spec
        self.check = _in_range_spec(spec, n_samples=spec.train.check_samples)
        self.confirm = _in_range_spec(spec) if spec.train.confirm else None

    def passes(self) -> bool:
        """The check (and, with ``train.confirm``, its confirmation on test-sized fresh training-text samples)."""
        need = self.spec.eval.learned_at if self.spec.train.check_at is None else self.spec.train.check_at
        for check, offset in ((self.check, CHECK_SEED_OFFSET), (self.confirm, CONFIRM_SEED_OFFSET)):
            if check is None:
                continue
            result = evaluate_task(self.model, check, part="train", seed_offset=offset)
            self.model.train()
            if in_range_accuracy(result, check) < need:
                return False
        return True

    def __call__(self, step: int) -> bool:
        tr = self.spec.train
        if step % tr.check_every or step >= tr.steps:
            return False
        return self.passes()


def _in_range_spec(spec: LMTaskRunSpec, n_samples: int | None = None) -> LMTaskRunSpec:
    """``spec`` tested only at its lengths ≤ ``task.train_max`` (the cells of
    :func:`in_range_accuracy`), on ``n_samples`` samples per cell (None: the spec's)."""
    t = spec.task
    in_range = tuple(x for x in t.eval_lengths if x <= t.train_max)
    update: dict[str, Any] = {"task": t.model_copy(update={"eval_lengths": in_range})}
    if n_samples is not None:
        update["eval"] = spec.eval.model_copy(update={"n_samples": n_samples})
    return spec.model_copy(update=update)


def _batches(spec: LMTaskRunSpec, generator: torch.Generator) -> Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Training batches of ``spec.task``: one length uniform in [train_min, train_max] per batch."""
    t, b = spec.task, spec.train.batch_size
    task = _task(spec, "train")

    def next_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length = int(torch.randint(t.train_min, t.train_max + 1, (1,), generator=generator))
        batch = task.sample(generator, b, length)
        return batch.tokens, batch.mask, torch.ones(b, dtype=torch.bool)

    return next_batch


def in_range_accuracy(result: dict[str, Any], spec: LMTaskRunSpec) -> float:
    """Mean headline ``accuracy`` over the test cells with length ≤ ``task.train_max``
    (babi: of the kinds in ``eval.learn_kinds`` that the run tests; all its kinds when none is).

    This decides the run's status (``ok`` when ≥ ``eval.learned_at``)."""
    acc = np.asarray(result["accuracy"], dtype=float)
    rows = [i for i, length in enumerate(result["lengths"]) if length <= spec.task.train_max]
    acc = acc[rows]
    if spec.task.kind == "babi":
        kinds = [i for i, k in enumerate(result["kinds"]) if k in spec.eval.learn_kinds] or list(range(acc.shape[1]))
        acc = acc[:, kinds]
    return float(acc.mean())


def post_train_arm(model: torch.nn.Module, spec: LMTaskRunSpec, kind: str, device: torch.device | str = "cpu",
                   progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Post-train ``model`` (the trained weights, changed in place) with intervention ``kind``
    for ``spec.post.steps`` steps (see :class:`~dynlab.lm.spec.TaskPostSpec`)."""
    post, tr = spec.post, spec.train
    assert post is not None
    intervention = spec.intervention.make(kind)
    batches = torch.Generator().manual_seed(spec.seed + POST_SEED_OFFSET)
    noise = torch.Generator().manual_seed(spec.seed + POST_SEED_OFFSET + 1)
    return fit(model, _batches(spec, batches), intervention, noise, steps=post.steps, batch_size=tr.batch_size,
               lr=post.lr, weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=post.warmup_frac,
               device=str(device), threads=tr.threads, progress=progress, precision=tr.precision)


def train_and_evaluate_task(spec: LMTaskRunSpec, device: torch.device | str = "cpu",
                            progress: Callable[[int, float], None] | None = None
                            ) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Train ``spec``'s model on its task, test it and, when it learned and ``spec.post``
    is set, post-train and test every arm. Returns (result, state_dict).

    A run whose training loss or gradient becomes non-finite stops there and is returned
    with ``status = "diverged"`` (the step in ``reason``) and no weights.
    """
    model = build_model(spec)  # type: ignore[arg-type]  (same model fields as LMRunSpec)
    dev = resolve_device(device)
    with train_threads(dev, threads=spec.train.threads):
        warm = _warm_start(model, spec, dev, progress)
        if warm is not None and warm["status"] != "ok":
            return {**warm, "reason": f"warm start: {warm['reason']}", "warm_start": warm}, None
        res, attempts = train_attempts(model, spec, dev, progress)
        result = train_summary(res)
        if spec.train.attempts > 1:  # every attempt's compute counts
            result.update(train_steps=sum(a["train_steps"] for a in attempts),
                          train_time=sum(a["train_time"] for a in attempts),
                          train_attempts=len(attempts), attempts=attempts)
        if warm is not None:
            result["warm_start"] = warm
        if res.status != "ok":
            return result, None
        result.update(evaluate_task(model, spec))
        score = in_range_accuracy(result, spec)
        result["in_range_accuracy"] = score
        weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        if score < spec.eval.learned_at:
            result["status"] = "not-learned"
            result["reason"] = (f"in-range accuracy {score:.3f} < learned_at {spec.eval.learned_at} "
                                f"(lengths <= {spec.task.train_max})")
            return result, weights
        if spec.post is not None:
            base = dict(weights)
            result["post"] = {}
            for kind in spec.post.interventions:
                model.load_state_dict(base)
                arm = post_train_arm(model, spec, kind, dev, progress)
                summary = train_summary(arm, warm_start=True)  # from the learned model
                if arm.status == "ok":
                    summary.update({k: v for k, v in evaluate_task(model, spec).items() if k not in ("lengths", "depths", "kinds")})
                    weights.update({f"{POST_PREFIX}{kind}.{k}": v.detach().cpu().clone() for k, v in model.state_dict().items()})
                result["post"][kind] = summary
            model.load_state_dict(base)
    return result, weights


def warm_start_spec(spec: LMTaskRunSpec) -> LMTaskRunSpec | None:
    """The run spec of ``spec``'s warm start (its task and training, the same model, text and seed), or None."""
    ws = spec.warm_start
    if ws is None:
        return None
    return spec.model_copy(update={"task": ws.task, "train": ws.train, "post": None, "warm_start": None})


def _warm_start(model: torch.nn.Module, spec: LMTaskRunSpec, device: torch.device,
                progress: Callable[[int, float], None] | None) -> dict[str, Any] | None:
    """Train ``model`` in place on the warm-start task; its training summary and in-range
    accuracy on that task (``in_range_accuracy``), or None without a warm start."""
    pre = warm_start_spec(spec)
    if pre is None:
        return None
    res = train_task(model, pre, device, progress)
    summary = train_summary(res)
    if res.status == "ok":
        check = _in_range_spec(pre)
        summary["in_range_accuracy"] = in_range_accuracy(evaluate_task(model, check), check)
    return summary


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
