"""Triton diagonal affine scan, forward and backward (real or complex, initial state).

Same recurrence and result as :func:`kernels.scan.linear_scan` (its pure-torch reference
is :func:`kernels.scan.linear_scan_ref`)::

    h_t = a_t ⊙ h_{t−1} + b_t,   t = 0 … T−1,   h_{−1} = h0,   final state = h_{T−1}

Layout: the leading dims are flattened into M rows, so the kernels see ``a, b, hs
[M, T, S]`` and ``h0 [M, S]`` (contiguous).  Complex tensors travel as their
``torch.view_as_real`` planes (``[M, T, S, 2]``: real part at even offsets, imaginary
part at odd ones) and the kernels do the complex products themselves.

- Forward: one program per (row m, block of ``BLOCK_S`` channels) runs t = 0 … T−1 with
  the state in registers and writes every h_t (the states are the output).
- Backward: the same programs run t = T−1 … 0 on the adjoint
  λ_t = ∂L/∂h_t + conj(a_{t+1}) λ_{t+1} and write ∂L/∂b_t = λ_t,
  ∂L/∂a_t = λ_t ⊙ conj(h_{t−1}) and ∂L/∂h0 = conj(a_0) λ_0.

Supported dtypes: float32, float64, complex64, complex128 (the arithmetic runs in that
precision).  Everything here imports torch and triton only; :data:`HAS_TRITON` is False
when triton is not installed, and the functions then raise.  Set ``TRITON_INTERPRET=1``
before importing triton to run the kernels on the CPU (how the tests run them).
"""

from __future__ import annotations

import torch

from ..compiled import common_dtype
from ..first_order import first_order
from .chunked import linear_scan

try:  # triton is optional: the package works without it (CPU paths are pure torch)
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

HAS_TRITON = triton is not None

__all__ = ["HAS_TRITON", "SCAN_DTYPES", "linear_scan_triton"]

SCAN_DTYPES = (torch.float32, torch.float64, torch.complex64, torch.complex128)
BLOCK_S = 32  # one autotune-free configuration (the 3.x interpreter wants exactly one)


