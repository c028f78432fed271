"""Triton chunked Mamba-2 SSD forward with an initial state (and final state).

Same contract as :func:`kernels.ssd.ssd_chunked`; its pure-torch reference is
:func:`kernels.ssd.ssd_ref`.  Per batch element b and head h (state ``S [P, N]``)::

    S_t = exp(dt_t · A) · S_{t−1} + dt_t · x_t ⊗ B_t,   y_t = S_t · C_t,   S_{−1} = initial_state

One program per (b, h) walks the chunks of ``chunk_size`` steps in order with the state
in registers.  Inside a chunk with chunk-local cumulative log decay ``c_t = Σ_{r≤t} dt_r A``::

    y_t   = Σ_{s≤t} exp(c_t − c_s) (C_t·B_s) dt_s x_s  +  exp(c_t) S_in · C_t
    S_out = exp(c_last) S_in + Σ_s exp(c_last − c_s) dt_s x_s ⊗ B_s

The pairwise exponent is masked to −inf for s > t before ``exp`` (no overflow).  Padded
steps past T load dt = 0 (decay 1, no input), so the last chunk needs no special case.

The kernel computes in float32 (``tl.dot`` with IEEE precision, no TF32); other input
dtypes are cast to float32 and the results cast back.  Gradients: the autograd wrapper
recomputes the pure-torch chunked form (:func:`kernels.ssd.ssd_chunked`) in its backward
pass, so training through this forward is exact but the backward is not a Triton kernel.
"""

from __future__ import annotations

import torch

from ..first_order import first_order
from .chunked import ssd_chunked, ssd_inputs

try:  # triton is optional: the package works without it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

HAS_TRITON = triton is not None

__all__ = ["HAS_TRITON", "ssd_triton"]


def _block(n: int) -> int:
    """Power-of-two block ≥ 16 (``tl.dot`` needs every dimension ≥ 16 on GPUs)."""
    return max(16, 1 << max(0, n - 1).bit_length())


if HAS_TRITON:

    @triton.jit
    def _ssd_fwd_kernel(
        x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, h0_ptr,  # x [Bt, T, H, P]; dt [Bt, T, H]; A [H]; B, C [Bt, T, H, N]; h0 [Bt, H, P, N]
        y_ptr, hT_ptr,  # outputs: y [Bt, T, H, P]; final state [Bt, H, P, N]
        T, H, P, N,
        HAS_INIT: tl.constexpr, BQ: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr,
    ):
        pid = tl.program_id(0)
        b = pid // H
        h = pid % H
        q = tl.arange(0, BQ)
        p = tl.arange(0, BP)
        n = tl.arange(0, BN)
        pm = p < P
        nm = n < N
        a_rate = tl.load(A_ptr + h)
        st_off = ((b * H + h) * P + p[:, None]) * N + n[None, :]  # [BP, BN]
        st_mask = pm[:, None] & nm[None, :]
        if HAS_INIT:
            state = tl.load(h0_ptr + st_off, mask=st_mask, other=0.0)
        else:
            state = tl.zeros([BP, BN], dtype=tl.float32)
        causal = q[:, None] >= q[None, :]  # [BQ(t), BQ(s)]
        for start in range(0, T, BQ):
            t = start + q
            tm = t < T
            row = (b * T + t) * H + h  # [BQ] index of (b, t, h)
            x = tl.load(x_ptr + row[:, None] * P + p[None, :], mask=tm[:, None] & pm[None, :], other=0.0)  # [BQ, BP]
            dt = tl.load(dt_ptr + row, mask=tm, other=0.0)  # [BQ]
            Bm = tl.load(B_ptr + row[:, None] * N + n[None, :], mask=tm[:, None] & nm[None, :], other=0.0)  # [BQ, BN]
            Cm = tl.load(C_ptr + row[:, None] * N + n[None, :], mask=tm[:, None] & nm[None, :], other=0.0)  # [BQ, BN]
            cum = tl.cumsum(dt * a_rate, axis=0)  # [BQ]
            seg = tl.where(causal, cum[:, None] - cum[None, :], float("-inf"))  # [BQ, BQ]
            scores = tl.dot(Cm, tl.trans(Bm), input_precision="ieee")  # [BQ, BQ]: C_t·B_s
            xdt = x * dt[:, None]  # [BQ, BP]
            y = tl.dot(tl.exp(seg) * scores, xdt, input_precision="ieee")  # [BQ, BP]
            y += tl.exp(cum)[:, None] * tl.dot(Cm, tl.trans(state), input_precision="ieee")  # [BQ, BP]
            tl.store(y_ptr + row[:, None] * P + p[None, :], y, mask=tm[:, None] & pm[None, :])
            last = tl.sum(tl.where(q == BQ - 1, cum, 0.0), axis=0)  # c at the chunk's last (maybe padded) step
            to_end = tl.exp(last - cum)  # [BQ]
            state = tl.exp(last) * state + tl.dot(tl.trans(xdt * to_end[:, None]), Bm, input_precision="ieee")
        tl.store(hT_ptr + st_off, state, mask=st_mask)


