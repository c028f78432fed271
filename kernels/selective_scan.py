"""Mamba-1 selective scan: diagonal decay per channel and state dim, with initial and final state.

Recurrence per batch element and channel d (state ``h_t[d]`` is an ``[N]`` vector)::

    h_t[d] = exp(Δ_t[d] · A[d]) ⊙ h_{t-1}[d] + Δ_t[d] · u_t[d] · B_t      A[d]: [N] (negative)
    y_t[d] = C_t · h_t[d]
    h_{-1} = initial_state (zero when absent)

The skip term ``D·u`` and the gate are left to the mixer. Unlike mamba-ssm's
``selective_scan_fn`` this scan takes an initial state; its contribution is added to the
zero-state output (docs/errata.md).

:func:`selective_scan_sequential` is the reference. :func:`selective_scan_chunked` uses the
identity that a selective scan is GLA with one head per channel, keys ``Δ_t[d]·B_t``,
values ``u_t[d]`` (V = 1), queries ``C_t`` and log gates ``Δ_t[d]·A[d]`` (scale 1), and
runs the chunked GLA form.
"""

from __future__ import annotations

import torch

from .gla import gla_chunked

__all__ = ["selective_scan_sequential", "selective_scan_chunked", "selective_scan_fused", "selective_scan_step"]


def _check(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    if u.dim() != 3:
        raise ValueError(f"u must be [B, T, D], got shape {tuple(u.shape)}")
    b, t, d = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"delta must be [B, T, D] = {(b, t, d)}, got {tuple(delta.shape)}")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"A must be [D, N] with D = {d}, got {tuple(A.shape)}")
    if B.shape != (b, t, A.shape[1]) or C.shape != B.shape:
        raise ValueError(f"B and C must be [B, T, N] = {(b, t, A.shape[1])}, got {tuple(B.shape)}, {tuple(C.shape)}")


