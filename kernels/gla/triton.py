"""Triton chunked GLA forward with an initial state, and Mamba-1's selective scan through it.

Same contracts as :func:`kernels.gla.gla_chunked` (pure-torch reference
:func:`kernels.gla.gla_ref`) and :func:`kernels.selective_scan.selective_scan_ref` (the
pure-torch reference of the selective scan).  Per batch element
and head (state ``S [K, V]``, log forget gates ``g_t [K]`` ≤ 0)::

    S_t = diag(exp(g_t)) · S_{t−1} + k_t ⊗ v_t,   o_t = (scale · q_t)ᵀ S_t,   S_{−1} = initial_state

One program per (batch, head) walks the chunks in order with the state in registers.
Inside a chunk with chunk-local cumulative gates ``c_t = Σ_{r≤t} g_r`` (per key)::

    o_t   = Σ_{s≤t} [Σ_k q_t,k k_s,k exp(c_t,k − c_s,k)] v_s  +  (q_t ⊙ exp(c_t))ᵀ S_in
    S_out = diag(exp(c_last)) S_in + Σ_s (k_s ⊙ exp(c_last − c_s)) ⊗ v_s

The pairwise factor is formed as a ``[Q, Q, K]`` block with the exponent masked to −inf
for s > t, never as ``exp(c_t) · exp(−c_s)``, which overflows for strong decays; that
block is why the default chunk is 16 steps.

A selective scan is GLA with one head per channel d: keys ``Δ_t[d]·B_t``, values
``u_t[d]`` (V = 1), queries ``C_t``, log gates ``Δ_t[d]·A[d]`` and scale 1.

The kernel computes in float32 (IEEE ``tl.dot``); other dtypes are cast.  Gradients: the
autograd wrapper recomputes the pure-torch chunked form in its backward pass (exact, but
not a Triton kernel).
"""

from __future__ import annotations

import torch

from ..first_order import first_order
from ..selective_scan.chunked import selective_scan_inputs
from .chunked import gla_chunked, gla_inputs

try:  # triton is optional: the package works without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

HAS_TRITON = triton is not None

__all__ = ["HAS_TRITON", "gla_triton", "selective_scan_triton"]


def _block(n: int) -> int:
    """Power-of-two block ≥ 16 (``tl.dot`` needs every dimension ≥ 16 on GPUs)."""
    return max(16, 1 << max(0, n - 1).bit_length())


