"""Train and evaluate one :class:`~dynlab.lm.spec.LMRunSpec`: the work of one study run.

The result is a JSON-able dict (lists of floats) holding PPL(t), binned PPL, the
Definition 3.2 verdict, EffRem_T(t) per distance and state statistics per layer, head and
position; :func:`dynlab.lm.dataset.result_to_dataset` turns it into an xarray Dataset, each
curve on its own positions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynlab.lm.analysis.metrics import (
    binned_ppl, effective_remembrance, length_generalization, position_ppl,
)
from dynlab.lm.hub.checkpoint import build_model  # noqa: F401 - run's name since before checkpoint.py
from dynlab.lm.data.corpus import Corpus, load_corpus
from dynlab.lm.evaluate import stream_eval, stream_windows, truncated_context_probs
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.results import LMResult
from dynlab.lm.spec import CHINCHILLA_TOKENS_PER_PARAM, LMDataSpec, LMEvalSpec, LMRunSpec
from dynlab.lm.data.tokenizer import TokenizerSpec
from dynlab.errors import DynlabInputError
from dynlab.lm.train.engine import batch_source, fit, make_loader, train_lm, train_summary
from dynlab.training import TrainResult
from dynlab.runtime import resolve_device, train_threads

__all__ = [
    "POST_PREFIX", "POST_SEED_OFFSET", "build_model", "check_source", "text_needs", "data_corpus", "stack_key", "train_and_evaluate_many", "checkpoint_steps", "count_parameters", "post_train_arms", "corpus_for", "effrem_starts", "state_positions", "train_and_evaluate", "evaluate_lm", "evaluate_model",
]


#: Post-training batches come from a generator seeded with ``seed + POST_SEED_OFFSET`` (the
#: same batches for every arm), the arms' intervention noise from ``seed + POST_SEED_OFFSET + 1``.
POST_SEED_OFFSET = 7_919

#: Seconds of wall time between two saves of a stack's training state (``resume_dir``).
SAVE_EVERY_S = 300.0

#: An arm's weights are stored in the run's ``model.safetensors`` under ``post.<intervention>.``.
POST_PREFIX = "post."


@lru_cache(maxsize=4)
def corpus_for(source: str, val_fraction: float, tokenizer: TokenizerSpec | None = None,
               content_sha256: str | None = None) -> Corpus:
    """Cached :func:`load_corpus` (a text is read and tokenized once per process);
    ``content_sha256`` keys the cache only (a file or token folder remade in place is read
    again)."""
    return load_corpus(source, val_fraction, tokenizer=tokenizer)


def data_corpus(data: LMDataSpec) -> Corpus:
    """The corpus a data spec names, through its tokenizer (:func:`corpus_for`)."""
    return corpus_for(data.source, data.val_fraction, None if data.tokenizer.kind == "byte" else data.tokenizer,
                      data.content_sha256)


def check_source(source: str, val_fraction: float, need: int | Mapping[str, tuple[int, str]],
                 tokenizer: TokenizerSpec | None = None) -> LMDataSpec:
    """Validate a filler/text source before anything is written: it must load and its train
    and validation parts each hold ``need`` tokens. ``need`` may say what needs them: each
    use of the text, in the words of the options that size it (``"one training batch,
    batch size 64 (--batch-size) × …"``) -> (the tokens it needs, what else is allowed:
    ``"a smaller --batch-size or --seq-len"``); the largest is the need, and a refusal
    names it and its numbers. A token folder brings its own tokenizer; naming another one
    is refused."""
    fields: dict[str, Any] = {"source": source, "val_fraction": val_fraction}
    if tokenizer is not None:
        fields["tokenizer"] = tokenizer
    data = LMDataSpec(**fields)
    corpus = data_corpus(data)
    unit = "bytes" if data.tokenizer.kind == "byte" else "tokens"
    what, (tokens, lower) = max((need if isinstance(need, Mapping) else {"": (need, "")}).items(), key=lambda x: x[1][0])
    if len(corpus.val) >= tokens and len(corpus.train) >= tokens:
        return data
    if not what:
        raise DynlabInputError(f"source {source!r} is too short: its train and validation parts need >= {tokens} {unit}, "
                               f"have {len(corpus.train)} and {len(corpus.val)}; allowed: a longer text")
    raise DynlabInputError(f"{what} needs {tokens} {unit} of text, more than --source {source!r} holds: its train and "
                           f"validation parts have {len(corpus.train)} and {len(corpus.val)} {unit}, and each must hold "
                           f"{tokens}; allowed: {lower}, or a longer text")


def text_needs(batch_size: int, seq_len: int, length_multiple: int, flags: Mapping[str, str] | None = None
               ) -> dict[str, tuple[int, str]]:
    """What a text must hold for LM training and evaluation (:func:`check_source`'s
    ``need``): one training batch of ``batch_size`` windows of ``seq_len + 1`` tokens (TBTT
    reads them as consecutive lanes), and the evaluation of ``length_multiple × seq_len``
    tokens; each said with the options that set the numbers (``flags``: quantity ->
    option, defaults those of the study commands)."""
    f = {"batch": "--batch-size", "seq_len": "--seq-len", "multiple": "eval.length_multiple in --config", **(flags or {})}
    length = f"training length {seq_len} ({f['seq_len']})"
    return {
        f"one training batch, batch size {batch_size} ({f['batch']}) × ({length} + 1),":
            (batch_size * (seq_len + 1) + 1, f"a smaller {f['batch']} or {f['seq_len']}"),
        f"the evaluation, {length_multiple} ({f['multiple']}) × {length},":
            (length_multiple * seq_len + 1, f"a smaller {f['seq_len']} or {f['multiple']}"),
    }


def count_parameters(model: torch.nn.Module) -> int:
    """Every parameter of ``model`` (embedding and head included): the P of the Chinchilla budget."""
    return int(sum(p.numel() for p in model.parameters()))


def checkpoint_steps(n_params: int, multiples: tuple[float, ...] | list[float], batch_size: int, seq_len: int,
                     steps: int) -> list[int]:
    """The training step after which a model of ``n_params`` parameters has seen ``c`` times
    its Chinchilla budget, for each multiple ``c``: ``round(c · 20 · P / (B · L))`` (B·L
    tokens per step, B counting every micro-batch of a step: ``batch_size × accum``;
    :data:`~dynlab.lm.spec.CHINCHILLA_TOKENS_PER_PARAM` tokens per parameter), clipped to
    ``[1, steps]``."""
    per_step = batch_size * seq_len
    return [min(steps, max(1, round(c * CHINCHILLA_TOKENS_PER_PARAM * n_params / per_step))) for c in multiples]


def effrem_starts(length: int, points: int) -> np.ndarray:
    """Truncation starts t = T − c for ``points`` log-spaced kept-context lengths c in [1, T] (t = 0 included).

    Log spacing in the kept context resolves the recent past finely and the distant past coarsely.
    """
    kept = np.unique(np.round(np.geomspace(1, length, max(points, 2))).astype(np.int64))
    return np.unique(np.concatenate([[0], length - kept]))


def state_positions(length: int, points: int) -> np.ndarray | None:
    """Positions t (tokens consumed) where state statistics are recorded: ``points`` log-spaced in [1, length].

    ``points = 0`` records at the streaming chunk ends only (the first of them may lie
    beyond the training length, so it cannot show the shift between positions inside and
    beyond training).
    """
    if points == 0:
        return None
    return np.unique(np.round(np.geomspace(1, length, max(points, 2))).astype(np.int64))


def evaluate_model(model: RecurrentLM, spec: LMRunSpec, corpus: Corpus) -> dict[str, Any]:
    """PPL(t), binned PPL, verdict, EffRem and state statistics of ``model`` from the zero state."""
    return evaluate_lm(model, spec.eval, spec.train.seq_len, corpus)


def evaluate_lm(model: torch.nn.Module, ev: LMEvalSpec, train_length: int, corpus: Corpus) -> dict[str, Any]:
    """:func:`evaluate_model` for any recurrent LM: evaluation settings ``ev`` at ``ev.length_multiple × train_length`` tokens."""
    length = ev.length_multiple * train_length
    windows = stream_windows(corpus.val, ev.n_samples, length)  # [S, length + 1], read chunk by chunk
    stream = stream_eval(model, windows, chunk_len=ev.chunk_len, record_at=state_positions(length, ev.state_points),
                         keep="mean")
    ppl = position_ppl(stream.nll)
    binned = binned_ppl(stream.nll, ev.bin_width)
    verdict = length_generalization(binned, train_length)
    stats = stream.state_stats
    starts = effrem_starts(length, ev.effrem_points)
    probs = truncated_context_probs(model, windows[: ev.effrem_samples, :length], starts, chunk_len=ev.chunk_len)
    effrem = {d: effective_remembrance(probs[:, 0], probs, starts, d).values.tolist() for d in ev.distances}
    return {
        "ppl": ppl.values.tolist(),
        "ppl_binned_t": binned["t_bin"].values.tolist(),
        "ppl_binned": binned.values.tolist(),
        "verdict": verdict.as_dict(),
        "effrem_t": starts.tolist(),
        "effrem": effrem,
        "state_t": stats["t"].values.tolist(),
        "state_mean": stats.state_mean.values.tolist(),
        "state_std": stats.state_std.values.tolist(),
        "state_norm": stats.state_norm.values.tolist(),
    }


def train_and_evaluate(spec: LMRunSpec, device: torch.device | str = "cpu",
                       progress: Callable[[int, float], None] | None = None) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """Train ``spec``'s model with its intervention, then evaluate it. Returns (result, state_dict).

    A run whose training loss or gradient becomes non-finite stops there and is returned
    with ``status = "diverged"`` (the step in ``reason``) and no weights.  Training and
    evaluation run on ``spec.train.threads`` CPU threads (None: the engine's fixed count).
    The result also holds ``n_params`` (:func:`count_parameters`); with
    ``eval.checkpoints``, ``checkpoints``: per budget its ``budget``, ``step`` and
    ``tokens`` and the evaluation of the model after that step (:func:`checkpoint_steps`;
    a budget at the last step is the trained model's own); with ``post``, ``post``: per arm
    its training summary and evaluation (:func:`post_train_arms`), the arms' weights added
    to the state dict under ``post.<arm>.``.
    """
    corpus = data_corpus(spec.data)
    model = build_model(spec)
    intervention = spec.intervention.make()
    tr, dev = spec.train, resolve_device(device)
    if spec.init is not None:  # a pretrained model: evaluated as it is, then its post-training arms
        with train_threads(dev, threads=tr.threads):
            model.to(dev)
            return _finish_run(spec, model, TrainResult(model=model), {}, [], corpus, dev, progress)
    budgets = spec.eval.checkpoints
    at = checkpoint_steps(count_parameters(model), budgets, tr.batch_size * tr.accum, tr.seq_len, tr.steps)
    checkpoints: dict[int, dict[str, Any]] = {}

    def evaluate_checkpoint(done: int) -> bool:
        """Evaluate the model in the middle of training at the checkpoint steps (never stops training)."""
        if done in at and done < tr.steps:
            model.eval()
            checkpoints[done] = evaluate_model(model, spec, corpus)
            model.train()
        return False

    with train_threads(dev, threads=tr.threads):
        res = train_lm(model, corpus.train, intervention, steps=tr.steps, batch_size=tr.batch_size, seq_len=tr.seq_len,
                       lr=tr.lr, weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac,
                       seed=spec.seed, device=str(dev), threads=tr.threads, progress=progress,
                       stop=evaluate_checkpoint if budgets else None, accum=tr.accum, precision=tr.precision)
        return _finish_run(spec, model, res, checkpoints, at, corpus, dev, progress)


def _finish_run(spec: LMRunSpec, model: RecurrentLM, res: TrainResult, checkpoints: dict[int, dict[str, Any]],
                at: list[int], corpus: Corpus, dev: torch.device,
                progress: Callable[[int, float], None] | None) -> tuple[dict[str, Any], dict[str, torch.Tensor] | None]:
    """A trained run's result and weights: its training summary, evaluation, checkpoints
    (``checkpoints``: evaluations by step, taken in the middle of training at the steps
    ``at``) and post-training arms (:func:`train_and_evaluate`)."""
    tr, budgets = spec.train, spec.eval.checkpoints
    result = train_summary(res, warm_start=spec.init is not None)
    result["n_params"] = count_parameters(model)
    if res.status != "ok":
        return result, None
    result.update(evaluate_model(model, spec, corpus))
    if budgets:
        final = {k: result[k] for k in _EVAL_KEYS}
        result["checkpoints"] = [
            {"budget": c, "step": s, "tokens": s * tr.batch_size * tr.accum * tr.seq_len,
             **(checkpoints[s] if s in checkpoints else final)}
            for c, s in zip(budgets, at)
        ]
    # a pretrained model's weights are its checkpoint's (not copied into every run folder)
    weights = {} if spec.init is not None else {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if spec.post is not None:
        result["post"], arm_weights = post_train_arms(model, spec, corpus, dev, progress)
        weights.update(arm_weights)
    return result, weights


def stack_key(spec: LMRunSpec) -> str:
    """What runs trained in one stack share: everything but the seed and the intervention
    (:func:`train_and_evaluate_many`)."""
    return spec.model_copy(update={"seed": 0, "intervention": type(spec.intervention)()}).spec_hash()


def train_and_evaluate_many(specs: list[LMRunSpec], device: torch.device | str = "cpu",
                            progress: Callable[[int, list[float]], None] | None = None,
                            sync_every: int = 50, resume_dir: Path | None = None,
                            ) -> list[tuple[dict[str, Any], dict[str, torch.Tensor] | None]]:
    """:func:`train_and_evaluate` for specs of one :func:`stack_key`, trained together in one
    stack (:func:`dynlab.lm.train.ensemble.fit_ensemble`); evaluation, checkpoints and
    post-training as each alone.

    ``resume_dir``: a folder for the stack's training state (:func:`dynlab.lm.train.ensemble.fit_ensemble`'s
    ``resume``; one file per stack, named by its runs): a stack cut off in the middle of
    training continues from its last saved state (every 5 minutes), with the evaluations
    of the checkpoints it had passed.

    Each run reads the batches and noise of its own generator (seeded with its seed, as
    alone), so which runs share a stack does not change any run's data. ``train_time`` is
    the stack's training time divided by the number of runs. ``progress``: optional
    ``(completed steps, latest loss per run)`` every ``sync_every`` steps.
    """
    if len({stack_key(s) for s in specs}) != 1:
        raise DynlabInputError("runs trained in one stack must differ only in seed and intervention")
    from dynlab.lm.train.ensemble import fit_ensemble

    first = specs[0]
    tr, dev = first.train, resolve_device(device)
    corpus = data_corpus(first.data)
    models = [build_model(s) for s in specs]
    interventions = [s.intervention.make() for s in specs]
    generators = [torch.Generator().manual_seed(s.seed) for s in specs]
    sources, loaders = [], []
    for iv, g in zip(interventions, generators):
        loader = make_loader(iv, corpus.train, tr.batch_size, tr.seq_len, g)
        loaders.append(loader)
        sources.append(batch_source(loader))
    at = checkpoint_steps(count_parameters(models[0]), first.eval.checkpoints, tr.batch_size * tr.accum, tr.seq_len,
                          tr.steps)
    checkpoints: list[dict[int, dict[str, Any]]] = [{} for _ in specs]

    def evaluate_checkpoint(done: int, alive: list[bool]) -> None:
        for i, (spec, model) in enumerate(zip(specs, models)):
            if alive[i]:
                model.eval()
                checkpoints[i][done] = evaluate_model(model, spec, corpus)
                model.train()

    def restore(done: int, extra: dict) -> None:
        for i, saved in enumerate(extra.get("checkpoints", [])):
            checkpoints[i].update({int(k): v for k, v in saved.items()})
        for loader in loaders:
            if hasattr(loader, "step"):  # a sequential (TBTT) loader: its next chunk
                loader.step = done

    resume = None
    if resume_dir is not None:
        Path(resume_dir).mkdir(parents=True, exist_ok=True)
        resume = Path(resume_dir) / f"stack-{hashlib.sha256(' '.join(s.run_id for s in specs).encode()).hexdigest()[:16]}.pt"
    with train_threads(dev, threads=tr.threads):
        trained = fit_ensemble(models, sources, interventions, generators, steps=tr.steps, batch_size=tr.batch_size,
                               lr=tr.lr, weight_decay=tr.weight_decay, grad_clip=tr.clip, warmup_frac=tr.warmup_frac,
                               device=str(dev), threads=tr.threads, sync_every=sync_every, progress=progress,
                               checkpoints=[s for s in at if s < tr.steps], on_checkpoint=evaluate_checkpoint,
                               resume=resume, save_every_s=SAVE_EVERY_S, save_extra=lambda: {"checkpoints": checkpoints},
                               on_resume=restore)
        if resume is not None:
            try:
                resume.parent.rmdir()  # the folder goes when its last state file has gone
            except OSError:
                pass
        out = []
        for spec, model, res, ckpt in zip(specs, models, trained, checkpoints):
            res.seconds /= len(specs)
            out.append(_finish_run(spec, model, res, ckpt, at, corpus, dev, None))
    return out


#: The keys of :func:`evaluate_lm`'s result (what a stored evaluated run must hold: :meth:`LMResult.missing_fields`).
_EVAL_KEYS = LMResult.EVAL_FIELDS


def post_train_arms(model: torch.nn.Module, spec: LMRunSpec, corpus: Corpus, device: torch.device | str = "cpu",
                    progress: Callable[[int, float], None] | None = None
                    ) -> tuple[dict[str, dict[str, Any]], dict[str, torch.Tensor]]:
    """Post-train the trained ``model`` once per arm of ``spec.post`` (:class:`~dynlab.lm.spec.LMPostSpec`)
    and evaluate each arm as the trained model (:func:`evaluate_model`).

    Every arm starts from the same trained weights and reads the same batches (a generator
    seeded with ``seed +`` :data:`POST_SEED_OFFSET`; TBTT reads consecutive chunks
    instead); the noise of the noise arms comes from a second generator, so it never moves
    the batches. ``model`` holds the trained weights again on return. Returns (per arm: its
    training summary and evaluation, the arms' weights under ``post.<arm>.``; none for a
    pretrained checkpoint, ``spec.init``, whose arms would each be a copy of a large model:
    ``dynlab lm post-train`` keeps one arm's weights).
    """
    post, tr = spec.post, spec.train
    assert post is not None
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out: dict[str, dict[str, Any]] = {}
    weights: dict[str, torch.Tensor] = {}
    for kind in post.interventions:
        model.load_state_dict(base)
        intervention = spec.intervention.make(kind)
        loader = make_loader(intervention, corpus.train, tr.batch_size, tr.seq_len,
                             torch.Generator().manual_seed(spec.seed + POST_SEED_OFFSET))
        res = fit(model, batch_source(loader), intervention, torch.Generator().manual_seed(spec.seed + POST_SEED_OFFSET + 1),
                  steps=post.steps, batch_size=tr.batch_size, lr=post.lr, weight_decay=tr.weight_decay,
                  grad_clip=tr.clip, warmup_frac=post.warmup_frac, device=str(device), threads=tr.threads,
                  progress=progress, accum=tr.accum, precision=tr.precision)
        summary = train_summary(res, warm_start=True)  # from the trained base model
        if res.status == "ok":
            model.eval()
            summary.update(evaluate_model(model, spec, corpus))
            if spec.init is None:
                weights.update({f"{POST_PREFIX}{kind}.{k}": v.detach().cpu().clone()
                                for k, v in model.state_dict().items()})
        out[kind] = summary
    model.load_state_dict(base)
    model.eval()
    return out, weights