def selective_scan_step(
    state: torch.Tensor, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step. state ``[B, D, N]``; u, delta ``[B, D]``; A ``[D, N]``; B, C ``[B, N]``.

    Returns ``(y_t [B, D], h_t [B, D, N])``.
    """
    decay = torch.exp(delta[..., None] * A)  # [B, D, N]
    state = decay * state + (delta * u)[..., None] * B[:, None, :]  # [B, D, N]
    y = torch.einsum("bdn,bn->bd", state, C)
    return y, state


def selective_scan_sequential(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference selective scan, one step at a time.

    Args:
        u: ``[B, T, D]`` inputs; delta: ``[B, T, D]`` positive step sizes.
        A: ``[D, N]`` negative rates; B, C: ``[B, T, N]``.
        initial_state: ``[B, D, N]`` or None (zeros).
        return_final_state: also return the last state.

    Returns:
        ``y [B, T, D]`` and, if asked, ``final_state [B, D, N]``.
    """
    _check(u, delta, A, B, C)
    b, t, d = u.shape
    state = u.new_zeros(b, d, A.shape[1]) if initial_state is None else initial_state
    ys = []
    for i in range(t):
        y, state = selective_scan_step(state, u[:, i], delta[:, i], A, B[:, i], C[:, i])
        ys.append(y)
    y = torch.stack(ys, dim=1) if ys else u.new_zeros(b, 0, d)  # [B, T, D]
    return (y, state) if return_final_state else y


def selective_scan_chunked(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 32,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked selective scan (same arguments and result as :func:`selective_scan_sequential`)."""
    _check(u, delta, A, B, C)
    b, t, d = u.shape
    n = A.shape[1]
    q = C[:, :, None, :].expand(b, t, d, n)  # [B, T, D(heads), N(keys)]
    k = delta[..., None] * B[:, :, None, :]  # [B, T, D, N]
    v = u[..., None]  # [B, T, D, 1]
    gk = delta[..., None] * A  # [B, T, D, N]
    init = None if initial_state is None else initial_state[..., None]  # [B, D, N, 1]
    y, state = gla_chunked(q, k, v, gk, scale=1.0, initial_state=init, return_final_state=True, chunk_size=chunk_size)
    y = y[..., 0]  # [B, T, D]
    return (y, state[..., 0]) if return_final_state else y


class _SelectiveScan(torch.autograd.Function):
    """Selective scan with a hand-written backward (no autograd graph per step).

    Both passes walk time one step at a time on ``[B, D, N]`` slices that stay in cache:
    the decays exp(Δ_t[d] A[d, n]) are recomputed per step rather than stored, the
    states ``[B, T, D, N]`` are the only full-size buffer (written forward, read
    backward), and the adjoint λ_t = ∂L/∂h_t lives in one ``[B, D, N]`` buffer.  (Storing
    the decays and doing the reductions as full-size broadcast products measured about
    1.6× slower on the CPU: the full-size passes are bound by memory bandwidth.)
    """

    @staticmethod
    def forward(u, delta, A, B, C, h0):
        b, t, d = u.shape
        n = A.shape[1]
        du = delta * u  # [B, T, D]
        hs = torch.empty(b, t, d, n, dtype=u.dtype, device=u.device)  # [B, T, D, N]
        y = torch.empty(b, t, d, dtype=u.dtype, device=u.device)  # [B, T, D]
        dec = torch.empty(b, d, n, dtype=u.dtype, device=u.device)  # [B, D, N], one step
        h = h0
        for i in range(t):
            torch.mul(delta[:, i, :, None], A, out=dec).exp_()
            h_i = hs[:, i]
            torch.mul(du[:, i, :, None], B[:, i, None, :], out=h_i)
            h_i.addcmul_(dec, h)
            torch.bmm(h_i, C[:, i, :, None], out=y[:, i, :, None])  # Σ_n C_t[n] h_t[d, n]
            h = h_i
        return y, hs[:, -1].clone(), hs, du

    @staticmethod
    def setup_context(ctx, inputs, output):
        u, delta, A, B, C, h0 = inputs
        _, _, hs, du = output
        ctx.mark_non_differentiable(hs, du)
        ctx.set_materialize_grads(False)  # no zero-filled [B, T, D, N] gradient for hs
        ctx.save_for_backward(u, delta, A, B, C, h0, hs, du)

    @staticmethod
    def backward(ctx, grad_y, grad_final, _grad_hs, _grad_du):
        u, delta, A, B, C, h0, hs, du = ctx.saved_tensors
        b, t, d = u.shape
        n = A.shape[1]
        if grad_y is None:
            grad_y = torch.zeros_like(u)
        lam = grad_final.clone() if grad_final is not None else u.new_zeros(b, d, n)  # carry into step t
        dec = torch.empty(b, d, n, dtype=u.dtype, device=u.device)
        gz = torch.empty_like(dec)
        grad_C = torch.empty(b, t, n, dtype=u.dtype, device=u.device)
        grad_du = torch.empty(b, t, d, dtype=u.dtype, device=u.device)
        grad_B = torch.empty(b, t, n, dtype=u.dtype, device=u.device)
        grad_z = torch.empty(b, t, d, dtype=u.dtype, device=u.device)  # Σ_n ∂L/∂(Δ_t A)[d, n] A[d, n]
        grad_A = torch.zeros_like(A)
        for i in range(t - 1, -1, -1):
            gy_i = grad_y[:, i]  # [B, D]
            lam.baddbmm_(gy_i[:, :, None], C[:, i, None, :])  # λ_t = carry + gy_t ⊗ C_t
            torch.bmm(gy_i[:, None, :], hs[:, i], out=grad_C[:, i, None, :])
            torch.bmm(lam, B[:, i, :, None], out=grad_du[:, i, :, None])
            torch.bmm(du[:, i, None, :], lam, out=grad_B[:, i, None, :])
            torch.mul(delta[:, i, :, None], A, out=dec).exp_()
            torch.mul(lam, dec, out=gz)
            gz.mul_(hs[:, i - 1] if i > 0 else h0)  # ∂L/∂(Δ_t A) = λ_t ⊙ decay_t ⊙ h_{t−1}
            torch.sum(gz * A, dim=-1, out=grad_z[:, i])
            grad_A.add_((gz * delta[:, i, :, None]).sum(0))
            lam.mul_(dec)  # carry = decay_t ⊙ λ_t
        grad_delta = grad_z + grad_du * u
        return grad_du * delta, grad_delta, grad_A, grad_B, grad_C, lam


def selective_scan_fused(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Selective scan with a hand-written backward (arguments and result as
    :func:`selective_scan_sequential`; ``chunk_size`` is accepted and ignored).  The fastest
    form on the CPU: cache-sized steps forward and backward, no autograd graph; holds the
    states ``[B, T, D, N]`` for the backward pass."""
    _check(u, delta, A, B, C)
    b, t, d = u.shape
    n = A.shape[1]
    h0 = u.new_zeros(b, d, n) if initial_state is None else initial_state  # [B, D, N]
    if t == 0:
        y = u.new_zeros(b, 0, d)
        return (y, h0) if return_final_state else y
    dtype = torch.promote_types(u.dtype, A.dtype)
    args = [x.to(dtype) for x in (u, delta, A, B, C, h0)]
    y, final, *_ = _SelectiveScan.apply(*args)  # y [B, T, D], final [B, D, N]
    return (y, final) if return_final_state else y
