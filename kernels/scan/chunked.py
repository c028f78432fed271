"""Scans for recurrent layers: diagonal affine recurrences and dense RNN recurrences.

Diagonal affine scan (Mamba, negative Mamba, AUSSM, Mamba-3)::

    h_t = a_t ⊙ h_{t−1} + b_t,   t = 0 … T−1,   h_{−1} = h0

with ``a, b [..., T, S]`` and ``h0 [..., S]`` real (any sign: negative-mamba's decay lies
in (−1, 1)) or complex (a rotation-and-decay per channel; the cells pass their
``[..., 2]`` pairs through :func:`torch.view_as_complex`).  Returns all states
``hs [..., T, S]``; ``hs[..., -1, :]`` is the final state.

- :func:`linear_scan_ref` — the plain sequential loop under autograd (the
  definition the fast path is tested against).
- :func:`linear_scan` — chunked scan with a hand-written backward.  Time is cut into
  ``nc`` chunks of ``C`` steps: (1) a local scan from a zero state inside every chunk, all
  chunks at once (C−1 fused multiply-adds over ``[..., nc, S]``) together with the
  cumulative products P of ``a`` (``torch.cumprod``, exact for any sign, no logarithms and
  no division, so decays that underflow to 0 are harmless); (2) the nc chunk-boundary
  states in sequence; (3) one fused correction ``h = h_local + P ⊙ h_boundary``.  That is
  about C + nc ≈ 2√T Python-level operations instead of T (the default on GPUs; on the
  CPU the default is one chunk, a plain loop, see :func:`default_chunk`).  The backward
  pass is the same scan run backwards in time on the adjoint: λ_t = ∂L/∂h_t + conj(a_{t+1}) λ_{t+1},
  ∂L/∂b_t = λ_t, ∂L/∂a_t = λ_t ⊙ conj(h_{t−1}), ∂L/∂h0 = conj(a_0) λ_0 (O(T) memory and
  work; no autograd graph per step).

Dense recurrence (tanh-rnn, linear-rnn, token-gated-rnn)::

    h_t = phi(g_t ⊙ (h_{t−1} Aᵀ) + d_t),   phi ∈ {identity, tanh},   g_t optional

- :func:`dense_rnn_ref` — the loop under autograd.
- :func:`dense_rnn_scan` — the loop without an autograd graph (one in-place
  ``baddbmm_`` + in-place tanh per step on a buffer initialised with the drive), and a
  backward pass that runs the reverse-time loop (one ``tanh_backward`` and one in-place
  ``baddbmm_`` per step) and forms ∂L/∂A with a single GEMM over all steps.

Both fast functions accept a leading model dimension on every argument (an ensemble:
``A [N, S, S]``) and carry ``vmap`` rules, so ``torch.func.vmap`` over stacked parameters
runs them as batched GEMMs.  This module imports torch only.
"""

from __future__ import annotations

import math

import torch

from ..compiled import common_dtype
from ..first_order import first_order

__all__ = [
    "dense_rnn_ref",
    "dense_rnn_scan",
    "default_chunk",
    "linear_scan",
    "linear_scan_ref",
]

PHIS = ("identity", "tanh")


