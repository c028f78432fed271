"""
Every generator is seeded by an explicit ``torch.Generator``, downloads nothing, and
returns byte tokens (vocabulary 256, the same as the byte-level LMs) with a loss mask:

- ``tokens [B, L]`` int64: one sample per row, all rows of a batch the same length L.
  The model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``.
- ``mask [B, L - 1]`` bool: ``mask[b, i]`` is True where the target ``tokens[b, i + 1]``
  is scored (loss and accuracy); nothing else is trained.

Formats (exact bytes, ``␣`` = space):

- **copying** (Jelassi et al.): ``$<s>|<s>.`` with ``s`` of ``n`` letters drawn uniformly
  from ``a``–``z``; ``length`` is the string length ``n`` (the sample has ``2n + 3``
  tokens). Scored: the ``n`` letters of the copy (not the final period).
- **passkey**: filler bytes with the needle ``The pass key is KKKKK. Remember it. KKKKK is
  the pass key.␣`` inserted after ``round(depth · F)`` of the ``F`` filler bytes, then the
  question ``␣What is the pass key? The pass key is KKKKK.``. ``KKKKK`` is a 5-digit key
  (10000–99999). ``length`` is the whole sample in tokens. Scored: the 5 key digits of the
  answer (the period after them is not).
- **babi**: bAbI-style questions about a small simulated world, scattered in filler
  (:mod:`dynlab.lm.data.babi`, whose docstring gives the format).

Filler is a contiguous window of a byte stream (by default the Shakespeare plays shipped with
dynlab) starting at a uniformly random offset.

**Through a subword tokenizer** (``tokenizer``, a Hugging Face one: :mod:`dynlab.lm.data.tokenizer`)
the same texts are built through it, the filler a window of the text's token stream; a
length counts that tokenizer's tokens, and only the answer's tokens are scored. Copying
encodes its whole text ``$<s>|<s>.`` at once, as a model reads it, and scores the tokens
that lie inside the copy (their character spans); passkey and babi are built piece by
piece, each piece encoded on its own: the needle, the question ``␣What is the pass key?
The pass key is`` and the answer ``␣KKKKK`` then ``.`` (scored: the key's tokens, with the
leading space a pretrained model reads before it); each fact ``␣<fact>``, the question
``␣Q: <question> A:`` and the answer ``␣<answer>`` then ``.``. A tokenizer that encodes a
piece of a task (a letter, a digit, a delimiter, a fact, a question, an answer) to nothing
or to its unknown token is refused when the task is made. Rows of one batch that encode
to different lengths (copying) are padded at their end with the tokenizer's
end-of-document id (0 without one), never scored: the model reads the padding only after
every scored target. ``babi_tokens="words"`` is a byte-level format and is refused with a
subword tokenizer.

Accuracies (teacher forcing, arg-max prediction at each scored target):
per-token accuracy = fraction of scored targets predicted exactly; exact match = fraction
of samples whose scored targets are all predicted exactly (for passkey and bAbI this is the
task accuracy; for copying it is whole-string accuracy).
"""

from __future__ import annotations

import numpy as np
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.data.babi import BabiTask
from dynlab.lm.data.task_text import TaskBatch, TaskText, draw_index, filler_window, task_batch, utf8_ids
from dynlab.lm.data.tokenizer import Tokenizer
from dynlab.names import BABI_KINDS

__all__ = ["BabiTask", "CopyingTask", "PASSKEY_NEEDLE", "PASSKEY_QUESTION", "PasskeyTask", "TASK_KINDS", "TaskBatch",
           "make_task"]

TASK_KINDS = ("copying", "passkey", "babi")
PASSKEY_NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
PASSKEY_QUESTION = " What is the pass key? The pass key is "
_LETTERS = torch.arange(ord("a"), ord("z") + 1)


