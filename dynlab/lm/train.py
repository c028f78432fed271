"""LM training loop with an initial-state intervention.

Loss: mean next-byte cross-entropy over all positions of the batch. Optimiser: AdamW
with linear warm-up over ``warmup_frac`` of the steps then cosine decay to 10 % of ``lr``;
gradients clipped to global norm ``grad_clip``. Batches and intervention noise come from
one explicit ``torch.Generator`` seeded with ``seed``; parameters are initialised by the
caller (``RecurrentLM(generator=...)``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.lm.interventions import Intervention
from dynlab.lm.loaders import RandomWindowLoader, SequentialChunkLoader
from dynlab.lm.model import RecurrentLM
from dynlab.train.device import resolve_device

__all__ = ["TrainResult", "fit", "resolve_device", "make_loader", "train_lm"]


@dataclass
class TrainResult:
    """Per-step training loss (nats/byte) and the wall time in seconds."""

    loss: list[float] = field(default_factory=list)
    seconds: float = 0.0


def make_loader(intervention: Intervention, data: torch.Tensor, batch_size: int, seq_len: int,
                generator: torch.Generator) -> RandomWindowLoader | SequentialChunkLoader:
    """The loader an intervention needs: sequential chunks for TBTT, random windows otherwise."""
    if intervention.loader == "sequential":
        return SequentialChunkLoader(data, batch_size, seq_len)
    return RandomWindowLoader(data, batch_size, seq_len, generator)


def _lr_factor(step: int, steps: int, warmup_frac: float) -> float:
    warmup = max(1, int(round(warmup_frac * steps)))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))


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
    progress: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place on the byte stream ``data [n]``.

    Args:
        intervention: chooses the initial states (and the loader) of every step.
        steps, batch_size, seq_len: optimisation length, B and training length L.
        progress: optional callback ``(step, loss)``.
    """
    generator = torch.Generator().manual_seed(seed)
    loader = make_loader(intervention, data, batch_size, seq_len, generator)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        batch = next(loader)
        return batch.tokens, None, batch.fresh

    return fit(model, next_batch, intervention, generator, steps=steps, batch_size=batch_size, lr=lr,
               weight_decay=weight_decay, grad_clip=grad_clip, warmup_frac=warmup_frac, device=device, progress=progress)


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
    progress: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """The optimisation loop shared by LM and task training.

    ``next_batch()`` returns ``(tokens [B, L + 1], mask [B, L] or None, fresh [B])``; the
    loss is the mean next-token cross-entropy over the targets ``tokens[:, 1:]`` where
    ``mask`` is True (all targets when ``mask`` is None). ``model`` is any module with
    ``state_shapes()`` and ``forward(tokens, states) -> (logits, final states)``.
    """
    dev = resolve_device(device)
    model.to(dev).train()
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps, warmup_frac))
    shapes = model.state_shapes()
    result = TrainResult()
    start = time.perf_counter()
    for step in range(steps):
        tokens, mask, fresh = next_batch()
        tokens = tokens.to(dev)  # [B, L + 1]
        init = [s.to(dev) for s in intervention.initial_states(batch_size, shapes, fresh, generator)]
        logits, finals = model(tokens[:, :-1], init)  # [B, L, V]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
        if mask is None:
            loss = nll.mean()
        else:
            m = mask.to(dev).reshape(-1).to(nll.dtype)
            loss = (nll * m).sum() / m.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        sched.step()
        intervention.observe([f.detach() for f in finals])
        result.loss.append(loss.item())
        if progress is not None:
            progress(step, result.loss[-1])
    result.seconds = time.perf_counter() - start
    model.eval()
    return result
