"""Gated linear attention (GLA): diagonal key-wise decay, with initial and final state.

Recurrence per batch element and head (state ``S_t`` is a ``[K, V]`` matrix)::

    S_t = diag(exp(g_t)) · S_{t-1} + k_t ⊗ v_t      g_t: [K] log forget gate (≤ 0)
    o_t = (scale · q_t)ᵀ S_t                       o_t: [V]
    S_{-1} = initial_state (zero when absent)

Layout ``[B, T, H, K]`` and the default ``scale = K^-1/2`` follow
``fla.ops.gla.naive.naive_recurrent_gla`` (fla-core 0.6.0). The initial state's
contribution is added to the zero-state output (docs/errata.md).

:func:`gla_ref` is the plain-torch reference (one step at a time under autograd);
:func:`gla_chunked`, the fast torch path, computes the same thing with an attention-like
quadratic form inside chunks and states carried between chunks.  :mod:`kernels.gla.triton`
is the CUDA backend (:mod:`kernels.dispatch`).
"""

from __future__ import annotations

import torch

from ..compiled import promoted

__all__ = ["gla_ref", "gla_chunked"]

# Largest |c_t − c_0| (cumulative log gate from a chunk's first position) for which gla_chunked
# factors exp(c_t − c_s) into exp(c_t − c_0 − r)·exp(r + c_0 − c_s), with r the middle of each
# key's range of c_t − c_0 over the chunk: every factor then lies in [e^−L/2, e^L/2] for
# forget gates (g ≤ 0; e^±L for gates of either sign), normal numbers far from float32's
# limits (e^30 ≈ 1e13), so each term keeps full relative precision.
# 0: no factoring (the masked [B, Q, Q, H, K] form on fixed chunks).
_FACTOR_LIMIT = {torch.float32: 60.0, torch.float64: 400.0, torch.float16: 0.0, torch.bfloat16: 0.0}

#: The chunked form's floor for a log gate: its exp is exactly 0 in the dtype, as exp(−inf)
#: is, so a hard reset (a gate of −inf) keeps its meaning, while the chunk-local differences
#: ``c_t − c_s`` stay finite (−inf − (−inf) would be NaN).  Gates above it are left exactly as they are.
_GATE_FLOOR = {torch.float64: -1000.0}
_GATE_FLOOR_DEFAULT = -200.0  # float32, bfloat16 and float16: exp(-200) is 0


def _floored(gk: torch.Tensor) -> torch.Tensor:
    """The log gates ``gk`` at least :data:`_GATE_FLOOR` of their dtype (the chunked form's gates)."""
    return gk.clamp_min(_GATE_FLOOR.get(gk.dtype, _GATE_FLOOR_DEFAULT))


def check_gla_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape or gk.shape != q.shape:
        raise ValueError(f"k and gk must match q {tuple(q.shape)}, got {tuple(k.shape)}, {tuple(gk.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with [B, T, H] = {tuple(q.shape[:3])}, got {tuple(v.shape)}")


