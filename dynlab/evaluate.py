"""Length extrapolation of trackers: accuracy at a grid of lengths and max-pass length.

Definitions (SPEC A3):

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

Sequences are streamed in chunks with the recurrent state carried, so memory depends on
the chunk and batch sizes, not on the length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from dynlab.models import Tracker
from dynlab.tasks import WordProblem

__all__ = ["LengthEval", "evaluate_lengths", "max_pass_length"]


@dataclass
class LengthEval:
    """Accuracy per evaluated length (arrays aligned with ``lengths``)."""

    lengths: np.ndarray  # [L]
    acc_final: np.ndarray  # [L]
    acc_all: np.ndarray  # [L]
    n_samples: int


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
            out = model(tokens.to(device), state)
            state = out.final_state
            correct = (out.logits.argmax(-1).cpu() == labels).numpy()  # [b, tc] bool
            cum = running + np.cumsum(correct.sum(0))  # correct up to each position in chunk
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
