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

**Precision** (``fit``'s ``precision``): ``"fp32"``, or ``"bf16"``: the forward under ``torch.autocast`` in
bfloat16 (matrix products in bfloat16; the weights, gradients and AdamW moments stay
float32, the loss is taken in float32, and dynlab's mixers run their scans with
autocast off on float32 inputs, :func:`dynlab.lm.models.mixers.run_scan`; a Hugging Face
model runs its own code under autocast). On CUDA, float32 matrix products use TF32
while training.

**Host synchronisation** (``fit``'s ``sync_every``): the steps' losses and gradient-norm checks stay on the device and are
read back every ``sync_every`` steps (None: every step on the CPU, every
:data:`SYNC_EVERY_CUDA` on a GPU), so no step waits for the host in between; the
intervention's noise comes from a generator on the model's device (on the CPU the
caller's, so its numbers are unchanged). Read back every step, a step whose loss or
gradient is not finite is reported and never applied (the parameters are those of the
step before); read back less often, it is found at the next read-back and reported at
the step it happened, the steps after it discarded (the run is ``diverged`` and keeps
no weights either way). ``progress`` is called for each step at its read-back; with
``stop`` every step is read back (``stop`` looks at the model right after its step).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dynlab.lm.train.distributed import (
    TrainState, World, all_ranks, current_world, mean_over_ranks, rank_generator, run_identity, shard_rows,
)
from dynlab.lm.train.interventions import Intervention
from dynlab.lm.data.loaders import RandomWindowLoader, SequentialChunkLoader, take
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.models.states import detach_states, map_states
from dynlab.names import PRECISIONS
from dynlab.runtime import resolve_device, train_threads
from dynlab.training import TrainResult, converged, cosine_lr, loss_curve

__all__ = ["ADAM_BETAS", "ADAM_EPS", "LR_FLOOR", "batch_source", "TrainResult", "fit", "resolve_device", "make_loader", "train_lm", "train_summary"]

#: The LM schedule decays to this fraction of ``lr`` (the tracker schedule to 0).
LR_FLOOR = 0.1

#: AdamW's betas and epsilon (torch's default epsilon), here and in the stacks (:mod:`dynlab.lm.train.ensemble`).
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
    precision: str = "fp32",
    resume: Path | None = None,
    save_every: int = 100,
) -> TrainResult:
    """Train ``model`` in place on the token stream ``data [n]`` (:func:`fit`).

    Args:
        intervention: chooses the initial states (and the loader) of every step.
        steps, batch_size, seq_len: optimisation length, B (per process) and training length L.
        seed: seeds the generator of the batches and of the intervention noise.
        lr, weight_decay, grad_clip, warmup_frac, device, threads, progress, stop, accum, precision,
        resume, save_every: as :func:`fit`.

    Launched by ``torchrun`` (an initialised process group of W > 1 processes), the loader
    draws global batches of ``W × batch_size`` windows and each rank trains on its own rows
    (:mod:`dynlab.lm.train.distributed`).
    """
    world = current_world()
    generator = torch.Generator().manual_seed(seed)
    loader = make_loader(intervention, data, batch_size * (world.size if world else 1), seq_len, generator)
    source = batch_source(loader) if world is None else shard_rows(batch_source(loader), world)
    return fit(model, source, intervention, generator, steps=steps, batch_size=batch_size, lr=lr,
               weight_decay=weight_decay, grad_clip=grad_clip, warmup_frac=warmup_frac, device=device,
               threads=threads, progress=progress, stop=stop, accum=accum, precision=precision, world=world,
               resume=resume, save_every=save_every, source=loader,
               identity={"seq_len": seq_len, "data_tokens": len(data), "data_head": take(data, torch.arange(
                   min(64, len(data)))).tolist()})


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
    precision: str = "fp32",
    sync_every: int | None = None,
    world: World | None = None,
    resume: Path | None = None,
    save_every: int = 100,
    source: Any = None,
    identity: dict[str, Any] | None = None,
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

    ``precision`` and ``sync_every``: see the module docstring.

    ``world`` (default: the ``torchrun`` group, if any), ``resume``, ``save_every``,
    ``source`` (the batch source's owner, its ``state_dict()`` saved) and ``identity`` (the
    caller's words for its data): several processes and resuming, :mod:`dynlab.lm.train.distributed`.
    """
    if accum < 1:
        raise ValueError(f"accum must be a positive integer, got {accum}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    world = world if world is not None else current_world()
    dev = resolve_device(device) if world is None else world.device(resolve_device(device))
    model.to(dev).train()
    opt = _adamw(model, lr, weight_decay)
    warmup = max(1, int(round(warmup_frac * steps)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(1.0, s, steps, warmup, floor=LR_FLOOR))
    every = sync_every if sync_every is not None else (1 if dev.type == "cpu" else SYNC_EVERY_CUDA)
    if stop is not None:  # stop looks at the model after each step: every step is read back before the next
        every = 1
    noise = _noise_generator(generator, dev, world)
    step_fn = _Step(model, next_batch, intervention, noise, batch_size, dev, opt, accum, precision, world)
    result = TrainResult(model=model)
    settings = dict(steps=steps, batch_size=batch_size, lr=lr, accum=accum, weight_decay=weight_decay,
                    grad_clip=grad_clip, warmup_frac=warmup_frac, precision=precision, **(identity or {}))
    state = None if resume is None else TrainState(Path(resume), world, model, opt, sched, list({
        id(g): g for g in (generator, noise)}.values()), intervention, source, run_identity(
        model, generator, intervention, **settings))
    done, result.losses, result.lengths = (0, [], []) if state is None else state.restore()
    start = time.perf_counter()
    with train_threads(dev, threads=threads), _tf32(dev):
        _run_steps(step_fn, lambda: (opt.step(), sched.step()), range(done, steps), every, grad_clip, result,
                   progress, stop, None if state is None else _saver(state, save_every, steps, done))
    result.seconds = time.perf_counter() - start
    model.eval()
    return result


def _noise_generator(generator: torch.Generator, dev: torch.device, world: World | None) -> torch.Generator:
    """The intervention's noise generator: the caller's on the CPU (its numbers unchanged), one
    on the device seeded alike on a GPU, and over several ranks each rank's own
    (:func:`dynlab.lm.train.distributed.rank_generator`; the batches stay the seed's, sharded)."""
    if world is not None:
        return rank_generator(generator.initial_seed(), world, dev)
    return generator if dev.type == "cpu" else torch.Generator(device=dev).manual_seed(generator.initial_seed())


def _saver(state: TrainState, save_every: int, steps: int, start: int) -> Callable[[int, TrainResult], None]:
    """Save ``state`` at the first read-back at or after every ``save_every`` steps after
    ``start``, and after the last step (the caller removes it once its outputs are stored)."""
    last = [start]

    def save(done: int, result: TrainResult) -> None:
        if done == steps or done // max(1, save_every) > last[0] // max(1, save_every):
            state.save(done, list(result.losses), list(result.lengths))
            last[0] = done

    return save


def _run_steps(step_fn: _Step, update: Callable[[], object], steps: range, every: int, grad_clip: float,
               result: TrainResult, progress: Callable[[int, float], None] | None,
               stop: Callable[[int], bool] | None, save: Callable[[int, TrainResult], None] | None = None) -> None:
    """:func:`fit`'s loop over the ``steps`` still to run: each step's gradients, their
    clipping and the ``update``, the losses and gradient checks read back every ``every``
    steps (every step: before the update, so that a failing step is never applied; averaged
    over the ranks of a world) and recorded in ``result``; ``save(steps done, result)`` after
    each read-back."""
    pending: list[tuple[int, torch.Tensor, torch.Tensor, int]] = []  # (step, loss, gradient finite, length)
    world = step_fn.world
    for step in steps:
        loss, length = step_fn()
        finite = torch.isfinite(torch.nn.utils.clip_grad_norm_(step_fn.model.parameters(), grad_clip))
        pending.append((step, loss, finite, length))
        if every == 1:
            values = _read_back(pending, world)
            if all(ok for _, _, ok, _ in values):
                update()
        else:
            update()
            if len(pending) < every and step + 1 < steps.stop:
                continue
            values = _read_back(pending, world)
        pending = []
        if not _record(values, result, progress, stop):
            return
        if save is not None:
            save(step + 1, result)


#: Steps between two read-backs of the loss on a GPU (:func:`fit`'s ``sync_every``).
SYNC_EVERY_CUDA = 25


def _read_back(pending: list[tuple[int, torch.Tensor, torch.Tensor, int]],
               world: World | None = None) -> list[tuple[int, float, bool, int]]:
    """The pending steps' ``(step, loss, loss and gradient finite, length)``, their losses
    (averaged over the ranks of a world) and gradient checks (on every rank) read back in
    one transfer each."""
    values = mean_over_ranks(torch.stack([p[1].detach() for p in pending]).double(), world).tolist()
    finite = all_ranks(torch.stack([p[2] for p in pending]), world).tolist()
    return [(step, value, bool(ok) and math.isfinite(value), length)
            for (step, _, _, length), value, ok in zip(pending, values, finite)]


def _record(values: list[tuple[int, float, bool, int]], result: TrainResult,
            progress: Callable[[int, float], None] | None, stop: Callable[[int], bool] | None) -> bool:
    """Record read-back steps in ``result`` up to the first non-finite one
    (``result.diverge``: the loss, else the gradient), calling ``progress`` and ``stop`` per
    step; False when training must end (a divergence, or ``stop``)."""
    for step, value, ok, length in values:
        if not math.isfinite(value):
            result.diverge("loss", step, length)
            return False
        if not ok:
            result.diverge("gradient", step, length)
            return False
        result.losses.append(value)
        result.lengths.append(length)
        if progress is not None:
            progress(step, value)
        if stop is not None and stop(step + 1):
            return False
    return True


@contextmanager
def _tf32(dev: torch.device) -> Iterator[None]:
    """TF32 matrix products on CUDA while training (the previous setting restored after)."""
    if dev.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class _Step:
    """One step's gradients over ``accum`` micro-batches (:func:`fit`): each loss divided by
    ``accum`` (not for one) and backpropagated, the intervention observing each
    micro-batch's final states. A call returns (the mean of the micro-batch losses, a 0-d
    tensor on the device; the length L): nothing is read back."""

    def __init__(self, model: nn.Module, next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],
                 intervention: Intervention, generator: torch.Generator, batch_size: int, dev: torch.device,
                 opt: torch.optim.Optimizer, accum: int, precision: str, world: World | None = None) -> None:
        self.model, self.next_batch, self.intervention, self.generator = model, next_batch, intervention, generator
        self.batch_size, self.dev, self.opt, self.accum, self.precision = batch_size, dev, opt, accum, precision
        self.world = world
        #: what runs the forward: the model, or over several ranks its DistributedDataParallel wrapper
        self.forward = model if world is None else nn.parallel.DistributedDataParallel(model)  # inputs are on the device already
        self.shapes = model.state_shapes()
        self.dtype = next(model.parameters()).dtype  # initial states are drawn in float32 and cast to the model's

    def __call__(self) -> tuple[torch.Tensor, int]:
        self.opt.zero_grad(set_to_none=True)
        total, length = None, 0
        for micro in range(self.accum):
            tokens, mask, fresh = self.next_batch()
            tokens = _to_device(tokens, self.dev)  # [B, L + 1]
            init = map_states(self.intervention.initial_states(self.batch_size, self.shapes, fresh, self.generator),
                              lambda s: s.to(self.dev, self.dtype))
            local = self.world is not None and micro < self.accum - 1  # gradients averaged over ranks once a step
            with self.forward.no_sync() if local else nullcontext():
                with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
                    logits, finals = self.forward(tokens[:, :-1], init)  # [B, L, V]
                loss = _masked_mean(logits.float() if self.precision == "bf16" else logits, tokens[:, 1:], mask)
                (loss if self.accum == 1 else loss / self.accum).backward()
            self.intervention.observe(detach_states(finals))
            total = loss.detach() if total is None else total + loss.detach()
            length = tokens.shape[1] - 1
        assert total is not None
        return (total if self.accum == 1 else total / self.accum), length


def _to_device(tokens: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A CPU batch on ``dev``: through pinned memory, without waiting for the GPU."""
    if dev.type == "cuda" and tokens.device.type == "cpu":
        return tokens.pin_memory().to(dev, non_blocking=True)
    return tokens.to(dev)


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