if HAS_TRITON:

    @triton.jit
    def _cmul(ar, ai, br, bi):
        """(ar + i·ai)(br + i·bi)."""
        return ar * br - ai * bi, ar * bi + ai * br

    @triton.jit
    def _scan_fwd_kernel(
        a_ptr, b_ptr, h0_ptr, hs_ptr,  # a, b, hs [M, T, S(, 2)]; h0 [M, S(, 2)]
        T, S,
        IS_COMPLEX: tl.constexpr, BLOCK: tl.constexpr,
    ):
        m = tl.program_id(0)
        s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] channel indices
        mask = s < S
        if IS_COMPLEX:
            h_off = (m * S + s) * 2
            hr = tl.load(h0_ptr + h_off, mask=mask, other=0.0)
            hi = tl.load(h0_ptr + h_off + 1, mask=mask, other=0.0)
            for t in range(T):
                off = ((m * T + t) * S + s) * 2
                ar = tl.load(a_ptr + off, mask=mask, other=0.0)
                ai = tl.load(a_ptr + off + 1, mask=mask, other=0.0)
                br = tl.load(b_ptr + off, mask=mask, other=0.0)
                bi = tl.load(b_ptr + off + 1, mask=mask, other=0.0)
                pr, pi = _cmul(ar, ai, hr, hi)
                hr = pr + br
                hi = pi + bi
                tl.store(hs_ptr + off, hr, mask=mask)
                tl.store(hs_ptr + off + 1, hi, mask=mask)
        else:
            h = tl.load(h0_ptr + m * S + s, mask=mask, other=0.0)
            for t in range(T):
                off = (m * T + t) * S + s
                a = tl.load(a_ptr + off, mask=mask, other=0.0)
                b = tl.load(b_ptr + off, mask=mask, other=0.0)
                h = a * h + b
                tl.store(hs_ptr + off, h, mask=mask)

    @triton.jit
    def _scan_bwd_kernel(
        a_ptr, h0_ptr, hs_ptr, g_ptr,  # inputs: a, hs, g = ∂L/∂hs [M, T, S(, 2)]; h0 [M, S(, 2)]
        da_ptr, db_ptr, dh0_ptr,  # outputs: ∂L/∂a, ∂L/∂b [M, T, S(, 2)]; ∂L/∂h0 [M, S(, 2)]
        T, S,
        IS_COMPLEX: tl.constexpr, BLOCK: tl.constexpr,
    ):
        m = tl.program_id(0)
        s = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = s < S
        if IS_COMPLEX:
            # carry = conj(a_{t+1}) λ_{t+1}, zero past the end
            cr = tl.zeros([BLOCK], dtype=hs_ptr.dtype.element_ty)
            ci = tl.zeros([BLOCK], dtype=hs_ptr.dtype.element_ty)
            for i in range(T):
                t = T - 1 - i
                off = ((m * T + t) * S + s) * 2
                lr = tl.load(g_ptr + off, mask=mask, other=0.0) + cr
                li = tl.load(g_ptr + off + 1, mask=mask, other=0.0) + ci
                tl.store(db_ptr + off, lr, mask=mask)
                tl.store(db_ptr + off + 1, li, mask=mask)
                if t > 0:
                    prev = off - S * 2
                    hr = tl.load(hs_ptr + prev, mask=mask, other=0.0)
                    hi = tl.load(hs_ptr + prev + 1, mask=mask, other=0.0)
                else:
                    hr = tl.load(h0_ptr + (m * S + s) * 2, mask=mask, other=0.0)
                    hi = tl.load(h0_ptr + (m * S + s) * 2 + 1, mask=mask, other=0.0)
                gr, gi = _cmul(lr, li, hr, -hi)  # λ_t · conj(h_{t−1})
                tl.store(da_ptr + off, gr, mask=mask)
                tl.store(da_ptr + off + 1, gi, mask=mask)
                ar = tl.load(a_ptr + off, mask=mask, other=0.0)
                ai = tl.load(a_ptr + off + 1, mask=mask, other=0.0)
                cr, ci = _cmul(ar, -ai, lr, li)  # conj(a_t) λ_t
            tl.store(dh0_ptr + (m * S + s) * 2, cr, mask=mask)
            tl.store(dh0_ptr + (m * S + s) * 2 + 1, ci, mask=mask)
        else:
            carry = tl.zeros([BLOCK], dtype=hs_ptr.dtype.element_ty)
            for i in range(T):
                t = T - 1 - i
                off = (m * T + t) * S + s
                lam = tl.load(g_ptr + off, mask=mask, other=0.0) + carry
                tl.store(db_ptr + off, lam, mask=mask)
                if t > 0:
                    h_prev = tl.load(hs_ptr + off - S, mask=mask, other=0.0)
                else:
                    h_prev = tl.load(h0_ptr + m * S + s, mask=mask, other=0.0)
                tl.store(da_ptr + off, lam * h_prev, mask=mask)
                carry = tl.load(a_ptr + off, mask=mask, other=0.0) * lam
            tl.store(dh0_ptr + m * S + s, carry, mask=mask)


def _planes(x: torch.Tensor) -> torch.Tensor:
    """Contiguous real storage the kernels index: ``x`` itself, or its (re, im) planes."""
    x = x.contiguous()
    return torch.view_as_real(x) if x.is_complex() else x


def _grid(m: int, s: int) -> tuple[int, int]:
    return (m, triton.cdiv(s, BLOCK_S))