# --------------------------------------------------------------------------------------
# diagonal affine scan
# --------------------------------------------------------------------------------------
def linear_scan_ref(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """Sequential h_t = a_t ⊙ h_{t−1} + b_t under autograd.

    Args:
        a: coefficients ``[..., T, S]`` (real or complex).
        b: inputs ``[..., T, S]``.
        h0: initial state ``[..., S]``.

    Returns:
        states ``[..., T, S]``.
    """
    h = h0
    out = []
    for a_t, b_t in zip(a.unbind(-2), b.unbind(-2)):
        h = a_t * h + b_t
        out.append(h)
    return torch.stack(out, dim=-2)


def default_chunk(length: int, device: torch.device | str = "cpu") -> int:
    """Default chunk length: T on the CPU, ⌈√T⌉ elsewhere.

    On a GPU the cost is the number of sequential launches, C + T/C, smallest at C ≈ √T.
    On the CPU every extra full-size pass over ``[…, T, S]`` costs more than the per-step
    dispatch it saves (measured: the chunked scan was about 2× slower than the
    sequential one at B=128, T=60, S=256), so the scan runs step by step there.
    """
    if torch.device(device).type == "cpu":
        return max(1, length)
    return max(1, int(math.ceil(math.sqrt(max(1, length)))))


def _scan_nograd(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int) -> torch.Tensor:
    """Chunked forward-time scan without autograd.

    ``a, b [..., T, S]`` (same shape), ``h0 [..., S]`` → states ``[..., T, S]`` (new tensor).
    """
    t_len, s = a.shape[-2], a.shape[-1]
    lead = a.shape[:-2]
    c = max(1, min(chunk, t_len))
    nc = -(-t_len // c)
    pad = nc * c - t_len
    if pad:
        a = torch.cat([a, a.new_ones(*lead, pad, s)], dim=-2)
        b = torch.cat([b, b.new_zeros(*lead, pad, s)], dim=-2)
    if nc == 1:  # plain sequential loop into a preallocated buffer
        hs = torch.empty_like(b)
        h = h0
        for t in range(t_len):
            h = torch.addcmul(b[..., t, :], a[..., t, :], h, out=hs[..., t, :])
        return hs[..., :t_len, :]
    a4 = a.reshape(*lead, nc, c, s)  # [..., nc, C, S]
    b4 = b.reshape(*lead, nc, c, s)
    prods = torch.cumprod(a4, dim=-2)  # [..., nc, C, S]: Π_{i≤j} a_i inside each chunk
    local = torch.empty_like(b4)  # [..., nc, C, S]: scan from a zero state per chunk
    local[..., 0, :] = b4[..., 0, :]
    for j in range(1, c):
        torch.addcmul(b4[..., j, :], a4[..., j, :], local[..., j - 1, :], out=local[..., j, :])
    starts = torch.empty(*lead, nc, s, dtype=b.dtype, device=b.device)  # state entering chunk k
    h = h0.expand(*lead, s)
    for k in range(nc):
        starts[..., k, :] = h
        if k + 1 < nc:
            h = torch.addcmul(local[..., k, -1, :], prods[..., k, -1, :], h)
    hs = torch.addcmul(local, prods, starts[..., None, :])  # [..., nc, C, S]
    return hs.reshape(*lead, nc * c, s)[..., :t_len, :]


class _LinearScan(torch.autograd.Function):
    """h_t = a_t ⊙ h_{t−1} + b_t with a hand-written backward; all args full-shape."""

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int) -> torch.Tensor:
        return _scan_nograd(a, b, h0, chunk)

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, _, h0, chunk = inputs
        ctx.chunk = chunk
        ctx.save_for_backward(a, h0, output)

    @staticmethod
    @first_order("linear_scan")
    def backward(ctx, grad_hs: torch.Tensor):
        a, h0, hs = ctx.saved_tensors
        if grad_hs is None:
            return None, None, None, None
        t_len = a.shape[-2]
        a_c = a.conj()
        if ctx.chunk >= t_len:  # sequential adjoint loop, no reversed copies
            lam = torch.empty_like(hs)  # [..., T, S]
            lam[..., -1, :] = grad_hs[..., -1, :]
            for t in range(t_len - 2, -1, -1):
                torch.addcmul(grad_hs[..., t, :], a_c[..., t + 1, :], lam[..., t + 1, :], out=lam[..., t, :])
        else:  # the chunked scan run backwards in time, coefficients shifted by one step
            a_rev = torch.cat([torch.zeros_like(a_c[..., :1, :]), a_c[..., 1:, :].flip(-2)], dim=-2)  # [..., T, S]
            lam = _scan_nograd(a_rev, grad_hs.flip(-2), torch.zeros_like(h0), ctx.chunk).flip(-2)  # [..., T, S]
        grad_a = grad_h0 = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.empty_like(lam)  # λ_t ⊙ conj(h_{t−1})
            torch.mul(lam[..., 1:, :], hs[..., :-1, :].conj(), out=grad_a[..., 1:, :])
            torch.mul(lam[..., 0, :], h0.conj(), out=grad_a[..., 0, :])
        if ctx.needs_input_grad[2]:
            grad_h0 = a_c[..., 0, :] * lam[..., 0, :]
        return grad_a, lam, grad_h0, None

    @staticmethod
    def vmap(info, in_dims, a, b, h0, chunk):
        a, b, h0 = (_batch_first(x, d, info.batch_size) for x, d in zip((a, b, h0), in_dims[:3]))
        return _LinearScan.apply(a, b, h0, chunk), 0


def _batch_first(x: torch.Tensor, dim: int | None, size: int) -> torch.Tensor:
    if dim is None:
        return x.expand(size, *x.shape)
    return x.movedim(dim, 0)


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Chunked scan h_t = a_t ⊙ h_{t−1} + b_t (see the module docstring).

    Args:
        a: coefficients ``[..., T, S]``, real of any sign or complex.
        b: inputs ``[..., T, S]``.
        h0: initial state ``[..., S]``.
        chunk: chunk length C (default :func:`default_chunk`; ≥ T gives the plain
            sequential loop and a sequential backward).

    Returns:
        states ``[..., T, S]`` (all leading dims broadcast).
    """
    if a.dim() < 2 or b.dim() < 2 or h0.dim() < 1:
        shapes = f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(h0.shape)}"
        raise ValueError(f"a, b need shape [..., T, S] and h0 [..., S]; got {shapes}")
    if chunk is not None and chunk < 1:
        raise ValueError(f"chunk must be ≥ 1 or None, got {chunk}")
    t_len = a.shape[-2]
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2], h0.shape[:-1])
    s = torch.broadcast_shapes(a.shape[-1:], b.shape[-1:], h0.shape[-1:])[0]
    dtype = common_dtype(a, b, h0)
    a = a.to(dtype).expand(*lead, t_len, s)
    b = b.to(dtype).expand(*lead, t_len, s)
    h0 = h0.to(dtype).expand(*lead, s)
    if t_len == 0:
        return b.clone()
    return _LinearScan.apply(a, b, h0, chunk or default_chunk(t_len, a.device))


# --------------------------------------------------------------------------------------
# dense recurrence
# --------------------------------------------------------------------------------------
def dense_rnn_ref(
    drive: torch.Tensor, A: torch.Tensor, h0: torch.Tensor, gate: torch.Tensor | None = None, phi: str = "tanh"
) -> torch.Tensor:
    """h_t = phi(g_t ⊙ (h_{t−1} Aᵀ) + d_t) under autograd.

    Args:
        drive: d ``[..., B, T, S]``.
        A: recurrence ``[S, S]`` or ``[..., S, S]`` (one per leading index).
        h0: ``[..., B, S]``.
        gate: g ``[..., B, T, S]`` or None (all ones).
        phi: ``"identity"`` or ``"tanh"``.

    Returns:
        states ``[..., B, T, S]``.
    """
    _check_phi(phi)
    h = h0
    out = []
    gates = gate.unbind(-2) if gate is not None else [None] * drive.shape[-2]
    for d_t, g_t in zip(drive.unbind(-2), gates):
        pre = h @ A.transpose(-1, -2)
        if g_t is not None:
            pre = g_t * pre
        pre = pre + d_t
        h = torch.tanh(pre) if phi == "tanh" else pre
        out.append(h)
    return torch.stack(out, dim=-2)


def _check_phi(phi: str) -> None:
    if phi not in PHIS:
        raise ValueError(f"unknown phi {phi!r} for the dense scan; allowed: {', '.join(PHIS)}")


class _DenseRNN(torch.autograd.Function):
    """Canonical shapes: drive, gate [N, B, T, S]; A [N, S, S]; h0 [N, B, S].

    Buffers are [N, T, B, S]: the (t, b) rows of one model form one matrix for the ∂L/∂A
    GEMM, and ``torch.func.vmap`` (which puts the model dimension first) hands over
    inputs in that layout when they were produced time-major, so the one full-size copy
    per pass streams.  Every step works in place on its ``[N, B, S]`` slice.
    """

    @staticmethod
    def forward(drive, A, h0, gate, phi):
        n, bsz, t_len, s = drive.shape
        at = A.transpose(-1, -2)  # [N, S, S]
        if gate is None:
            hs = drive.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # [N, T, B, S]
            ah = drive.new_empty(0)
        else:
            hs = torch.empty(n, t_len, bsz, s, dtype=drive.dtype, device=drive.device)
            ah = torch.empty_like(hs)
            drive_tm, gate_tm = drive.transpose(1, 2), gate.transpose(1, 2)  # [N, T, B, S] views
        h = h0
        for t in range(t_len):
            h_t = hs[:, t]
            if gate is None:
                h_t.baddbmm_(h, at)
            else:
                ah_t = torch.bmm(h, at)
                ah[:, t] = ah_t
                torch.addcmul(drive_tm[:, t], gate_tm[:, t], ah_t, out=h_t)
            if phi == "tanh":
                h_t.tanh_()
            h = h_t
        return hs.transpose(1, 2), (ah.transpose(1, 2) if gate is not None else ah)  # [N, B, T, S] views

    @staticmethod
    def setup_context(ctx, inputs, output):
        drive, A, h0, gate, phi = inputs
        hs, ah = output
        ctx.phi = phi
        ctx.has_gate = gate is not None
        ctx.mark_non_differentiable(ah)
        ctx.set_materialize_grads(False)  # no zero-filled full-size gradient for ah
        ctx.save_for_backward(A, h0, hs, ah, gate if gate is not None else ah)

    @staticmethod
    @first_order("dense_rnn_scan")
    def backward(ctx, grad_hs, _grad_ah):
        A, h0, hs, ah, gate = ctx.saved_tensors
        n, bsz, t_len, s = hs.shape
        if grad_hs is None:
            grad_hs = torch.zeros_like(hs)
        hs_tm = hs.transpose(1, 2)  # [N, T, B, S] (the forward buffer)
        lam = grad_hs.transpose(1, 2).clone(memory_format=torch.contiguous_format)  # lam[:, t] → ∂L/∂h_t (total)
        d_drive = torch.empty(n, t_len, bsz, s, dtype=hs.dtype, device=hs.device)  # ∂L/∂pre_t
        if ctx.has_gate:
            gate_tm, ah_tm = gate.transpose(1, 2), ah.transpose(1, 2)
            ga = torch.empty_like(d_drive)  # ∂L/∂(h_{t−1}Aᵀ)
            d_gate = torch.empty_like(d_drive)
        else:
            ga, d_gate = d_drive, None
        for t in range(t_len - 1, -1, -1):
            if ctx.phi == "tanh":
                torch.ops.aten.tanh_backward(lam[:, t], hs_tm[:, t], grad_input=d_drive[:, t])
            else:
                d_drive[:, t] = lam[:, t]
            if ctx.has_gate:
                torch.mul(d_drive[:, t], ah_tm[:, t], out=d_gate[:, t])
                torch.mul(d_drive[:, t], gate_tm[:, t], out=ga[:, t])
            if t > 0:
                lam[:, t - 1].baddbmm_(ga[:, t], A)
        grad_h0 = torch.bmm(ga[:, 0], A) if ctx.needs_input_grad[2] else None
        grad_A = None
        if ctx.needs_input_grad[1]:
            # ∂L/∂A = Σ_t ga_tᵀ h_{t−1}: one GEMM over all (t, b) rows per model.
            ga_rows = ga[:, 1:].reshape(n, (t_len - 1) * bsz, s)  # [N, (T−1)·B, S]
            hp_rows = hs_tm[:, :-1].reshape(n, (t_len - 1) * bsz, s)  # [N, (T−1)·B, S]
            grad_A = torch.baddbmm(ga[:, 0].transpose(-1, -2) @ h0, ga_rows.transpose(-1, -2), hp_rows)
        return (
            d_drive.transpose(1, 2),
            grad_A,
            grad_h0,
            d_gate.transpose(1, 2) if ctx.has_gate else None,
            None,
        )

    @staticmethod
    def vmap(info, in_dims, drive, A, h0, gate, phi):
        # Merge the vmapped dim with the canonical model dim N: [V, N, ...] -> [V·N, ...].
        v = info.batch_size
        drive, A, h0 = (_batch_first(x, d, v) for x, d in zip((drive, A, h0), in_dims[:3]))
        if gate is not None:
            gate = _batch_first(gate, in_dims[3], v)
        n = A.shape[1]
        hs, ah = _DenseRNN.apply(
            drive.flatten(0, 1), A.flatten(0, 1), h0.flatten(0, 1), None if gate is None else gate.flatten(0, 1), phi
        )
        ah = ah.unflatten(0, (v, n)) if ah.numel() else ah.expand(v, *ah.shape)
        return (hs.unflatten(0, (v, n)), ah), (0, 0)


def dense_rnn_scan(
    drive: torch.Tensor, A: torch.Tensor, h0: torch.Tensor, gate: torch.Tensor | None = None, phi: str = "tanh"
) -> torch.Tensor:
    """h_t = phi(g_t ⊙ (h_{t−1} Aᵀ) + d_t) with a hand-written reverse-time backward.

    Args:
        drive: d ``[B, T, S]`` (or ``[N, B, T, S]`` with one A per model).
        A: recurrence ``[S, S]`` (or ``[N, S, S]``).
        h0: ``[B, S]`` (or ``[N, B, S]``).
        gate: g, shaped like ``drive``, or None.
        phi: ``"identity"`` or ``"tanh"``.

    Returns:
        states shaped like ``drive``.
    """
    _check_phi(phi)
    if A.dim() == 2:
        if drive.dim() != 3 or h0.dim() != 2:
            got = f"{tuple(drive.shape)}, {tuple(h0.shape)}"
            raise ValueError(f"with A [S, S], drive must be [B, T, S] and h0 [B, S]; got {got}")
        hs, _ = _DenseRNN.apply(drive[None], A[None], h0[None], None if gate is None else gate[None], phi)
        return hs.squeeze(0)
    if A.dim() != 3 or drive.dim() != 4 or h0.dim() != 3:
        got = f"{tuple(drive.shape)}, {tuple(h0.shape)}"
        raise ValueError(f"with A [N, S, S], drive must be [N, B, T, S] and h0 [N, B, S]; got {got}")
    return _DenseRNN.apply(drive, A, h0, gate, phi)[0]