class CopyingTask:
    """``$<s>|<s>.`` over 26 letters; ``length`` = string length n ≥ 1 (letters, under any tokenizer)."""

    kind = "copying"

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.text = TaskText(tokenizer)
        self.text.check("copying", ["$", "|", ".", *(chr(c) for c in range(ord("a"), ord("z") + 1)), "$ab|ab."])

    def min_length(self) -> int:
        return 1

    def check_length(self, length: int) -> None:
        if length < 1:
            raise DynlabInputError(f"copying length {length} is too short; allowed: a string length >= 1")
        from dynlab.spec import MAX_LENGTH

        if 2 * length + 3 > MAX_LENGTH:  # the sample holds the string twice
            raise DynlabInputError(f"copying length {length} makes samples of {2 * length + 3} tokens; "
                                   f"allowed: a string length <= {(MAX_LENGTH - 3) // 2} (samples <= {MAX_LENGTH} tokens)")

    def sample(self, generator: torch.Generator, batch_size: int, length: int, depth: float | None = None) -> TaskBatch:
        """``batch_size`` strings of ``length`` letters → tokens ``[B, 2·length + 3]``."""
        self.check_length(length)
        letters = _LETTERS[torch.randint(0, 26, (batch_size, length), generator=generator)]  # [B, n]
        if not self.text.subword:
            rows = [[ord("$"), *s, ord("|"), *s, ord(".")] for s in letters.tolist()]
            scored = [list(range(length + 2, 2 * length + 2))] * batch_size
            return task_batch(rows, scored)
        rows, scored = [], []
        for s in letters.tolist():
            row, copy, _ = self._encode("".join(map(chr, s)))
            rows.append(row)
            scored.append(copy)
        return task_batch(rows, scored, pad=self.text.pad)

    def _encode(self, s: str) -> tuple[list[int], list[int], int]:
        """A subword tokenizer's ids of the whole text ``$s|s.`` (as a model reads it),
        the indices of the tokens inside the copy (scored) and the number of tokens up to
        and including ``|`` (the probes' read position)."""
        tokenizer = self.text.tokenizer
        assert tokenizer is not None
        ids, spans = tokenizer.encode_offsets(f"${s}|{s}.")
        start, end = len(s) + 2, 2 * len(s) + 2  # the copy's characters
        copy = [i for i, (a, b) in enumerate(spans.tolist()) if start <= a and b <= end and b > a]
        copy_ids = [int(ids[i]) for i in copy]
        if not copy or (tokenizer.unk_id is not None and tokenizer.unk_id in copy_ids):
            raise DynlabInputError(f"the tokenizer reads the copied string of {len(s)} letters as "
                                   f"{'its unknown token' if copy else 'part of its delimiters'}; allowed: a tokenizer "
                                   "that keeps the copy its own tokens, or shorter strings")
        head = sum(1 for a, b in spans.tolist() if b <= start)
        from dynlab.spec import MAX_LENGTH

        if len(ids) > MAX_LENGTH:
            raise DynlabInputError(f"copying length {len(s)} makes samples of {len(ids)} tokens of this tokenizer; "
                                   f"allowed: samples <= {MAX_LENGTH} tokens (shorter strings)")
        return ids.tolist(), copy, head

    def probe_samples(self, generator: torch.Generator, n: int, d: int) -> tuple[TaskBatch, int, np.ndarray]:
        """``n`` probe samples of the state geometry (:mod:`dynlab.lm.analysis.state_geometry`): strings of
        ``d`` letters; the read position (after ``|``, the same in every row) and each row's
        first letter (0–25). Through a subword tokenizer the rows are padded on the left
        with the end-of-document id to one read position."""
        if not self.text.subword:
            batch = self.sample(generator, n, d)
            return batch, d + 2, (batch.tokens[:, 1] - ord("a")).numpy()  # "$" + d letters + "|"
        pad = self.text.pad
        letters = _LETTERS[torch.randint(0, 26, (n, d), generator=generator)]  # [n, d]
        strings = ["".join(map(chr, s)) for s in letters.tolist()]
        encoded = [self._encode(s) for s in strings]
        width = max(head for _, _, head in encoded)
        rows = [[pad] * (width - head) + row for row, _, head in encoded]
        scored = [[i + width - head for i in copy] for _, copy, head in encoded]
        return task_batch(rows, scored, pad=pad), width, np.asarray([ord(s[0]) - ord("a") for s in strings])


def _check_depth(depth: float) -> float:
    depth = float(depth)
    if not 0.0 <= depth <= 1.0:
        raise DynlabInputError(f"depth {depth} is outside [0, 1]; allowed: a fraction of the filler between 0 and 1")
    return depth


