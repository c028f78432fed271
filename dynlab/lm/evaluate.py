"""Streaming evaluation of a recurrent LM: NLL per position, states, next-token distributions.

Everything here runs from the zero state (validation never uses an intervention) and
processes a long sequence in chunks of ``chunk_len`` tokens with the state carried across
chunks, so activation memory depends on ``chunk_len``, not on the sequence length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr

from dynlab.analysis.lm_metrics import state_statistics
from dynlab.errors import DynlabInputError
from dynlab.lm.model import RecurrentLM

__all__ = ["StreamResult", "stream_eval", "next_token_probs", "truncated_context_probs", "validation_windows"]


@dataclass(frozen=True)
class StreamResult:
    """Results of :func:`stream_eval`.

    nll: ``[S, T]`` float64, ``nll[s, i] = −log q(x_{i+1} | x_{0..i})`` (nats).
    state_stats: Dataset of :func:`dynlab.analysis.lm_metrics.state_statistics` over
        (layer, head, t) with t = tokens consumed at each recorded position, or None. Computed chunk
        by chunk, so the raw states are never all held in memory.
    """

    nll: np.ndarray
    state_stats: xr.Dataset | None


def validation_windows(val: torch.Tensor, n_samples: int, length: int) -> torch.Tensor:
    """``n_samples`` evenly spaced windows of ``length + 1`` tokens of ``val`` -> ``[S, length + 1]`` int64.

    Deterministic (no randomness); windows overlap when the stream is short.
    """
    if len(val) < length + 1:
        raise DynlabInputError(f"validation text has {len(val)} bytes; evaluation length {length} needs at least {length + 1}")
    starts = np.linspace(0, len(val) - length - 1, n_samples).round().astype(np.int64)
    idx = torch.as_tensor(starts)[:, None] + torch.arange(length + 1)  # [S, length + 1]
    return val.long()[idx]


@torch.no_grad()
def stream_eval(model: torch.nn.Module, tokens: torch.Tensor, chunk_len: int = 64, record_states: bool = True,
                device: torch.device | str | None = None, record_at: Sequence[int] | np.ndarray | None = None) -> StreamResult:
    """NLL at every position of ``tokens [S, T + 1]`` from the zero state, streamed in chunks.

    Args:
        chunk_len: tokens per forward call (the state is carried between calls).
        record_states: also keep every layer's state statistics.
        record_at: positions t (tokens consumed, 1..T) after which the states are recorded;
            the chunks are split there. None: after each chunk.
    """
    if chunk_len < 1:
        raise ValueError(f"chunk_len must be a positive integer, got {chunk_len}")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    model.eval()
    s, t1 = tokens.shape
    stops = set(range(chunk_len, t1 - 1, chunk_len)) | {t1 - 1}
    wanted = stops if record_at is None else {int(t) for t in record_at if 1 <= int(t) <= t1 - 1}
    stops = sorted(stops | wanted)
    states = None
    nll, stats = [], []
    start = 0
    for stop in stops:
        x = tokens[:, start:stop].to(dev)  # [S, Q]
        y = tokens[:, start + 1:stop + 1].to(dev)  # [S, Q]
        logits, states = model(x, states)  # [S, Q, V]
        nll.append(F.cross_entropy(logits.double().transpose(1, 2), y, reduction="none").cpu())  # [S, Q]
        start = stop
        if record_states and stop in wanted:
            now = torch.stack([st.float().flatten(2) for st in states], dim=1).cpu()  # [S, layer, H, P*N]
            stats.append(state_statistics(now[:, :, :, None, :].numpy(), np.array([stop])))
    return StreamResult(torch.cat(nll, dim=1).numpy(), xr.concat(stats, dim="t") if stats else None)


@torch.no_grad()
def next_token_probs(model: RecurrentLM, tokens: torch.Tensor, chunk_len: int = 64) -> np.ndarray:
    """q(· | tokens) after the last token, from the zero state: ``tokens [S, L]`` -> ``[S, 256]`` float64."""
    dev = next(model.parameters()).device
    model.eval()
    states, last = None, None
    for start in range(0, tokens.shape[1], chunk_len):
        logits, states = model(tokens[:, start:start + chunk_len].to(dev), states)
        last = logits[:, -1]  # [S, 256]
    if last is None:
        raise ValueError("tokens must hold at least one position")
    return torch.softmax(last.double(), dim=-1).cpu().numpy()


def truncated_context_probs(model: RecurrentLM, tokens: torch.Tensor, starts: list[int] | np.ndarray,
                            chunk_len: int = 64) -> np.ndarray:
    """q(· | x_{t:T}) for every t in ``starts``: ``tokens [S, T]`` -> ``[S, len(starts), 256]`` float64.

    ``t = 0`` is the full context; its row is the full-context distribution itself.
    """
    full = next_token_probs(model, tokens, chunk_len)
    rows = [full if int(t) == 0 else next_token_probs(model, tokens[:, int(t):], chunk_len) for t in starts]
    return np.stack(rows, axis=1)
