"""LM training loop with an initial-state intervention.

Loss: mean next-byte cross-entropy over all positions of the batch (over the scored
targets for task batches). Optimiser: AdamW (betas 0.9, 0.95; weight decay on matrices
only) with the tracker engine's schedule (:func:`dynlab.training.cosine_lr`): linear
warm-up over ``warmup_frac`` of the steps (at least one step), then cosine decay to 10 %
of ``lr``; gradients clipped to global norm ``grad_clip``. As the tracker engine, the loop
runs on a fixed CPU thread count (:func:`dynlab.runtime.train_threads`) and stops a
run whose loss or gradient becomes non-finite, reporting ``status="diverged"`` in its
:class:`~dynlab.training.TrainResult`. Batches and intervention noise come from one
explicit ``torch.Generator`` seeded with ``seed``; parameters are initialised by the
caller (``RecurrentLM(generator=...)``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dynlab.lm.interventions import Intervention
from dynlab.lm.loaders import RandomWindowLoader, SequentialChunkLoader
from dynlab.lm.model import RecurrentLM
from dynlab.lm.states import detach_states, map_states
from dynlab.runtime import resolve_device, train_threads
from dynlab.training import TrainResult, converged, cosine_lr, loss_curve

__all__ = ["ADAM_BETAS", "ADAM_EPS", "LR_FLOOR", "batch_source", "TrainResult", "fit", "resolve_device", "make_loader", "train_lm", "train_summary"]

#: The LM schedule decays to this fraction of ``lr`` (the tracker schedule to 0).
LR_FLOOR = 0.1

#: AdamW's betas and epsilon (torch's default epsilon), here and in the stacks (:mod:`dynlab.lm.ensemble`).
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8


def make_loader(intervention: Intervention, data: torch.Tensor, batch_size: int, seq_len: int,
                generator: torch.Generator) -> RandomWindowLoader | SequentialChunkLoader:
    """The loader an intervention needs: sequential chunks for TBTT, random windows otherwise."""
    if intervention.loader == "sequential":
        return SequentialChunkLoader(data, batch_size, seq_len)
    return RandomWindowLoader(data, batch_size, seq_len, generator)


def batch_source(loader: RandomWindowLoader | SequentialChunkLoader
                 ) -> Callable[[], tuple[torch.Tensor, None, torch.Tensor]]:
    """``fit``'s ``next_batch`` over a text loader: ``(tokens [B, L + 1], None, fresh [B])`` of its next batch."""

    def next_batch() -> tuple[torch.Tensor, None, torch.Tensor]:
        batch = next(loader)
        return batch.tokens, None, batch.fresh

    return next_batch


