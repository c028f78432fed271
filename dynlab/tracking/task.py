"""The word problem of a finite group: track the running product of a token stream.

Tokens ``x_1 … x_T`` are group-element indices drawn uniformly from the whole group.
The label at step t is the running product ``g_t = x_t · g_{t-1}`` with ``g_0 = e``
(left multiplication; ``a · b`` applies ``b`` first, see :mod:`dynlab.tracking.groups`), so
``g_T = x_T · … · x_1``.  On a non-abelian group (S3) the order of the tokens matters.
"""

from __future__ import annotations

import numpy as np
import torch

from dynlab.tracking.groups import Group

__all__ = ["WordProblem"]


class WordProblem:
    """Sampler for the word problem of ``group``.

    One object serves training and extrapolation: the length is a sampling argument,
    and :meth:`sample` can continue earlier sequences from their running products, so
    arbitrarily long sequences can be streamed chunk by chunk in constant memory.
    """

    def __init__(self, group: Group):
        self.group = group
        self._table = torch.tensor(group.table.tolist(), dtype=torch.long)  # [G, G]
        self._inverse = torch.tensor(group.inverse.tolist(), dtype=torch.long)  # [G]
        self._flat = self._table.numpy().reshape(-1).copy()  # [G·G]: table[a, b] at a·G + b

    @property
    def n_tokens(self) -> int:
        return self.group.order

    @property
    def n_classes(self) -> int:
        return self.group.order

    def labels(self, tokens: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """Running products of ``tokens [B, T]`` continuing from ``start [B]`` (default e).

        Returns ``labels [B, T]``.
        """
        b, t_len = tokens.shape
        g = np.zeros(b, dtype=np.int64) if start is None else start.to(torch.long).cpu().numpy().copy()
        tok = tokens.to(torch.long).cpu().numpy()
        order = self.group.order
        for name, x in (("tokens", tok), ("start", g)):  # the flat take below would not catch them
            if x.size and (x.min() < 0 or x.max() >= order):
                raise ValueError(f"{name} must be element indices in [0, {order}); got {x.min()}..{x.max()}")
        # g_t = table[x_t, g_{t-1}] as one take from the flat table per step, in numpy: 3.6×
        # faster than torch's advanced indexing at B=256, T=60 (per-op overhead; measured)
        rows = tok.T * order  # [T, B]: x_t · G
        out = np.empty((t_len, b), dtype=np.int64)
        for t in range(t_len):
            g = self._flat[rows[t] + g]
            out[t] = g
        return torch.from_numpy(np.ascontiguousarray(out.T))

    def sample(
        self,
        generator: torch.Generator,
        batch_size: int,
        length: int,
        start: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``tokens [B, T]`` uniformly and their ``labels [B, T]`` (CPU tensors).

        Args:
            generator: explicit CPU generator (no global seeding).
            batch_size: B ≥ 1.
            length: T ≥ 1.
            start: running products ``[B]`` to continue from (default: identity).

        Drawing T tokens in one call or in consecutive chunks from the same generator
        gives the same sequences.
        """
        if batch_size < 1 or length < 1:
            raise ValueError(f"batch_size and length must be ≥ 1, got batch_size={batch_size}, length={length}")
        # Drawn time-major, so a sequence streamed in chunks (``start`` = the previous
        # chunk's last labels) gets exactly the tokens of one long draw.
        tokens = torch.randint(0, self.n_tokens, (length, batch_size), generator=generator).T.contiguous()
        return tokens, self.labels(tokens, start)

    def sample_identity_words(self, generator: torch.Generator, batch_size: int, length: int) -> torch.Tensor:
        """State-preserving words ``[B, T]``: random words closed by their inverse.

        The first ``T-1`` tokens are uniform; the last token is the inverse of their
        product, so the whole word multiplies to the identity and its return map sends
        every symbolic state back to itself.
        """
        if length < 1:
            raise ValueError(f"length must be ≥ 1, got {length}")
        head = torch.randint(0, self.n_tokens, (batch_size, length - 1), generator=generator)
        prod = self.labels(head)[:, -1] if length > 1 else torch.zeros(batch_size, dtype=torch.long)
        last = self._inverse[prod][:, None]
        return torch.cat([head, last], dim=1)

    def palindrome_words(self, generator: torch.Generator, batch_size: int, half: int) -> torch.Tensor:
        """State-preserving words ``w · w⁻¹`` of length ``2·half``: w, then the inverses of
        w's tokens in reverse order."""
        w = torch.randint(0, self.n_tokens, (batch_size, half), generator=generator)
        back = self._inverse[w.flip(1)]
        return torch.cat([w, back], dim=1)
