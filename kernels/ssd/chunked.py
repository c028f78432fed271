"""Mamba-2 state-space duality (SSD) scan: scalar decay per head, with initial and final state.

Recurrence per batch element b and head h (state ``S_t`` is a ``[P, N]`` matrix)::

    a_t  = exp(dt_t · A)                      scalar in (0, 1] since A < 0, dt > 0
    S_t  = a_t · S_{t-1} + dt_t · x_t ⊗ B_t     x_t: [P], B_t: [N]
    y_t  = S_t · C_t                           C_t: [N]  ->  y_t: [P]
    S_{-1} = initial_state (zero when absent)

Unrolled (time-ordered products, docs/errata.md; scalars here, so the order is only kept for
clarity): ``S_t = Σ_{s≤t} (Π_{r=s+1..t} a_r) dt_s x_s ⊗ B_s + (Π_{r=0..t} a_r) S_{-1}``.
The initial state's contribution is *added* to the zero-state output (docs/errata.md).

Two implementations that must agree: :func:`ssd_ref` (the plain-torch reference, one step
at a time under autograd) and :func:`ssd_chunked` (the fast torch path: a quadratic
attention-like form inside chunks of ``chunk_size`` steps, states carried between chunks
in log space).  :mod:`kernels.ssd.triton` and mamba-ssm are the CUDA backends
(:mod:`kernels.dispatch`).
"""

from __future__ import annotations

import torch

from ..compiled import promoted

__all__ = ["ssd_ref", "ssd_chunked"]


def check_ssd_inputs(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    if x.dim() != 4:
        raise ValueError(f"x must be [B, T, H, P], got shape {tuple(x.shape)}")
    b, t, h, _ = x.shape
    if dt.shape != (b, t, h):
        raise ValueError(f"dt must be [B, T, H] = {(b, t, h)}, got {tuple(dt.shape)}")
    if A.shape != (h,):
        raise ValueError(f"A must be [H] = {(h,)}, got {tuple(A.shape)}")
    if B.shape[:3] != (b, t, h) or C.shape != B.shape:
        raise ValueError(f"B and C must be [B, T, H, N] with [B, T, H] = {(b, t, h)}, got {tuple(B.shape)}, {tuple(C.shape)}")


def ssd_inputs(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               initial_state: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Every SSD form's inputs, checked (:func:`check_ssd_inputs`) and in one dtype (mixed
    dtypes: torch's promoted one, :func:`kernels.compiled.promoted`), in :func:`ssd_ref` as in
    the chunked and Triton forms. Returns ``(x, dt, A, B, C, initial_state)``."""
    check_ssd_inputs(x, dt, A, B, C)
    return promoted(x, dt, A, B, C, initial_state)


def ssd_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference SSD scan, one step at a time.

    Args:
        x: ``[B, T, H, P]`` inputs.
        dt: ``[B, T, H]`` positive step sizes (softplus already applied).
        A: ``[H]`` negative decay rates.
        B, C: ``[B, T, H, N]`` input and output projections.
        initial_state: ``[B, H, P, N]`` or None (zeros).
        return_final_state: also return S_{T-1}.

    Returns:
        ``y [B, T, H, P]`` and, if asked, ``final_state [B, H, P, N]``.
    """
    x, dt, A, B, C, initial_state = ssd_inputs(x, dt, A, B, C, initial_state)
    b, t, h, p = x.shape
    n = B.shape[-1]
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i] * A)  # [B, H]
        inject = (dt[:, i, :, None] * x[:, i])[..., None] * B[:, i, :, None, :]  # [B, H, P, N]
        state = decay[..., None, None] * state + inject  # [B, H, P, N]
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, i]))  # [B, H, P]
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(b, 0, h, p)  # [B, T, H, P]
    return (y, state) if return_final_state else y


def ssd_chunked(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked SSD scan (same arguments and result as :func:`ssd_ref`).

    Inside a chunk with cumulative log decay ``c_t = Σ_{r≤t} dt_r A`` (chunk-local)::

        y_t = Σ_{s≤t} exp(c_t − c_s) (C_t·B_s) dt_s x_s  +  exp(c_t) S_in · C_t
        S_out = exp(c_last) S_in + Σ_s exp(c_last − c_s) dt_s x_s ⊗ B_s

    Exponents of masked (s > t) pairs are set to −inf *before* ``exp`` so nothing overflows.
    """
    x, dt, A, B, C, initial_state = ssd_inputs(x, dt, A, B, C, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size}")
    b, t, h, p = x.shape
    n = B.shape[-1]
    state = x.new_zeros(b, h, p, n) if initial_state is None else initial_state
    ys = []
    for start in range(0, t, chunk_size):
        stop = min(start + chunk_size, t)
        q = stop - start
        xc, dtc, Bc, Cc = x[:, start:stop], dt[:, start:stop], B[:, start:stop], C[:, start:stop]
        logdecay = dtc * A  # [B, Q, H]
        cum = torch.cumsum(logdecay, dim=1)  # [B, Q, H]
        seg = cum[:, :, None, :] - cum[:, None, :, :]  # [B, Q(t), Q(s), H]
        causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()  # [Q, Q]
        seg = torch.where(causal[None, :, :, None], seg, torch.full_like(seg, float("-inf")))
        weights = torch.exp(seg) * torch.einsum("bthn,bshn->btsh", Cc, Bc)  # [B, Q, Q, H]
        xdt = xc * dtc[..., None]  # [B, Q, H, P]
        y_intra = torch.einsum("btsh,bshp->bthp", weights, xdt)  # [B, Q, H, P]
        y_init = torch.einsum("bhpn,bthn->bthp", state, Cc) * torch.exp(cum)[..., None]  # [B, Q, H, P]
        ys.append(y_intra + y_init)
        to_end = torch.exp(cum[:, -1:, :] - cum)  # [B, Q, H]
        state = torch.exp(cum[:, -1])[..., None, None] * state + torch.einsum(
            "bsh,bshp,bshn->bhpn", to_end, xdt, Bc
        )  # [B, H, P, N]
    y = torch.cat(ys, dim=1) if ys else x.new_zeros(b, 0, h, p)  # [B, T, H, P]
    return (y, state) if return_final_state else y