class _TritonLinearScan(torch.autograd.Function):
    """Canonical shapes: a, b ``[M, T, S]``, h0 ``[M, S]``, one dtype, contiguous."""

    @staticmethod
    def forward(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        m, t_len, s = a.shape
        hs = torch.empty_like(b)  # [M, T, S]: every entry is written by the kernel
        _scan_fwd_kernel[_grid(m, s)](
            _planes(a), _planes(b), _planes(h0), _planes(hs), t_len, s, IS_COMPLEX=a.is_complex(), BLOCK=BLOCK_S
        )
        return hs

    @staticmethod
    def setup_context(ctx, inputs, output):
        a, _, h0 = inputs
        ctx.save_for_backward(a, h0, output)

    @staticmethod
    @first_order("linear_scan_triton")
    def backward(ctx, grad_hs: torch.Tensor):
        a, h0, hs = ctx.saved_tensors
        m, t_len, s = a.shape
        grad_a, grad_b, grad_h0 = torch.empty_like(a), torch.empty_like(a), torch.empty_like(h0)
        _scan_bwd_kernel[_grid(m, s)](
            _planes(a), _planes(h0), _planes(hs), _planes(grad_hs.to(a.dtype)),
            _planes(grad_a), _planes(grad_b), _planes(grad_h0),
            t_len, s, IS_COMPLEX=a.is_complex(), BLOCK=BLOCK_S,
        )
        return grad_a, grad_b, grad_h0

    @staticmethod
    def vmap(info, in_dims, a, b, h0):
        # [V, M, ...] -> [V·M, ...]: the vmapped dim becomes more rows
        v = info.batch_size
        a, b, h0 = (x.movedim(d, 0) if d is not None else x.expand(v, *x.shape) for x, d in zip((a, b, h0), in_dims))
        m = a.shape[1]
        hs = _TritonLinearScan.apply(*(x.flatten(0, 1).contiguous() for x in (a, b, h0)))
        return hs.unflatten(0, (v, m)), 0


def linear_scan_triton(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """h_t = a_t ⊙ h_{t−1} + b_t on the Triton kernels (same contract as ``linear_scan``).

    Args:
        a: coefficients ``[..., T, S]``, real of any sign or complex.
        b: inputs ``[..., T, S]``.
        h0: initial state ``[..., S]``.
        chunk: ignored by the kernel (one sequential pass over T per channel block);
            passed on to the torch scan, which takes over for tensors of 2³⁰ entries or
            more (the kernels index with 32-bit offsets).

    Returns:
        states ``[..., T, S]`` (all leading dims broadcast); ``[..., -1, :]`` is the final state.
    """
    if not HAS_TRITON:
        raise RuntimeError("linear_scan_triton needs the triton package (pip install 'dynlab[triton]')")
    if a.dim() < 2 or b.dim() < 2 or h0.dim() < 1:
        shapes = f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(h0.shape)}"
        raise ValueError(f"a, b need shape [..., T, S] and h0 [..., S]; got {shapes}")
    t_len = a.shape[-2]
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2], h0.shape[:-1])
    s = torch.broadcast_shapes(a.shape[-1:], b.shape[-1:], h0.shape[-1:])[0]
    dtype = common_dtype(a, b, h0)
    if dtype not in SCAN_DTYPES:
        raise ValueError(f"linear_scan_triton supports {', '.join(map(str, SCAN_DTYPES))}; got {dtype}")
    a = a.to(dtype).expand(*lead, t_len, s)
    b = b.to(dtype).expand(*lead, t_len, s)
    h0 = h0.to(dtype).expand(*lead, s)
    if t_len == 0 or b.numel() == 0:
        return b.clone()
    if 2 * b.numel() >= 2**31:  # the kernels index with 32-bit offsets
        return linear_scan(a, b, h0, chunk)
    m = b.numel() // (t_len * s)
    hs = _TritonLinearScan.apply(
        a.reshape(m, t_len, s), b.reshape(m, t_len, s), h0.reshape(m, s)  # [M, T, S], [M, S]
    )
    return hs.reshape(*lead, t_len, s)