def _ssd_forward(x, dt, A, B, C, h0, chunk_size):
    """Launch the kernel on float32 contiguous copies; returns ``(y, final_state)`` in float32."""
    bsz, t_len, h, p = x.shape
    n = B.shape[-1]
    f32 = [v.float().contiguous() for v in (x, dt, A, B, C)]
    init = h0.float().contiguous() if h0 is not None else f32[0]  # dummy pointer when absent
    y = torch.empty(bsz, t_len, h, p, dtype=torch.float32, device=x.device)
    final = torch.empty(bsz, h, p, n, dtype=torch.float32, device=x.device)
    _ssd_fwd_kernel[(bsz * h,)](
        *f32, init, y, final, t_len, h, p, n,
        HAS_INIT=h0 is not None, BQ=_block(chunk_size), BP=_block(p), BN=_block(n),
    )
    return y, final


class _TritonSSD(torch.autograd.Function):
    """Triton forward; backward through the pure-torch chunked form (recomputed)."""

    @staticmethod
    def forward(ctx, chunk_size, has_init, x, dt, A, B, C, h0):
        ctx.chunk_size, ctx.has_init = chunk_size, has_init
        ctx.save_for_backward(x, dt, A, B, C, h0)
        y, final = _ssd_forward(x, dt, A, B, C, h0 if has_init else None, chunk_size)
        return y.to(x.dtype), final.to(x.dtype)

    @staticmethod
    @first_order("ssd_triton")
    def backward(ctx, grad_y, grad_final):
        saved = [v.detach().requires_grad_(v.requires_grad) for v in ctx.saved_tensors]
        x, dt, A, B, C, h0 = saved
        with torch.enable_grad():
            y, final = ssd_chunked(x, dt, A, B, C, h0 if ctx.has_init else None, True, chunk_size=ctx.chunk_size)
            outs = [(o, g) for o, g in ((y, grad_y), (final, grad_final)) if g is not None]
            needs = [v for v in saved if v.requires_grad]
            grads = iter(torch.autograd.grad([o for o, _ in outs], needs, [g for _, g in outs], allow_unused=True))
        return (None, None, *[next(grads) if v.requires_grad else None for v in saved])


def ssd_triton(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan on the Triton kernel (same arguments and result as ``ssd_chunked``).

    Args:
        x: ``[B, T, H, P]`` inputs; dt: ``[B, T, H]`` positive step sizes; A: ``[H]``
            negative rates; B, C: ``[B, T, H, N]``.
        initial_state: ``[B, H, P, N]`` or None (zeros).
        return_final_state: also return the state after the last step.
        chunk_size: steps per chunk (rounded up to a power of two ≥ 16 inside the kernel).

    Returns:
        ``y [B, T, H, P]`` and, if asked, ``final_state [B, H, P, N]``.
    """
    if not HAS_TRITON:
        raise RuntimeError("ssd_triton needs the triton package (pip install 'dynlab[triton]')")
    x, dt, A, B, C, initial_state = ssd_inputs(x, dt, A, B, C, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    has_init = initial_state is not None
    h0 = initial_state if has_init else x.new_zeros(0)
    y, final = _TritonSSD.apply(_block(chunk_size), has_init, x, dt, A, B, C, h0)
    return (y, final) if return_final_state else y