if HAS_TRITON:

    @triton.jit
    def _gla_fwd_kernel(
        q_ptr, k_ptr, v_ptr, g_ptr, h0_ptr,  # q, k, g [Bt, T, H, K]; v [Bt, T, H, V]; h0 [Bt, H, K, V]
        o_ptr, hT_ptr,  # outputs: o [Bt, T, H, V]; final state [Bt, H, K, V]
        scale, T, H, K, V,
        HAS_INIT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        i = tl.arange(0, BQ)
        kk = tl.arange(0, BK)
        vv = tl.arange(0, BV)
        km = kk < K
        vm = vv < V
        st_off = ((b * H + h) * K + kk[:, None]) * V + vv[None, :]  # [BK, BV]
        st_mask = km[:, None] & vm[None, :]
        if HAS_INIT:
            state = tl.load(h0_ptr + st_off, mask=st_mask, other=0.0)
        else:
            state = tl.zeros([BK, BV], dtype=tl.float32)
        causal = (i[:, None] >= i[None, :])[:, :, None]  # [BQ(t), BQ(s), 1]
        for start in range(0, T, BQ):
            t = start + i
            tm = t < T
            row = (b * T + t) * H + h  # [BQ]
            qk_mask = tm[:, None] & km[None, :]
            qc = tl.load(q_ptr + row[:, None] * K + kk[None, :], mask=qk_mask, other=0.0) * scale  # [BQ, BK]
            kc = tl.load(k_ptr + row[:, None] * K + kk[None, :], mask=qk_mask, other=0.0)  # [BQ, BK]
            gc = tl.load(g_ptr + row[:, None] * K + kk[None, :], mask=qk_mask, other=0.0)  # [BQ, BK]
            vc = tl.load(v_ptr + row[:, None] * V + vv[None, :], mask=tm[:, None] & vm[None, :], other=0.0)  # [BQ, BV]
            cum = tl.cumsum(gc, axis=0)  # [BQ, BK]
            seg = tl.where(causal, cum[:, None, :] - cum[None, :, :], float("-inf"))  # [BQ, BQ, BK]
            attn = tl.sum(qc[:, None, :] * kc[None, :, :] * tl.exp(seg), axis=2)  # [BQ, BQ]
            o = tl.dot(attn, vc, input_precision="ieee")  # [BQ, BV]
            o += tl.dot(qc * tl.exp(cum), state, input_precision="ieee")
            tl.store(o_ptr + row[:, None] * V + vv[None, :], o, mask=tm[:, None] & vm[None, :])
            last = tl.sum(tl.where(i[:, None] == BQ - 1, cum, 0.0), axis=0)  # [BK]: c at the last step
            k_to_end = kc * tl.exp(last[None, :] - cum)  # [BQ, BK]
            state = tl.exp(last)[:, None] * state + tl.dot(tl.trans(k_to_end), vc, input_precision="ieee")
        tl.store(hT_ptr + st_off, state, mask=st_mask)


def _gla_forward(q, k, v, gk, scale, h0, chunk_size):
    """Launch the kernel on float32 contiguous copies; returns ``(o, final_state)`` in float32."""
    bsz, t_len, h, dk = q.shape
    dv = v.shape[-1]
    f32 = [x.float().contiguous() for x in (q, k, v, gk)]
    init = h0.float().contiguous() if h0 is not None else f32[0]  # dummy pointer when absent
    o = torch.empty(bsz, t_len, h, dv, dtype=torch.float32, device=q.device)
    final = torch.empty(bsz, h, dk, dv, dtype=torch.float32, device=q.device)
    _gla_fwd_kernel[(bsz * h,)](
        *f32, init, o, final, float(scale), t_len, h, dk, dv,
        HAS_INIT=h0 is not None, BQ=_block(chunk_size), BK=_block(dk), BV=_block(dv),
    )
    return o, final


class _TritonGLA(torch.autograd.Function):
    """Triton forward; backward through the pure-torch chunked form (recomputed)."""

    @staticmethod
    def forward(ctx, scale, chunk_size, has_init, q, k, v, gk, h0):
        ctx.scale, ctx.chunk_size, ctx.has_init = scale, chunk_size, has_init
        ctx.save_for_backward(q, k, v, gk, h0)
        o, final = _gla_forward(q, k, v, gk, scale, h0 if has_init else None, chunk_size)
        return o.to(v.dtype), final.to(v.dtype)

    @staticmethod
    @first_order("gla_triton")
    def backward(ctx, grad_o, grad_final):
        saved = [x.detach().requires_grad_(x.requires_grad) for x in ctx.saved_tensors]
        q, k, v, gk, h0 = saved
        with torch.enable_grad():
            init = h0 if ctx.has_init else None
            o, final = gla_chunked(q, k, v, gk, ctx.scale, init, True, chunk_size=ctx.chunk_size)
            outs = [(y, g) for y, g in ((o, grad_o), (final, grad_final)) if g is not None]
            needs = [x for x in saved if x.requires_grad]
            grads = iter(torch.autograd.grad([y for y, _ in outs], needs, [g for _, g in outs], allow_unused=True))
        return (None, None, None, *[next(grads) if x.requires_grad else None for x in saved])


def gla_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gk: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 16,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked GLA on the Triton kernel (same arguments and result as ``gla_chunked``).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; gk: ``[B, T, H, K]`` log forget gates.
        scale: query scale, default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or None (zeros).
        return_final_state: also return the last state.
        chunk_size: steps per chunk (rounded up to a power of two ≥ 16 inside the kernel).

    Returns:
        ``o [B, T, H, V]`` and, if asked, ``final_state [B, H, K, V]``.
    """
    if not HAS_TRITON:
        raise RuntimeError("gla_triton needs the triton package (pip install 'dynlab[triton]')")
    q, k, v, gk, initial_state = gla_inputs(q, k, v, gk, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    has_init = initial_state is not None
    h0 = initial_state if has_init else q.new_zeros(0)
    o, final = _TritonGLA.apply(scale, _block(chunk_size), has_init, q, k, v, gk, h0)
    return (o, final) if return_final_state else o


def selective_scan_triton(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 16,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Mamba-1 selective scan through :func:`gla_triton` (arguments as ``selective_scan_ref``).

    Args:
        u, delta: ``[B, T, D]``; A: ``[D, N]``; B, C: ``[B, T, N]``.
        initial_state: ``[B, D, N]`` or None (zeros).

    Returns:
        ``y [B, T, D]`` and, if asked, ``final_state [B, D, N]``.
    """
    u, delta, A, B, C, initial_state = selective_scan_inputs(u, delta, A, B, C, initial_state)
    b, t, d = u.shape
    n = A.shape[1]
    q = C[:, :, None, :].expand(b, t, d, n)  # [B, T, D(heads), N(keys)]
    k = delta[..., None] * B[:, :, None, :]  # [B, T, D, N]
    gk = delta[..., None] * A  # [B, T, D, N]
    init = None if initial_state is None else initial_state[..., None]  # [B, D, N, 1]
    y, state = gla_triton(q, k, u[..., None], gk, 1.0, init, True, chunk_size)
    return (y[..., 0], state[..., 0]) if return_final_state else y[..., 0]
