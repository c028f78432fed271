"""What every long-context task shares (:mod:`dynlab.lm.data.tasks`, :mod:`dynlab.lm.data.babi`):
a batch of tokens with its loss mask, the task's text as bytes or a tokenizer's ids, and
filler windows of a token stream."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.data.tokenizer import Tokenizer

__all__ = ["TaskBatch", "TaskText", "draw_index", "filler_window", "task_batch", "utf8_ids"]


def utf8_ids(text: str) -> list[int]:
    """The UTF-8 bytes of ``text``: its token ids in the byte formats."""
    return list(text.encode("utf-8"))


@dataclass(frozen=True)
class TaskBatch:
    """tokens ``[B, L]`` int64; mask ``[B, L - 1]`` bool (scored targets ``tokens[:, 1:]``)."""

    tokens: torch.Tensor
    mask: torch.Tensor


class TaskText:
    """How a task turns text into ids: the UTF-8 bytes (``tokenizer`` None or the byte
    tokenizer: the byte formats above, exactly) or a subword tokenizer's ids of each piece."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.subword = tokenizer is not None and tokenizer.kind != "byte"
        self.tokenizer = tokenizer
        self.pad = (tokenizer.eos_id or 0) if self.subword and tokenizer is not None else 0

    def __call__(self, text: str) -> list[int]:
        if not self.subword:
            return utf8_ids(text)
        assert self.tokenizer is not None
        return self.tokenizer.encode(text).tolist()

    def check(self, kind: str, texts: list[str]) -> None:
        """Refuse a subword tokenizer under which a piece of the task's text encodes to
        nothing or to its unknown token (the answer would be lost, or one constant token
        for every sample): one line naming the piece."""
        if not self.subword:
            return
        assert self.tokenizer is not None
        for text in texts:
            ids = self(text)
            if not ids or (self.tokenizer.unk_id is not None and self.tokenizer.unk_id in ids):
                what = "to nothing" if not ids else "to its unknown token"
                raise DynlabInputError(f"the tokenizer encodes {text!r} of the {kind} task {what}; allowed: a tokenizer "
                                       "that keeps every character of the task (its letters, digits and punctuation)")


def task_batch(rows: list[list[int]], scored: list[list[int]], pad: int | None = None) -> TaskBatch:
    """Rows and, per row, the token indices (into the row) that are scored targets; rows of
    unequal length are padded at the end with ``pad`` (never scored), which only a subword
    tokenizer's samples need."""
    longest = max(map(len, rows))
    if pad is not None:
        rows = [r + [pad] * (longest - len(r)) for r in rows]
    tokens = torch.tensor(rows, dtype=torch.int64)  # [B, L]
    mask = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, dtype=torch.bool)
    for b, idx in enumerate(scored):
        mask[b, torch.as_tensor(idx) - 1] = True
    return TaskBatch(tokens, mask)


def draw_index(generator: torch.Generator, high: int) -> int:
    return int(torch.randint(0, high, (1,), generator=generator))


def filler_window(stream: torch.Tensor | np.ndarray, n: int, generator: torch.Generator) -> list[int]:
    if n < 0:
        raise DynlabInputError(f"a sample's text takes {-n} tokens more than its length; allowed: a longer length")
    if n == 0:
        return []
    if len(stream) < n:
        raise DynlabInputError(f"filler text has {len(stream)} tokens; a sample needs {n}")
    start = draw_index(generator, len(stream) - n + 1)
    return stream[start:start + n].tolist()
