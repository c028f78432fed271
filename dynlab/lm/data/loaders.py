"""Training batch loaders over a token stream.

A stream is a 1-D tensor (the bytes of a text) or a 1-D NumPy array (a tokenizer's ids, or
the memory map of a token folder): :func:`take` reads only the windows a batch needs, so a
corpus on disk is never loaded whole.

- :class:`RandomWindowLoader` — independent random windows (the usual shuffled batches).
- :class:`SequentialChunkLoader` — TBTT: the stream is cut into ``batch_size`` contiguous
  lanes, one per batch slot; step i gives every slot the i-th consecutive chunk of its lane,
  so chunk order is kept per batch slot and slot b's chunk i+1 continues its chunk i.

:func:`sequential_tokens_read` counts the distinct tokens a TBTT run of given steps reads.

Both yield :class:`Batch` with ``tokens [B, L + 1]`` (inputs ``tokens[:, :-1]``, targets
``tokens[:, 1:]``) and ``fresh [B]`` (True where a slot starts a new document/lane, i.e.
where a carried state must not be used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dynlab.errors import DynlabInputError

__all__ = ["Batch", "RandomWindowLoader", "SequentialChunkLoader", "sequential_tokens_read", "take"]

Stream = torch.Tensor | np.ndarray


def take(data: Stream, idx: torch.Tensor) -> torch.Tensor:
    """``data[idx]`` as ``int64`` for an index tensor ``idx`` (any shape): a tensor stream is
    indexed as it is, an array stream (a memory map too) reads just those positions."""
    if isinstance(data, torch.Tensor):
        return data[idx].long()
    out = np.asarray(data[idx.numpy()]).astype(np.int64)
    bound = getattr(data, "n_ids", None)  # a token folder's stream: its tokenizer's ids (dynlab.lm.data.corpus)
    if bound is not None and out.size and int(out.max()) >= bound:
        where = getattr(data, "filename", None) or "the token stream"
        raise DynlabInputError(f"{where} holds the id {int(out.max())}, beyond its tokenizer's {bound} ids; allowed: a "
                               "token folder as dynlab data prepare wrote it (prepare it again)")
    return torch.from_numpy(out)


@dataclass(frozen=True)
class Batch:
    """tokens ``[B, L + 1]`` int64; fresh ``[B]`` bool; offsets ``[B]`` start index in the stream."""

    tokens: torch.Tensor
    fresh: torch.Tensor
    offsets: torch.Tensor


def _check_stream(data: Stream, need: int) -> None:
    if data.ndim != 1 or len(data) < need:
        raise ValueError(f"data must be a 1-D stream of at least {need} tokens, got shape {tuple(data.shape)}")


class RandomWindowLoader:
    """Random windows of ``seq_len + 1`` tokens; every window is ``fresh``.

    Args:
        data: ``[n]`` token stream; batch_size: B; seq_len: L; generator: draws the starts.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> None:
        _check_stream(data, seq_len + 1)
        self.data = data.long() if isinstance(data, torch.Tensor) else data
        self.batch_size, self.seq_len, self.generator = batch_size, seq_len, generator

    def __iter__(self) -> RandomWindowLoader:
        return self

    def state_dict(self) -> dict[str, int]:
        """Nothing beyond the generator (whose owner saves it): ``{}``."""
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """The inverse of :meth:`state_dict`."""

    def __next__(self) -> Batch:
        starts = torch.randint(0, len(self.data) - self.seq_len, (self.batch_size,), generator=self.generator)
        idx = starts[:, None] + torch.arange(self.seq_len + 1)  # [B, L + 1]
        return Batch(take(self.data, idx), torch.ones(self.batch_size, dtype=torch.bool), starts)


class SequentialChunkLoader:
    """TBTT loader: consecutive chunks per batch slot.

    Slot b owns lane ``data[b·S : (b + 1)·S]`` with ``S = n // B``; its i-th chunk starts at
    ``b·S + i·L`` (chunks overlap by one token: the last target of chunk i is the first
    input of chunk i + 1). After the last full chunk of a lane every slot wraps to its
    lane start and is marked ``fresh``; the first batch is fresh too.
    """

    def __init__(self, data: torch.Tensor, batch_size: int, seq_len: int) -> None:
        _check_stream(data, batch_size * (seq_len + 1))
        self.data = data.long() if isinstance(data, torch.Tensor) else data
        self.batch_size, self.seq_len = batch_size, seq_len
        self.lane = len(data) // batch_size
        self.chunks_per_lane = (self.lane - 1) // seq_len
        self.step = 0

    def __iter__(self) -> SequentialChunkLoader:
        return self

    def state_dict(self) -> dict[str, int]:
        """The position: batches read so far."""
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position :meth:`state_dict` gave."""
        self.step = int(state["step"])

    def __next__(self) -> Batch:
        i = self.step % self.chunks_per_lane
        self.step += 1
        starts = torch.arange(self.batch_size) * self.lane + i * self.seq_len  # [B]
        idx = starts[:, None] + torch.arange(self.seq_len + 1)  # [B, L + 1]
        return Batch(take(self.data, idx), torch.full((self.batch_size,), i == 0), starts)


def sequential_tokens_read(n_tokens: int, batch_size: int, seq_len: int, steps: int) -> int:
    """Distinct tokens of an ``n_tokens`` stream that ``steps`` batches of a
    :class:`SequentialChunkLoader` read: per lane min(steps, chunks per lane) chunks of
    ``seq_len`` targets plus the first input, ``batch_size`` lanes (the lanes are disjoint;
    after a wrap a lane repeats what it read)."""
    lane = n_tokens // batch_size
    chunks = min(steps, (lane - 1) // seq_len)
    return batch_size * (chunks * seq_len + 1)
