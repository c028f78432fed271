"""Mamba-1 selective scan: diagonal decay per channel and state dim, with initial and final state.

Recurrence per batch element and channel d (state ``h_t[d]`` is an ``[N]`` vector)::

    h_t[d] = exp(Δ_t[d] · A[d]) ⊙ h_{t-1}[d] + Δ_t[d] · u_t[d] · B_t      A[d]: [N] (negative)
    y_t[d] = C_t · h_t[d]
    h_{-1} = initial_state (zero when absent)

The skip term ``D·u`` and the gate are left to the mixer. Unlike mamba-ssm's
``selective_scan_fn`` this scan takes an initial state; its contribution is added to the
zero-state output (docs/errata.md).

:func:`selective_scan_ref` is the plain-torch reference (one step at a time under
autograd). :func:`selective_scan_fused` (the torch backend of ``dispatch.selective_scan``)
is the fast path: it runs a small C kernel, built on first use by
:mod:`kernels.compiled`, when a C compiler is available (:func:`compiled_kernel_status`;
``DYNLAB_C_KERNELS=0`` turns it off) and a torch loop with a hand-written backward
otherwise.  On CUDA the backends are :func:`kernels.gla.triton.selective_scan_triton` (a
selective scan is GLA with one head per channel) and mamba-ssm's ``selective_scan_fn``
(:mod:`kernels.dispatch`).

Why C: the decay differs per channel *and* state dim, so every step touches all
``B·D·N`` state entries (4 M per layer at the LM study's quick sizes) and no matrix product
can absorb it; as torch ops each pass over them costs a dispatch and a trip through memory.
The C kernel makes one pass per (batch, channel) row with the ``[N]`` state in registers/L1:
forward and backward together about 3.7× faster than the torch loop at the quick sizes,
within 1.2× of Mamba-2's chunked SSD scan there (benchmarks/bench_lm_mixers.py has the
layer and training-step ratios).
"""

from __future__ import annotations

import ctypes

from pathlib import Path

import torch

from ..compiled import C_KERNELS_ENV, c_library_status, c_suffix, data_pointer, promoted, typed_library
from ..first_order import first_order

__all__ = [
    "selective_scan_ref",
    "selective_scan_fused",
    "selective_scan_grouped",
    "compiled_kernel_status",
    "C_KERNELS_ENV",
    "SAVE_DECAYS_MAX_BYTES",
]


