"""Streaming evaluation of a recurrent LM: NLL per position, states, next-token distributions.

Everything here runs from the zero state (validation never uses an intervention) and
processes a long sequence in chunks of ``chunk_len`` tokens with the state carried across
chunks, so activation memory depends on ``chunk_len``, not on the sequence length. With
:class:`StreamWindows` (windows read from the stream chunk by chunk) and ``keep="mean"``
(the per-position mean NLL over the windows instead of every window's NLL), nothing held
grows with the length but one float per position: a 128K-token evaluation needs the memory
of an 8K one, up to that one array.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr

from dynlab.lm.analysis.metrics import state_statistics
from dynlab.errors import DynlabInputError
from dynlab.lm.data.loaders import take
from dynlab.lm.models.model import RecurrentLM

__all__ = ["StreamResult", "StreamWindows", "stream_eval", "stream_windows", "next_token_probs",
           "truncated_context_probs", "validation_windows"]


@dataclass(frozen=True)
class StreamResult:
    """Results of :func:`stream_eval`.

    nll: ``[S, T]`` float64, ``nll[s, i] = −log q(x_{i+1} | x_{0..i})`` (nats).
    state_stats: Dataset of :func:`dynlab.lm.analysis.metrics.state_statistics` over
        (layer, head, t) with t = tokens consumed at each recorded position, or None. Computed chunk
        by chunk, so the raw states are never all held in memory.
    """

    nll: np.ndarray
    state_stats: xr.Dataset | None


def _window_starts(val: torch.Tensor | np.ndarray, n_samples: int, length: int) -> np.ndarray:
    if len(val) < length + 1:
        raise DynlabInputError(f"validation text has {len(val)} tokens; evaluation length {length} needs at least {length + 1}")
    return np.linspace(0, len(val) - length - 1, n_samples).round().astype(np.int64)


def validation_windows(val: torch.Tensor | np.ndarray, n_samples: int, length: int) -> torch.Tensor:
    """``n_samples`` evenly spaced windows of ``length + 1`` tokens of ``val`` -> ``[S, length + 1]`` int64.

    Deterministic (no randomness); windows overlap when the stream is short.
    """
    starts = _window_starts(val, n_samples, length)
    return take(val, torch.as_tensor(starts)[:, None] + torch.arange(length + 1))  # [S, length + 1]


@dataclass(frozen=True)
class StreamWindows:
    """The windows of :func:`validation_windows`, read from the stream only when used.

    Row ``s`` is ``stream[starts[s] : starts[s] + width]``. Slicing (``w[:4, 10:20]``, rows
    and columns by slices of step 1) gives windows again; :meth:`to` reads them as an
    ``int64`` tensor ``[S, width]`` on a device (as a tensor's ``.to``).
    """

    stream: torch.Tensor | np.ndarray
    starts: np.ndarray
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.starts), self.width)

    def __getitem__(self, key: Any) -> StreamWindows:
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        if not isinstance(rows, slice) or not isinstance(cols, slice):
            raise TypeError("StreamWindows take slices of rows and columns")
        c0, c1, step = cols.indices(self.width)
        if step != 1:
            raise TypeError("StreamWindows take column slices of step 1")
        return StreamWindows(self.stream, self.starts[rows] + c0, max(0, c1 - c0))

    def to(self, device: torch.device | str | None = None) -> torch.Tensor:
        idx = torch.as_tensor(self.starts)[:, None] + torch.arange(self.width)
        return take(self.stream, idx).to(device)


def stream_windows(val: torch.Tensor | np.ndarray, n_samples: int, length: int) -> StreamWindows:
    """:func:`validation_windows` (the same windows) as :class:`StreamWindows`: nothing is read yet."""
    return StreamWindows(val, _window_starts(val, n_samples, length), length + 1)


@torch.no_grad()
def stream_eval(model: torch.nn.Module, tokens: torch.Tensor | StreamWindows, chunk_len: int = 64,
                record_states: bool = True, device: torch.device | str | None = None,
                record_at: Sequence[int] | np.ndarray | None = None, keep: str = "all") -> StreamResult:
    """NLL at every position of ``tokens [S, T + 1]`` from the zero state, streamed in chunks.

    Args:
        tokens: a tensor, or :class:`StreamWindows` read chunk by chunk.
        chunk_len: tokens per forward call (the state is carried between calls).
        record_states: also keep every layer's state statistics.
        record_at: positions t (tokens consumed, 1..T) after which the states are recorded;
            the chunks are split there. None: after each chunk.
        keep: ``"all"``: ``nll`` is ``[S, T]``; ``"mean"``: ``nll`` is ``[1, T]``, the mean
            over the windows at each position (what PPL(t) and its bins need; the same
            numbers as the mean of ``"all"``'s rows).
    """
    if keep not in ("all", "mean"):
        raise ValueError(f"keep must be 'all' or 'mean', got {keep!r}")
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
        piece = _token_nll(logits, y)  # [S, Q]
        nll.append(piece if keep == "all" else piece.mean(axis=0, keepdims=True))
        start = stop
        if record_states and stop in wanted:
            now = torch.stack([st.float().flatten(2) for st in states], dim=1).cpu()  # [S, layer, H, P*N]
            stats.append(state_statistics(now[:, :, :, None, :].numpy(), np.array([stop])))
    return StreamResult(np.concatenate(nll, axis=1), xr.concat(stats, dim="t") if stats else None)


#: Positions whose cross-entropy :func:`_token_nll` computes at once: the float64 copy of
#: the logits is made a slice at a time, so a long chunk of a large vocabulary needs no
#: float64 copy of all its logits (the numbers are the same: each position is its own row).
NLL_SLICE = 256


def _token_nll(logits: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """−log q(y | ·) in float64 at every position: ``logits [S, Q, V]``, ``y [S, Q]`` -> ``[S, Q]``."""
    parts = [F.cross_entropy(logits[:, a:a + NLL_SLICE].double().transpose(1, 2), y[:, a:a + NLL_SLICE],
                             reduction="none").cpu() for a in range(0, logits.shape[1], NLL_SLICE)]
    return torch.cat(parts, dim=1).numpy()


@torch.no_grad()
def next_token_probs(model: RecurrentLM, tokens: torch.Tensor | StreamWindows, chunk_len: int = 64) -> np.ndarray:
    """q(· | tokens) after the last token, from the zero state: ``tokens [S, L]`` -> ``[S, V]`` float64."""
    dev = next(model.parameters()).device
    model.eval()
    states, last = None, None
    for start in range(0, tokens.shape[1], chunk_len):
        logits, states = model(tokens[:, start:start + chunk_len].to(dev), states)
        last = logits[:, -1]  # [S, V]
    if last is None:
        raise ValueError("tokens must hold at least one position")
    return torch.softmax(last.double(), dim=-1).cpu().numpy()


def truncated_context_probs(model: RecurrentLM, tokens: torch.Tensor | StreamWindows, starts: list[int] | np.ndarray,
                            chunk_len: int = 64) -> np.ndarray:
    """q(· | x_{t:T}) for every t in ``starts``: ``tokens [S, T]`` -> ``[S, len(starts), V]`` float64.

    ``t = 0`` is the full context; its row is the full-context distribution itself.
    """
    full = next_token_probs(model, tokens, chunk_len)
    rows = [full if int(t) == 0 else next_token_probs(model, tokens[:, int(t):], chunk_len) for t in starts]
    return np.stack(rows, axis=1)