class PasskeyTask:
    """A 5-digit key at ``depth`` ∈ [0, 1] inside ``length`` tokens of filler from ``stream``."""

    kind = "passkey"

    def __init__(self, stream: torch.Tensor | np.ndarray, tokenizer: Tokenizer | None = None) -> None:
        self.stream = stream
        self.text = TaskText(tokenizer)
        self.text.check("passkey", [PASSKEY_NEEDLE.format(key="12345"), PASSKEY_QUESTION.rstrip(), " 12345", ".",
                                    *(f" {d}" for d in range(10))])

    def _pieces(self, key: str) -> tuple[list[int], list[int], list[int], list[int]]:
        """(needle, question, answer, end) ids of ``key``; the answer is scored."""
        enc = self.text
        if not enc.subword:
            return utf8_ids(PASSKEY_NEEDLE.format(key=key)), utf8_ids(PASSKEY_QUESTION), utf8_ids(key), utf8_ids(".")
        return enc(PASSKEY_NEEDLE.format(key=key)), enc(PASSKEY_QUESTION.rstrip()), enc(" " + key), enc(".")

    def min_length(self) -> int:
        """Needle + question + key + period: a sample with zero filler tokens (through a
        subword tokenizer an upper bound over keys: a key's digits may take one token each,
        in each of its three places)."""
        needle, question, answer, end = self._pieces("00000")
        slack = 0 if not self.text.subword else 3 * 5
        return len(needle) + len(question) + len(answer) + len(end) + slack

    def check_length(self, length: int) -> None:
        if length < self.min_length():
            raise DynlabInputError(f"passkey length {length} is too short to hold the key and the question; "
                             f"allowed: >= {self.min_length()} tokens")

    def sample(self, generator: torch.Generator, batch_size: int, length: int, depth: float | None = None) -> TaskBatch:
        """``depth`` None draws a uniform depth per sample."""
        self.check_length(length)
        if depth is not None:
            _check_depth(depth)
        rows, scored = [], []
        for _ in range(batch_size):
            key = str(10000 + draw_index(generator, 90000))
            d = float(torch.rand((), generator=generator)) if depth is None else depth
            needle, question, answer, end = self._pieces(key)
            n_filler = length - len(needle) - len(question) - len(answer) - len(end)  # the bytes: length - min_length
            filler = filler_window(self.stream, n_filler, generator)
            cut = int(round(d * n_filler))
            row = filler[:cut] + needle + filler[cut:] + question
            start = len(row)
            row += answer + end
            rows.append(row)
            scored.append(list(range(start, start + len(answer))))
        return task_batch(rows, scored, pad=self.text.pad)

    def probe_samples(self, generator: torch.Generator, n: int, d: int) -> tuple[TaskBatch, int, np.ndarray]:
        """``n`` probe samples of the state geometry (:mod:`dynlab.lm.analysis.state_geometry`): the needle,
        ``d`` filler tokens, the question and the key; the read position (after the last
        filler token, the same in every row) and each key's last digit (0–9). Through a
        subword tokenizer needles of other lengths are padded on the left with filler."""
        if not self.text.subword:
            batch = self.sample(generator, n, self.min_length() + d, depth=0.0)
            position = len(PASSKEY_NEEDLE.format(key="00000").encode()) + d  # ASCII: one byte a character
            start = int(batch.mask[0].nonzero()[0]) + 1  # first key digit of the answer
            return batch, position, (batch.tokens[:, start + 4] - ord("0")).numpy()
        keys = [str(10000 + draw_index(generator, 90000)) for _ in range(n)]
        pieces = [self._pieces(key) for key in keys]
        width = max(len(p[0]) for p in pieces)
        rows, scored = [], []
        for needle, question, answer, end in pieces:
            row = filler_window(self.stream, width - len(needle), generator) + needle + filler_window(self.stream, d, generator)
            row += question
            scored.append(list(range(len(row), len(row) + len(answer))))
            rows.append(row + answer + end)
        return task_batch(rows, scored, pad=self.text.pad), width + d, np.asarray([int(k[-1]) for k in keys])


def make_task(kind: str, stream: torch.Tensor | np.ndarray | None = None, babi_kinds: tuple[str, ...] = BABI_KINDS,
              n_facts: int = 4, babi_tokens: str = "bytes", babi_questions: str = "one",
              tokenizer: Tokenizer | None = None) -> CopyingTask | PasskeyTask | BabiTask:
    """The generator of ``kind`` (``copying``, ``passkey``, ``babi``); ``stream`` is the filler
    token stream; ``babi_*``: the :class:`BabiTask` options; ``tokenizer``: the text's (None:
    bytes; module docstring)."""
    if kind == "copying":
        return CopyingTask(tokenizer)
    if kind not in TASK_KINDS:
        raise DynlabInputError(f"unknown task kind {kind!r}; allowed: {', '.join(TASK_KINDS)}")
    if stream is None:
        raise DynlabInputError(f"task {kind} needs a filler byte stream")
    if kind == "passkey":
        return PasskeyTask(stream, tokenizer)
    return BabiTask(stream, babi_kinds, n_facts, babi_tokens, babi_questions, tokenizer)