def check_selective_scan_inputs(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    if u.dim() != 3:
        raise ValueError(f"u must be [B, T, D], got shape {tuple(u.shape)}")
    b, t, d = u.shape
    if delta.shape != u.shape:
        raise ValueError(f"delta must be [B, T, D] = {(b, t, d)}, got {tuple(delta.shape)}")
    if A.dim() != 2 or A.shape[0] != d:
        raise ValueError(f"A must be [D, N] with D = {d}, got {tuple(A.shape)}")
    if B.shape != (b, t, A.shape[1]) or C.shape != B.shape:
        raise ValueError(f"B and C must be [B, T, N] = {(b, t, A.shape[1])}, got {tuple(B.shape)}, {tuple(C.shape)}")


def selective_scan_inputs(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                          initial_state: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Every selective-scan form's inputs, checked (:func:`check_selective_scan_inputs`) and in
    one dtype (mixed dtypes: torch's promoted one, :func:`kernels.compiled.promoted`), in
    :func:`selective_scan_ref` as in the fused and Triton forms. Returns
    ``(u, delta, A, B, C, initial_state)``."""
    check_selective_scan_inputs(u, delta, A, B, C)
    return promoted(u, delta, A, B, C, initial_state)


def selective_scan_ref(
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
    u, delta, A, B, C, initial_state = selective_scan_inputs(u, delta, A, B, C, initial_state)
    b, t, d = u.shape
    state = u.new_zeros(b, d, A.shape[1]) if initial_state is None else initial_state
    ys = []
    for i in range(t):
        decay = torch.exp(delta[:, i, :, None] * A)  # [B, D, N]
        state = decay * state + (delta[:, i] * u[:, i])[..., None] * B[:, i, None, :]  # [B, D, N]
        ys.append(torch.einsum("bdn,bn->bd", state, C[:, i]))  # [B, D]
    y = torch.stack(ys, dim=1) if ys else u.new_zeros(b, 0, d)  # [B, T, D]
    return (y, state) if return_final_state else y


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
    @first_order("selective_scan")
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
    :func:`selective_scan_ref`; ``chunk_size`` is accepted and ignored).  The fastest
    form on the CPU.  float32/float64 CPU tensors go through the compiled C kernel when it is
    available (:func:`compiled_kernel_status`; it keeps the decays ``[B, D, T, N]`` for the
    backward pass up to :data:`SAVE_DECAYS_MAX_BYTES` and recomputes the states there; it
    runs on one thread whatever torch's thread count, as the LM presets train);
    otherwise, and on other devices, the torch loop of cache-sized steps, which holds the
    states ``[B, T, D, N]`` for the backward pass."""
    u, delta, A, B, C, initial_state = selective_scan_inputs(u, delta, A, B, C, initial_state)
    b, t, d = u.shape
    n = A.shape[1]
    h0 = u.new_zeros(b, d, n) if initial_state is None else initial_state  # [B, D, N]
    if t == 0:
        y = u.new_zeros(b, 0, d)
        return (y, h0) if return_final_state else y
    dtype = u.dtype
    args = [u, delta, A, B, C, h0]
    if u.device.type == "cpu" and c_suffix(dtype) is not None and _c_library() is not None:
        # keep the decays for the backward pass when one will run and they are not too large
        save = (torch.is_grad_enabled() and any(x.requires_grad for x in args)
                and b * t * d * n * args[0].element_size() <= SAVE_DECAYS_MAX_BYTES)
        y, final, _ = _SelectiveScanC.apply(*(x.contiguous() for x in args), save)  # y [B, T, D], final [B, D, N]
    else:
        y, final, *_ = _SelectiveScan.apply(*args)  # y [B, T, D], final [B, D, N]
    return (y, final) if return_final_state else y


def selective_scan_grouped(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The selective scans of G models at once (the LM stacks' Mamba-1 layer,
    :mod:`dynlab.lm.train.stack`): ``u, delta [G, B, T, D]``, ``A [G, D, N]``, ``B, C [G, B, T, N]``,
    initial_state ``[G, B, D, N]`` or None (zeros) -> ``(y [G, B, T, D], final [G, B, D, N])``,
    where group ``g`` is ``selective_scan_fused(u[g], delta[g], A[g], B[g], C[g],
    initial_state[g], True)``.

    With the C kernel (CPU, float32/float64) it is one call over all ``G·B`` batch rows, each
    reading its group's A and adding to its group's gradient of A: the same loops in the same
    order as G separate calls, so the same numbers bit for bit, without G autograd nodes and
    the stacking of G results and gradients around them.  The decays are kept for the
    backward pass when all groups' together fit :data:`SAVE_DECAYS_MAX_BYTES` (G separate
    calls would each compare their own share, holding G times as much; recomputed decays
    are the same numbers).  Otherwise it is :func:`selective_scan_fused` group by group."""
    if u.dim() != 4 or A.dim() != 3 or A.shape[0] != u.shape[0]:
        raise ValueError(f"selective_scan_grouped: need u [G, B, T, D] and A [G, D, N]; got {tuple(u.shape)}, "
                         f"{tuple(A.shape)}")
    g, b, t, d = u.shape
    n = A.shape[2]
    if initial_state is not None and tuple(initial_state.shape) != (g, b, d, n):
        raise ValueError(f"selective_scan_grouped: initial_state must be [G, B, D, N] = {(g, b, d, n)}, "
                         f"got {tuple(initial_state.shape)}")
    if delta.shape != u.shape or A.shape[1] != d or B.shape != (g, b, t, n) or C.shape != B.shape:
        raise ValueError(f"selective_scan_grouped: need delta {tuple(u.shape)}, A {(g, d, n)} and B, C "
                         f"{(g, b, t, n)}; got {tuple(delta.shape)}, {tuple(A.shape)}, {tuple(B.shape)}, {tuple(C.shape)}")
    u, delta, A, B, C, initial_state = promoted(u, delta, A, B, C, initial_state)  # mixed dtypes: as every form
    if g == 0:
        return u.new_zeros(0, b, t, d), u.new_zeros(0, b, d, n)
    dtype = u.dtype
    if t == 0 or b == 0 or not (u.device.type == "cpu" and c_suffix(dtype) is not None and _c_library() is not None):
        outs = [selective_scan_fused(u[i], delta[i], A[i], B[i], C[i],
                                     None if initial_state is None else initial_state[i], True) for i in range(g)]
        return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])
    h0 = u.new_zeros(g, b, d, n) if initial_state is None else initial_state
    args = [x.to(dtype).flatten(0, 1) for x in (u, delta, B, C, h0)]
    u_, delta_, B_, C_, h0_ = args
    save = (torch.is_grad_enabled() and any(x.requires_grad for x in (*args, A))
            and g * b * t * d * n * u_.element_size() <= SAVE_DECAYS_MAX_BYTES)
    y, final, _ = _SelectiveScanC.apply(u_.contiguous(), delta_.contiguous(), A.to(dtype).contiguous(),
                                        B_.contiguous(), C_.contiguous(), h0_.contiguous(), save)
    return y.view(g, b, t, d), final.view(g, b, d, n)


# --------------------------------------------------------------------------------------
# Compiled CPU kernel
# --------------------------------------------------------------------------------------

#: Largest decay buffer ``[B, D, T, N]`` (bytes) the C kernel keeps from the forward for the
#: backward pass; larger scans recompute the decays there (the same numbers; about 15 % more
#: time for the scan, measured at the LM study's quick sizes, whose buffer is 16 MiB a layer).
SAVE_DECAYS_MAX_BYTES = 64 * 2**20

#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "selective_scan.c").read_text(encoding="utf-8")



def compiled_kernel_status() -> str:
    """``"compiled: <path of the shared library>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or
    ``"unavailable: <reason>"`` (then :func:`selective_scan_fused` runs the torch loop).
    Builds the kernel on first call (:mod:`kernels.compiled`; under a second with gcc)."""
    return c_library_status("selective_scan", _C_SOURCE)


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_ss_fwd_{suf}": ([_I64] * 5 + [_PTR] * 9, ctypes.c_int),
    "dl_ss_bwd_{suf}": ([_I64] * 5 + [_PTR] * 15, ctypes.c_int),
}


def _c_library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None when turned off or it cannot be built."""
    return typed_library("selective_scan", _C_SOURCE, _SIGNATURES)


def _rows_per_group(b: int, A: torch.Tensor) -> int:
    """How many consecutive batch rows share one A: all ``b`` for ``[D, N]``, ``b / G`` for ``[G, D, N]``."""
    return b if A.dim() == 2 else b // A.shape[0]


class _SelectiveScanC(torch.autograd.Function):
    """The compiled kernel.  Forward: per (batch, channel), the ``[N]`` state stepped through
    time; with ``save_decays`` the decays go to a ``[B, D, T, N]`` buffer kept for the
    backward pass.  Backward: per (batch, channel), the row's states are recomputed into a
    ``[T + 1, N]`` scratch buffer (and its decays, when not kept), then the adjoint is
    stepped back through time.  A is ``[D, N]`` (every row) or ``[G, D, N]`` (the rows in G
    equal groups, in order: :func:`selective_scan_grouped`)."""

    @staticmethod
    def forward(u, delta, A, B, C, h0, save_decays):
        b, t, d = u.shape
        n = A.shape[-1]
        y = torch.empty(b, t, d, dtype=u.dtype)  # [B, T, D]
        final = torch.empty(b, d, n, dtype=u.dtype)  # [B, D, N]
        decays = torch.empty((b, d, t, n) if save_decays else (0,), dtype=u.dtype)  # [B, D, T, N]
        fn = getattr(_c_library(), f"dl_ss_fwd_{c_suffix(u.dtype)}")
        if fn(b, _rows_per_group(b, A), t, d, n, *map(data_pointer, (u, delta, A, B, C, h0, y, final, decays if save_decays else None))):
            raise MemoryError("selective scan: out of memory for an [N] buffer")
        return y, final, decays

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[2])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:6], output[2])

    @staticmethod
    @first_order("selective_scan")
    def backward(ctx, grad_y, grad_final, _grad_decays):
        u, delta, A, B, C, h0, decays = ctx.saved_tensors
        if grad_y is None and grad_final is None:
            return None, None, None, None, None, None, None
        b, t, d = u.shape
        n = A.shape[-1]
        gy = None if grad_y is None else grad_y.contiguous()
        gf = None if grad_final is None else grad_final.contiguous()
        grad_u, grad_delta = torch.empty(b, t, d, dtype=u.dtype), torch.empty(b, t, d, dtype=u.dtype)
        grad_A = torch.zeros(A.shape, dtype=u.dtype)  # accumulated over (a group's) batch rows and time
        grad_B, grad_C = torch.zeros(b, t, n, dtype=u.dtype), torch.zeros(b, t, n, dtype=u.dtype)  # over channels
        grad_h0 = torch.empty(b, d, n, dtype=u.dtype)
        saved = decays if decays.numel() else None
        fn = getattr(_c_library(), f"dl_ss_bwd_{c_suffix(u.dtype)}")
        if fn(b, _rows_per_group(b, A), t, d, n, *map(data_pointer, (u, delta, A, B, C, h0, saved, gy, gf, grad_u, grad_delta, grad_A, grad_B,
                                      grad_C, grad_h0))):
            raise MemoryError(f"selective scan backward: out of memory for a [{t + 1}, {n}] buffer")
        return grad_u, grad_delta, grad_A, grad_B, grad_C, grad_h0, None