def train_lm(
    model: RecurrentLM,
    data: torch.Tensor,
    intervention: Intervention,
    *,
    steps: int,
    batch_size: int,
    seq_len: int,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    warmup_frac: float = 0.05,
    seed: int = 0,
    device: str = "auto",
    threads: int | None = None,
    progress: Callable[[int, float], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    accum: int = 1,
) -> TrainResult:
    """Train ``model`` in place on the token stream ``data [n]`` (:func:`fit`).

    Args:
        intervention: chooses the initial states (and the loader) of every step.
        steps, batch_size, seq_len: optimisation length, B and training length L.
        seed: seeds the generator of the batches and of the intervention noise.
        lr, weight_decay, grad_clip, warmup_frac, device, threads, progress, stop, accum: as :func:`fit`.
    """
    generator = torch.Generator().manual_seed(seed)
    loader = make_loader(intervention, data, batch_size, seq_len, generator)
    return fit(model, batch_source(loader), intervention, generator, steps=steps, batch_size=batch_size, lr=lr,
               weight_decay=weight_decay, grad_clip=grad_clip, warmup_frac=warmup_frac, device=device,
               threads=threads, progress=progress, stop=stop, accum=accum)


def fit(
    model: nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],
    intervention: Intervention,
    generator: torch.Generator,
    *,
    steps: int,
    batch_size: int,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    warmup_frac: float = 0.05,
    device: str = "auto",
    threads: int | None = None,
    progress: Callable[[int, float], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    accum: int = 1,
) -> TrainResult:
    """The optimisation loop shared by LM and task training; ``model`` is trained in place.

    ``next_batch()`` returns ``(tokens [B, L + 1], mask [B, L] or None, fresh [B])``; the
    loss is the mean next-token cross-entropy over the targets ``tokens[:, 1:]`` where
    ``mask`` is True (all targets when ``mask`` is None). ``model`` is any module with
    ``state_shapes()`` and ``forward(tokens, states) -> (logits, final states)``.
    ``threads``: CPU intra-op threads (None: the engine's fixed count). ``progress``:
    optional callback ``(step, loss)``. ``stop``: optional ``(completed steps) -> bool``
    asked after every step; True ends training there (the schedule stays the one of
    ``steps``, so ``steps`` is the cap). The result's ``losses`` and ``lengths`` hold each
    completed step's loss (nats per token) and L.

    ``accum``: gradient accumulation — each step reads ``accum`` batches (micro-batches of
    ``batch_size``), backpropagates each one's loss divided by ``accum`` and updates once,
    so a step sees ``accum × batch_size`` sequences (a batch given in tokens). The
    intervention sees every micro-batch as a batch (state passing hands a micro-batch's
    final states to the next one; TBTT's next micro-batch is the next chunk). A step's
    loss is the mean of its micro-batches'. ``accum = 1``: the plain loop, unchanged.
    """
    if accum < 1:
        raise ValueError(f"accum must be a positive integer, got {accum}")
    dev = resolve_device(device)
    model.to(dev).train()
    opt = _adamw(model, lr, weight_decay)
    warmup = max(1, int(round(warmup_frac * steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(1.0, s, steps, warmup, floor=LR_FLOOR))
    shapes = model.state_shapes()
    dtype = next(model.parameters()).dtype  # initial states are drawn in float32 and cast to the model's dtype
    result = TrainResult(model=model)
    start = time.perf_counter()
    with train_threads(dev, threads=threads):
        for step in range(steps):
            value, length = _accumulate(model, next_batch, intervention, generator, batch_size, shapes, dev, dtype,
                                        opt, accum)
            if not math.isfinite(value):
                result.diverge("loss", step, length)
                break
            if not torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)):
                result.diverge("gradient", step, length)
                break
            opt.step()
            sched.step()
            result.losses.append(value)
            result.lengths.append(length)
            if progress is not None:
                progress(step, value)
            if stop is not None and stop(step + 1):
                break
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _accumulate(model: nn.Module, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],
                intervention: Intervention, generator: torch.Generator, batch_size: int, shapes: list,
                dev: torch.device, dtype: torch.dtype, opt: torch.optim.Optimizer, accum: int) -> tuple[float, int]:
    """One step's gradients over ``accum`` micro-batches (:func:`fit`): each loss divided by
    ``accum`` (not for one) and backpropagated, the intervention observing each
    micro-batch's final states. Returns (the mean of the micro-batch losses, or the first
    non-finite one, before its backward; the length L)."""
    opt.zero_grad(set_to_none=True)
    total, length = 0.0, 0
    for _ in range(accum):
        tokens, mask, fresh = next_batch()
        tokens = tokens.to(dev)  # [B, L + 1]
        init = map_states(intervention.initial_states(batch_size, shapes, fresh, generator), lambda s: s.to(dev, dtype))
        logits, finals = model(tokens[:, :-1], init)  # [B, L, V]
        loss = _masked_mean(logits, tokens[:, 1:], mask)
        value, length = loss.item(), tokens.shape[1] - 1
        if not math.isfinite(value):
            return value, length
        (loss if accum == 1 else loss / accum).backward()
        intervention.observe(detach_states(finals))
        total += value
    return total / accum, length


def train_summary(res: TrainResult, warm_start: bool = False) -> dict[str, Any]:
    """The training part of a run's result: ``status`` and ``reason`` (as the engine's),
    ``train_steps`` (completed steps), ``train_loss`` (mean loss of the last 5 % of them,
    nats per token; NaN for none), ``train_time`` (seconds), the loss curve subsampled by
    :func:`dynlab.training.loss_curve` (``loss_curve_step``, ``loss_curve``) and ``converged``
    (:func:`dynlab.training.converged`; ``warm_start``: the run started from a trained model,
    a post-training arm)."""
    tail = res.losses[-max(1, len(res.losses) // 20):]
    steps, curve = loss_curve(res.losses)
    return {"status": res.status, "reason": res.reason, "train_steps": len(res.losses),
            "train_loss": float(np.mean(tail)) if tail else math.nan, "train_time": res.seconds,
            "loss_curve_step": steps, "loss_curve": curve, "converged": converged(curve, warm_start)}


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices (``dim >= 2``) only."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                             lr=lr, betas=ADAM_BETAS, eps=ADAM_EPS)


def _masked_mean(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean cross-entropy of ``logits [B, L, V]`` against ``targets [B, L]`` over the
    positions where ``mask [B, L]`` is True (all of them when ``mask`` is None)."""
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    if mask is None:
        return nll.mean()
    m = mask.to(nll.device).reshape(-1).to(nll.dtype)
    return (nll * m).sum() / m.sum().clamp(min=1.0)