def gla_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor,
               initial_state: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Every GLA form's inputs, checked (:func:`check_gla_inputs`) and in one dtype: mixed
    dtypes are computed in torch's promoted dtype (:func:`kernels.compiled.promoted`), in
    :func:`gla_ref` as in the chunked, recurrent and Triton forms. Returns
    ``(q, k, v, gk, initial_state)``."""
    check_gla_inputs(q, k, v, gk)
    return promoted(q, k, v, gk, initial_state)


def gla_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference GLA recurrence, one step at a time.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; gk: ``[B, T, H, K]`` log forget gates.
        scale: query scale, default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or None (zeros).
        return_final_state: also return the last state.

    Returns:
        ``o [B, T, H, V]`` and, if asked, ``final_state [B, H, K, V]``.
    """
    q, k, v, gk, initial_state = gla_inputs(q, k, v, gk, initial_state)
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state
    outs = []
    for i in range(t):
        state = torch.exp(gk[:, i])[..., None] * state + k[:, i, :, :, None] * v[:, i, :, None, :]  # [B, H, K, V]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, i] * scale, state))  # [B, H, V]
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(b, 0, h, dv)  # [B, T, H, V]
    return (o, state) if return_final_state else o


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked GLA (same arguments and result as :func:`gla_ref`).

    Inside a chunk with chunk-local cumulative log gates ``c_t = Σ_{r≤t} g_r`` (per key)::

        o_t   = Σ_{s≤t} [Σ_k q_t,k k_s,k exp(c_t,k − c_s,k)] v_s · scale + scale (q_t ⊙ exp(c_t))ᵀ S_in
        S_out = diag(exp(c_last)) S_in + Σ_s (k_s ⊙ exp(c_last − c_s)) ⊗ v_s

    The pairwise factor is split as ``exp(c_t − c_0 − r)·exp(r + c_0 − c_s)`` (``r`` per key:
    the middle of the chunk's range of ``c_t − c_0``) so the scores are one batched GEMM (no
    ``[B, Q, Q, H, K]`` block).  The factors stay far inside the float range while
    ``|c_t − c_0| ≤ L`` for every batch element, head, key and position of the chunk (L = 60
    in float32, 400 in float64; factors within e^±L/2 for forget gates), so chunks end early
    where the gates are strong: ``chunk_size`` is the longest chunk, and a chunk ends before
    the first position where that bound fails (a chunk holds at least one position).  In a
    GLA model of the LM study's quick preset after its 1500 training steps, the largest
    |Σ g| over a batch's 32 steps had median 28 and maximum 60 (one chunk each; a fresh
    model: ≈ 1.4).  float16/bfloat16 take the masked form (pairwise exponents set to −inf
    for s > t before ``exp``) on fixed chunks.
    """
    q, k, v, gk, initial_state = gla_inputs(q, k, v, gk, initial_state)
    gk = _floored(gk)  # −inf gates (hard resets): _GATE_FLOOR
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state  # [B, H, K, V]
    limit = _FACTOR_LIMIT.get(gk.dtype, 0.0) if b * h * dk else 0.0  # an empty batch: nothing to bound
    # head-major copies, made once: every chunk's products are then batched GEMMs over [B·H]
    qh, kh, gh = (x.transpose(1, 2).contiguous() for x in (q, k, gk))  # [B, H, T, K]
    vh = v.transpose(1, 2).contiguous()  # [B, H, T, V]
    outs, start = [], 0
    while start < t:
        stop = min(start + chunk_size, t)
        cum = torch.cumsum(gh[:, :, start:stop], dim=2)  # [B, H, Q, K], c_t
        if limit > 0:
            rel = cum - cum[:, :, :1]  # c_t − c_0
            stop = start + _chunk_end(rel, limit)  # the chunk ends before |c_t − c_0| > limit
            n = stop - start
            cum, rel = cum[:, :, :n], rel[:, :, :n]
            qc, kc, vc = qh[:, :, start:stop], kh[:, :, start:stop], vh[:, :, start:stop]
            mask = torch.ones(n, n, dtype=q.dtype, device=q.device).tril_() * scale  # [Q(t), Q(s)], scale folded in
            # reference r per key: the middle of the chunk's range of c_t − c_0 (the result does
            # not depend on it, so no gradient flows through it)
            r = ((rel.detach().amax(dim=2) + rel.detach().amin(dim=2)) * 0.5)[:, :, None]  # [B, H, 1, K]
            qe = qc * torch.exp(rel - r)  # q_t exp(c_t − c_0 − r)
            ke = kc * torch.exp(r - rel)  # k_s exp(r + c_0 − c_s)
            attn = torch.matmul(qe, ke.transpose(-1, -2)) * mask  # [B, H, Q, Q]
            s_in = (scale * torch.exp(cum[:, :, :1] + r)).transpose(-1, -2) * state  # exp(c_0 + r) S_in · scale
            outs.append(torch.matmul(attn, vc) + torch.matmul(qe, s_in))  # [B, H, Q, V]
            # Σ_s k_s exp(c_last − c_s) ⊗ v_s = diag(exp(c_last − c_0 − r)) Σ_s ke_s ⊗ v_s
            state = (torch.exp(cum[:, :, -1])[..., None] * state
                     + torch.exp(rel[:, :, -1:] - r).transpose(-1, -2) * torch.matmul(ke.transpose(-1, -2), vc))
        else:  # masked pairwise form on fixed chunks (float16/bfloat16)
            n = stop - start
            qc, kc, vc = qh[:, :, start:stop] * scale, kh[:, :, start:stop], vh[:, :, start:stop]
            causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()  # [Q(t), Q(s)]
            seg = cum[:, :, :, None] - cum[:, :, None, :]  # [B, H, Q(t), Q(s), K]
            seg = torch.where(causal[:, :, None], seg, torch.full_like(seg, float("-inf")))
            attn = torch.einsum("bhtk,bhsk,bhtsk->bhts", qc, kc, torch.exp(seg))  # [B, H, Q, Q]
            o_init = torch.matmul(qc * torch.exp(cum), state)  # [B, H, Q, V]
            outs.append(torch.matmul(attn, vc) + o_init)
            k_to_end = kc * torch.exp(cum[:, :, -1:] - cum)  # [B, H, Q, K]
            state = torch.exp(cum[:, :, -1])[..., None] * state + torch.matmul(k_to_end.transpose(-1, -2), vc)
        start = stop
    if not outs:
        return (v.new_zeros(b, 0, h, dv), state) if return_final_state else v.new_zeros(b, 0, h, dv)
    o = (outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)).transpose(1, 2)  # [B, T, H, V]
    return (o, state) if return_final_state else o


def _chunk_end(rel: torch.Tensor, limit: float) -> int:
    """Length of the chunk whose chunk-local ``rel = c_t − c_0`` ``[B, H, Q, K]`` is given: up
    to the first position with ``max |rel| > limit`` (max over batch, heads and keys), at
    least 1 (``rel`` is 0 at the first position).  A chunk of one position ends after it,
    with no look at the values: so the one-token step (:class:`dynlab.lm.analysis.recurrence.LMRecurrence`)
    runs under ``torch.func.vmap``/``jacrev``, which cannot batch ``nonzero``'s data-dependent shape."""
    if rel.shape[2] <= 1:
        return rel.shape[2]
    drift = rel.detach().abs().amax(dim=(0, 1, 3))  # [Q]
    over = torch.nonzero(drift > limit)
    return int(over[0, 0]) if over.numel() else rel.shape[2]


def _chunk_bounds(gk: torch.Tensor, chunk_size: int, limit: float) -> list[tuple[int, int]]:
    """``(start, stop)`` of the chunks :func:`gla_chunked` takes for log gates ``gk [B, T, H, K]``
    (the same rule on the same floored gates: :func:`_chunk_end` on chunk-local cumulative
    sums; fixed chunks when ``limit <= 0``)."""
    gk, t, bounds, start = _floored(gk), gk.shape[1], [], 0
    while start < t:
        stop = min(start + chunk_size, t)
        if limit > 0:
            cum = torch.cumsum(gk[:, start:stop].transpose(1, 2), dim=2)  # [B, H, Q, K]
            stop = start + _chunk_end(cum - cum[:, :, :1], limit)
        bounds.append((start, stop))
        start = stop
    return bounds
