"""What every training loop shares: the result of training one model and the learning-rate schedule.

The tracker engine (:mod:`dynlab.tracking.train`) and the LM loop (:func:`dynlab.lm.train.engine.fit`)
both return a :class:`TrainResult` and schedule with :func:`cosine_lr`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from torch import nn

__all__ = ["CONVERGED_RULE", "LOSS_CURVE_POINTS", "TrainResult", "WARM_FLOOR", "WARM_LEVEL", "converged", "cosine_lr", "loss_curve"]


@dataclass
class TrainResult:
    """Outcome of training one model (a tracker, or an LM in :func:`dynlab.lm.train.engine.fit`).

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


#: Points of a stored training-loss curve (:func:`loss_curve`).
LOSS_CURVE_POINTS = 64

#: The rule of :func:`converged`, in words (stored as the ``converged`` variable's ``rule`` attribute).
CONVERGED_RULE = ("on the stored loss curve (train_loss_curve): the loss fell: mean of its last 10 % "
                  "<= 0.9 x mean of its first 5 %; and it levelled off: the last 10 % differ from the "
                  "10 % before them by at most 10 % of that fall; a warm start (phase post: a "
                  "post-training arm, which starts from a trained model) is also converged when its "
                  "loss stayed level: the last 10 % differ from the 10 % before them by at most 5 % "
                  "of the last 10 %'s mean plus 0.02 nats, and end at most that far above the first 5 %")

#: A warm start's level rule: the largest change of the loss between the last two tenths of
#: its curve, as a fraction of its level (batch noise alone moves an LM arm's loss by up to
#: 2 % between those windows in the committed interventions dataset), plus
#: :data:`WARM_FLOOR` nats per token (about 2 % of perplexity), so that a task's loss near
#: zero, whose noise is large relative to its level, still counts as level.
WARM_LEVEL = 0.05
WARM_FLOOR = 0.02


def loss_curve(losses: list[float], points: int = LOSS_CURVE_POINTS) -> tuple[list[int], list[float]]:
    """A run's per-step training losses subsampled to at most ``points`` values: the steps
    are cut into ``points`` consecutive windows of (nearly) equal size and each window is
    stored as its mean loss at its last step (1-based, so the last value sits at the run's
    step count).  Every step's loss counts once.  Empty for a run with no step."""
    n = len(losses)
    if n == 0:
        return [], []
    ends = np.unique(np.ceil(np.linspace(0, n, min(points, n) + 1)[1:]).astype(int))
    starts = np.concatenate([[0], ends[:-1]])
    values = np.asarray(losses, dtype=float)
    return ends.tolist(), [float(values[a:b].mean()) for a, b in zip(starts, ends)]


def converged(losses: list[float], warm_start: bool = False) -> bool:
    """Whether a run's training loss converged, by :data:`CONVERGED_RULE`.

    ``losses``: the run's stored loss curve (:func:`loss_curve`, what ``train_summary``
    passes, so that the flag recomputes from a dataset's ``train_loss_curve``:
    :func:`dynlab.results.assemble.converged_flags`), or any sequence of losses in step
    order.  With ``first`` the mean of its first 5 %, ``last`` of its last
    10 % and ``before`` of the 10 % before those: converged when ``last <= 0.9 · first``
    (the loss fell by at least a tenth) and ``|before − last| <= 0.1 · (first − last)``
    (the last tenth of training moved the loss by at most a tenth of its total fall).
    A run whose loss never moved fails the first condition; one still falling steeply at
    its end fails the second.

    ``warm_start``: the run starts from a trained model (a post-training arm), whose loss
    may hardly fall because it starts near its end. Such a run is also converged when its
    loss stayed level: ``|before − last| <= tol`` with ``tol = WARM_LEVEL · last + WARM_FLOOR``
    (the last tenth moved the loss by at most 5 % of its level plus 0.02 nats) and
    ``last <= first + tol`` (it did not climb: a loss that rose and then levelled off is not
    converged).  False for fewer than 20 values or a non-finite loss.
    """
    n = len(losses)
    if n < 20:
        return False
    x = np.asarray(losses, dtype=float)
    if not np.isfinite(x).all():
        return False
    k5, k10 = max(1, n // 20), max(1, n // 10)
    first, last, before = x[:k5].mean(), x[n - k10:].mean(), x[n - 2 * k10:n - k10].mean()
    fall = first - last
    if last <= 0.9 * first and abs(before - last) <= 0.1 * fall:
        return True
    tol = WARM_LEVEL * abs(last) + WARM_FLOOR
    return bool(warm_start and abs(before - last) <= tol and last <= first + tol)
