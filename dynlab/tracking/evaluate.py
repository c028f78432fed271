"""Length extrapolation of trackers: accuracy at a grid of lengths and max-pass length.

Definitions (docs/error-control.md, "Accuracy and max-pass length"):

- ``acc_final(L)`` — final-step accuracy at length L: the fraction of fresh length-L
  sequences whose readout at step L equals the true running product.  Because the
  trackers are causal, one stream of length max(L) gives every L at once (the prefix of
  a longer sequence *is* a length-L sequence).
- ``acc_all(L)`` — all-steps accuracy at length L: the fraction of correct readouts over
  all positions 1..L of all sequences.
- ``mp`` — max-pass length: the largest evaluated L with acc_final(l) ≥ threshold for
  every evaluated l ≤ L (0 if the shortest evaluated length already fails).  When every
  evaluated length passes, mp equals the longest evaluated length and is *censored*
  (the true horizon may be longer).
- ``acc_dense(L)`` — final-step accuracy at *every* length L = 1 … max(lengths), read from
  the same stream (position L of a length-max(L) sequence).  Each value rests on
  ``n_samples`` sequences only, so its sampling error (binomial, about
  sqrt(a(1-a)/n) = 0.019 at a = 0.9, n = 256) is large next to the step from one length
  to the next, and 1000 noisy tests would fail early by chance.
- ``mp_dense`` — the dense max-pass length (:func:`max_pass_length_dense`), with this
  stated rule for the sampling noise: the accuracy at L is pooled over the window of
  lengths [L - w(L), L + w(L)], w(L) = max(1, round(``window`` · L)) (default 5 %), and
  mp_dense is the largest L whose pooled accuracy, and that of every shorter length, is
  at least the threshold.  With n = 256 and the default window, a length near 100 pools
  11 · 256 readouts (standard error about 0.006 at a = 0.9).  Censored when every length
  up to the horizon passes.  Not quantised to the evaluation grid: any integer length can
  be the answer.

Sequences are streamed in chunks with the recurrent state carried, so memory depends on
the chunk and batch sizes, not on the length.  Each chunk runs through
:func:`dynlab.tracking.models.streams.tracker_stream`: the model's forward, or for the one-layer
Mamba-family trackers on the CPU a compiled loop that computes the same logits without
forming the ``[B, T, S]`` states (about 20× faster at the paper preset's sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dynlab.tracking.models import Tracker
from dynlab.tracking.task import WordProblem
from dynlab.tracking.models.streams import tracker_stream

__all__ = ["LengthEval", "evaluate_lengths", "max_pass_length", "max_pass_length_dense", "pooled_accuracy"]


@dataclass
class LengthEval:
    """Accuracy per evaluated length (arrays aligned with ``lengths``)."""

    lengths: np.ndarray  # [L]
    acc_final: np.ndarray  # [L]
    acc_all: np.ndarray  # [L]
    n_samples: int
    acc_dense: np.ndarray | None = None  # [max(lengths)]: final-step accuracy at lengths 1..max


@torch.no_grad()
def evaluate_lengths(
    model: Tracker,
    task: WordProblem,
    lengths: Sequence[int],
    n_samples: int,
    batch_size: int,
    chunk: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> LengthEval:
    """Stream ``n_samples`` random sequences of length max(lengths) through ``model``.

    Returns :class:`LengthEval` with final-step and all-steps accuracy at each length.
    """
    lengths_arr = np.asarray(sorted(set(int(x) for x in lengths)), dtype=np.int64)
    if lengths_arr.size == 0 or lengths_arr[0] < 1:
        raise ValueError(f"lengths must be positive integers, got {list(lengths)}")
    t_max = int(lengths_arr[-1])
    gen = torch.Generator().manual_seed(seed)
    final_correct = np.zeros(len(lengths_arr), dtype=np.int64)
    dense_correct = np.zeros(t_max, dtype=np.int64)  # [T]: correct final readouts at each length
    prefix_correct = np.zeros(len(lengths_arr), dtype=np.int64)
    model.eval()
    done = 0
    while done < n_samples:
        b = min(batch_size, n_samples - done)
        state = model.init_state(b, device=device)
        label = torch.zeros(b, dtype=torch.long)
        running = 0  # correct readouts so far in this batch
        t0 = 0
        while t0 < t_max:
            tc = min(chunk, t_max - t0)
            tokens, labels = task.sample(gen, b, tc, start=label)
            label = labels[:, -1]
            logits, state = tracker_stream(model, tokens.to(device), state)
            correct = (logits.argmax(-1).cpu() == labels).numpy()  # [b, tc] bool
            per_pos = correct.sum(0)  # [tc]
            dense_correct[t0 : t0 + tc] += per_pos
            cum = running + np.cumsum(per_pos)  # correct up to each position in chunk
            for i, L in enumerate(lengths_arr):
                if t0 < L <= t0 + tc:
                    final_correct[i] += int(correct[:, L - t0 - 1].sum())
                    prefix_correct[i] += int(cum[L - t0 - 1])
            running = int(cum[-1])
            t0 += tc
        done += b
    return LengthEval(
        lengths=lengths_arr,
        acc_final=final_correct / n_samples,
        acc_all=prefix_correct / (n_samples * lengths_arr),
        n_samples=n_samples,
        acc_dense=dense_correct / n_samples,
    )


def max_pass_length(lengths: Sequence[int], accuracy: Sequence[float], threshold: float) -> tuple[int, bool]:
    """Max-pass length and whether it is censored at the longest evaluated length.

    Returns ``(mp, censored)``: mp is the largest evaluated L with accuracy ≥ threshold
    at every evaluated l ≤ L (0 if the first fails); censored is True when every
    evaluated length passes.
    """
    lengths = np.asarray(lengths)
    acc = np.asarray(accuracy, dtype=float)
    if lengths.shape != acc.shape or lengths.size == 0:
        raise ValueError("lengths and accuracy must be non-empty and aligned")
    order = np.argsort(lengths)
    lengths, acc = lengths[order], acc[order]
    passed = acc >= threshold
    if passed.all():
        return int(lengths[-1]), True
    first_fail = int(np.argmin(passed))
    return (int(lengths[first_fail - 1]) if first_fail > 0 else 0), False


def pooled_accuracy(acc_dense: Sequence[float], window: float = 0.05) -> np.ndarray:
    """``acc_dense [T]`` (lengths 1..T) pooled over [L - w, L + w], w = max(1, round(window·L)).

    The window is clipped at 1 and T; every length in it weighs the same (each rests on
    the same number of sequences).
    """
    acc = np.asarray(acc_dense, dtype=float)
    if acc.ndim != 1 or acc.size == 0:
        raise ValueError(f"acc_dense must be a non-empty [T] array, got shape {acc.shape}")
    if not 0 <= window < 1:
        raise ValueError(f"window={window}; allowed: a fraction in [0, 1)")
    t = acc.size
    lengths = np.arange(1, t + 1)
    w = np.maximum(1, np.rint(window * lengths)).astype(np.int64) if window > 0 else np.zeros(t, np.int64)
    lo = np.clip(lengths - w, 1, t)
    hi = np.clip(lengths + w, 1, t)
    csum = np.concatenate([[0.0], np.cumsum(acc)])
    return (csum[hi] - csum[lo - 1]) / (hi - lo + 1)


def max_pass_length_dense(acc_dense: Sequence[float], threshold: float, window: float = 0.05) -> tuple[int, bool]:
    """Dense max-pass length (module docstring) from ``acc_dense [T]`` at lengths 1..T.

    Returns ``(mp, censored)``: the largest L with the pooled accuracy
    (:func:`pooled_accuracy`) ≥ ``threshold`` at every length 1..L (0 when length 1
    fails); censored when all T lengths pass.  ``window=0`` applies the rule to the raw
    per-length accuracies.
    """
    pooled = pooled_accuracy(acc_dense, window)
    passed = pooled >= threshold
    if passed.all():
        return int(pooled.size), True
    return int(np.argmin(passed)), False
