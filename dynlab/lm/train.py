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

from dynlab.lm.interventions import Intervention
from dynlab.lm.loaders import RandomWindowLoader, SequentialChunkLoader
from dynlab.lm.model import RecurrentLM
from dynlab.train.device import resolve_device

__all__ = ["TrainResult", "resolve_device", "make_loader", "train_lm"]


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
    dev = resolve_device(device)
    model.to(dev).train()
    generator = torch.Generator().manual_seed(seed)
    loader = make_loader(intervention, data, batch_size, seq_len, generator)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps, warmup_frac))
    shapes = model.state_shapes()
    result = TrainResult()
    start = time.perf_counter()
    for step in range(steps):
        batch = next(loader)
        tokens = batch.tokens.to(dev)  # [B, L + 1]
        init = [s.to(dev) for s in intervention.initial_states(batch_size, shapes, batch.fresh, generator)]
        logits, finals = model(tokens[:, :-1], init)  # [B, L, 256]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
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
