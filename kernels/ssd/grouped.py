"""SSD with B and C shared by the heads of a group: the chunked scan of :mod:`kernels.ssd.chunked`
arranged for the LM stacks (:mod:`dynlab.lm.train.ensemble`), where B and C are one per sequence
(Mamba-2's ``n_groups = 1``) and the decay rates one per (sequence, head).

Same recurrence and result as :func:`kernels.ssd.chunked.ssd_ref` with ``B``/``C``
expanded over the heads; only the arrangement of the products differs:

- the scores ``C_t·B_s`` are one ``[Q, N] @ [N, Q]`` product per sequence, not per head;
- the decay inside a chunk is factored, ``exp(c_t − c_s) = exp(c_t − r)·exp(r − c_s)``
  with ``r`` the middle of the chunk's range of ``c`` per head, so the scores-times-inputs
  sum of all heads is one ``[Q, Q] @ [Q, H·P]`` product and no ``[H, Q, Q]`` decay matrix
  is formed; a chunk whose range of ``c`` exceeds :data:`_FACTOR_LIMIT` (the factors
  would leave the float range) falls back to the masked per-head decay matrix;
- the initial state's read-out and the carried state are one product per sequence over
  all its heads at once (``[Q, N] @ [N, H·P]`` and ``[H·P, Q] @ [Q, N]``); a zero initial
  state that needs no gradient (the zero intervention's) is not read out at all, which
  changes no number (its read-out is exactly zero);
- a sequence that fits one chunk with a zero initial state (an LM trained on windows no
  longer than the chunk) runs :func:`kernels.ssd.single_chunk.ssd_single_chunk`'s C loops
  where they apply (CPU, float32/float64, a C compiler): one pass per sequence each way.

On a CPU the per-head products of tiny matrices and the elementwise work on ``[H, Q, Q]``
decay matrices dominate a small LM's step; this arrangement has neither
(``docs/performance.md``).
"""

from __future__ import annotations

import torch

from ..compiled import promoted
from .single_chunk import single_chunk_applies, ssd_single_chunk

__all__ = ["ssd_grouped"]


