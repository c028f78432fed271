"""What every training loop shares: the result of training one model and the learning-rate schedule.

The tracker engine (:mod:`dynlab.tracking.train`) and the LM loop (:func:`dynlab.lm.train.fit`)
both return a :class:`TrainResult` and schedule with :func:`cosine_lr`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import nn

__all__ = ["TrainResult", "cosine_lr"]


@dataclass
class TrainResult:
    """Outcome of training one model (a tracker, or an LM in :func:`dynlab.lm.train.fit`).

    Attributes:
        model: the trained model (on the training device).
        status: ``"ok"`` or ``"diverged"``.
        reason: why a run failed (empty when ok), e.g. ``"non-finite loss at step 3 (length 9)"``.
        losses: mean cross-entropy of each completed step (nats per token); a diverged
            run stops before recording the failing step, so every entry is finite.
        lengths: sequence length of each completed step (for trackers the curriculum
            length; ``lengths[-1]`` is the length reached, ``curriculum_length`` in datasets).
        final_train_accuracy: per-token accuracy of the last training batch (NaN when the
            loop does not measure it, as the LM loop).
        seconds: wall time of the training loop (for an ensemble, of the whole stack).
    """

    model: nn.Module
    status: str = "ok"
    reason: str = ""
    losses: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    final_train_accuracy: float = float("nan")
    seconds: float = 0.0

    def diverge(self, what: str, step: int, length: int) -> None:
        """Mark the run diverged: its ``what`` (``"loss"`` or ``"gradient"``) became
        non-finite at ``step`` (0-based), on a batch of sequence length ``length``.  The
        loop then stops the run without applying that step."""
        self.status, self.reason = "diverged", f"non-finite {what} at step {step} (length {length})"


def cosine_lr(lr: float, step: int, steps: int, warmup: int, *, start: int | None = None, floor: float = 0.0) -> float:
    """Learning rate of ``step`` (0-based) of a run of ``steps``: linear warm-up
    ``lr·(step + 1)/warmup`` over the first ``warmup`` steps, then cosine decay from ``lr``
    at ``start`` (None: ``warmup``) to ``floor·lr`` at ``steps``.  The tracker schedules
    (:func:`lr_at`) decay to 0; the LM loop to ``floor = 0.1``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    start = warmup if start is None else start
    cos = math.cos(math.pi * (step - start) / max(1, steps - start))
    return floor * lr + (1 - floor) * 0.5 * lr * (1 + cos)  # floor 0: 0.5·lr·(1 + cos), rounded as before