def ssd_grouped(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                initial_state: torch.Tensor | None = None, chunk_size: int = 64,
                need_final: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked SSD whose B and C are shared by all heads of a sequence.

    Args:
        x: ``[G, T, H, P]``; dt: ``[G, T, H]`` (positive); A: ``[G, H]`` (negative; a
            stack repeats a member's rates over its sequences).
        B, C: ``[G, T, N]``, one per sequence (shared by its heads).
        initial_state: ``[G, H, P, N]`` or None (zeros).
        need_final: False: the caller does not read the final state, which the single-chunk
            C loops then skip (and return None for); every other path computes it anyway.

    Returns ``(y [G, T, H, P], final state [G, H, P, N])``, equal to
    ``ssd_ref(x, dt, A_h, B_h, C_h, initial_state, True)`` with ``B_h``, ``C_h`` the
    expansions over heads (for equal A across sequences).  Mixed dtypes compute in torch's
    common dtype of the inputs, as every SSD form does; ``T = 0`` returns an empty ``y`` and
    the initial state (zeros without one).
    """
    g, t, h, p = x.shape
    n = B.shape[-1]
    if dt.shape != (g, t, h) or A.shape != (g, h) or B.shape != (g, t, n) or C.shape != B.shape:
        raise ValueError(f"ssd_grouped: need x [G, T, H, P], dt [G, T, H], A [G, H], B and C [G, T, N]; got "
                         f"{tuple(x.shape)}, {tuple(dt.shape)}, {tuple(A.shape)}, {tuple(B.shape)}, {tuple(C.shape)}")
    x, dt, A, B, C, state = promoted(x, dt, A, B, C, initial_state)  # mixed dtypes: as every form
    if state is not None and not state.requires_grad and not bool(state.any()):
        state = None  # a zero initial state (the common case): its read-out and decay are skipped, exactly
    if state is None and t <= chunk_size and single_chunk_applies(x, dt, A, B, C):
        return ssd_single_chunk(x, dt, A, B, C, need_final)  # one chunk: the fused C loops
    limit = _FACTOR_LIMIT.get(x.dtype, _FACTOR_LIMIT[torch.float32])
    ys = []
    for start in range(0, t, chunk_size):
        stop = min(start + chunk_size, t)
        xc, dtc, Bc, Cc = x[:, start:stop], dt[:, start:stop], B[:, start:stop], C[:, start:stop]
        cum = torch.cumsum(dtc * A[:, None, :], dim=1)  # [G, Q, H], decreasing in time
        xdt = xc * dtc[..., None]  # [G, Q, H, P]
        if g == 0 or float((cum[:, 0] - cum[:, -1]).max().detach()) <= limit:
            y = _intra_factored(cum, xdt, Bc, Cc)
        else:
            y = _intra_masked(cum, xdt, Bc, Cc)
        # the initial state read out at every step: C_t . S_in[h], all heads in one product
        q = stop - start
        carried = (xdt * torch.exp(cum[:, -1:] - cum)[..., None]).reshape(g, q, h * p)  # [G, Q, H·P]
        gathered = torch.bmm(carried.transpose(1, 2), Bc).view(g, h, p, n)
        if state is None:
            ys.append(y)
            state = gathered
            continue
        read = torch.bmm(Cc, state.reshape(g, h * p, n).transpose(1, 2)).view(g, q, h, p)  # [G, Q, H, P]
        ys.append(y + read * torch.exp(cum)[..., None])
        state = torch.exp(cum[:, -1])[..., None, None] * state + gathered
    if not ys:  # no steps: no outputs, the initial state carried through
        return x.new_zeros(g, 0, h, p), x.new_zeros(g, h, p, n) if state is None else state
    return ys[0] if len(ys) == 1 else torch.cat(ys, dim=1), state


#: The largest range of log decay inside a chunk for which the factored form is used
#: (its factors stay within exp(±limit/2), far inside the float range); above it, the
#: masked form (module docstring).
_FACTOR_LIMIT = {torch.float32: 60.0, torch.float64: 600.0, torch.bfloat16: 60.0, torch.float16: 8.0}


def _intra_factored(cum: torch.Tensor, xdt: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """``y_t = Σ_{s≤t} exp(c_t − c_s) (C_t·B_s) dt_s x_s`` as ``exp(c_t − r) · [tril(C Bᵀ) @
    (exp(r − c_s) dt_s x_s)]`` with ``r`` the middle of the chunk's range per head: the
    scores are shared by the heads, so all heads are one ``[Q, Q] @ [Q, H·P]`` product."""
    g, q, h, p = xdt.shape
    r = 0.5 * (cum[:, :1] + cum[:, -1:])  # [G, 1, H]
    scores = torch.tril(torch.bmm(C, B.transpose(1, 2)))  # [G, Q, Q]
    u = (xdt * torch.exp(r - cum)[..., None]).reshape(g, q, h * p)
    return torch.bmm(scores, u).view(g, q, h, p) * torch.exp(cum - r)[..., None]


def _intra_masked(cum: torch.Tensor, xdt: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    """The same sum with the decay matrix ``exp(c_t − c_s)`` formed per head (masked before
    ``exp``), for chunks whose decay range is too wide for the factored form."""
    q = cum.shape[1]
    c = cum.transpose(1, 2)  # [G, H, Q]
    seg = c[:, :, :, None] - c[:, :, None, :]  # [G, H, Q(t), Q(s)]
    causal = torch.ones(q, q, dtype=torch.bool, device=cum.device).tril()
    decay = torch.exp(torch.where(causal, seg, torch.full_like(seg, float("-inf"))))
    weights = decay * torch.bmm(C, B.transpose(1, 2))[:, None]  # [G, H, Q, Q]
    return torch.matmul(weights, xdt.transpose(1, 2)).transpose(1, 2)  # [G, Q, H, P]
