"""Mamba-2's SSD over a whole sequence as one chunk, with B and C shared by the heads and a
zero initial state: the LM stacks' scan when the training length fits one chunk.

For each sequence ``g`` and head ``h``, with ``c_t = Σ_{s≤t} dt_s A`` (the cumulative log
decay), ``S = C Bᵀ`` (shared by the heads) and ``L_ts = exp(c_t − c_s)`` (the causal decay
mask)::

    y_t = Σ_{s≤t} L_ts S_ts dt_s x_s,      final = Σ_s exp(c_{T−1} − c_s) dt_s x_s B_sᵀ

— ``y = (L ∘ C Bᵀ) (dt x)``, what :func:`kernels.ssd.grouped.ssd_grouped` and
:func:`kernels.ssd.chunked.ssd_ref` compute when ``T`` is at most the chunk size and the
initial state is zero.  Through torch that is a handful of batched ``[T, T]`` products and
as many elementwise passes over ``[G, T, H, P]`` each way; the C loops (``ssd_chunk.c``,
built on first use by :mod:`kernels.compiled`) do one pass per sequence forward and one
backward, with the sequence's decay mask, scores and ``dt·x`` in cache (recomputed in the
backward pass, not stored), reading x, B and C in place where they are slices of a wider
last dim (the split of the convolution's output).  The decay mask is formed directly (no
factoring), the cumulative sum is taken in double as torch's CPU ``cumsum`` does, and the
float32 exp is the kernels' own (about 1 ulp), so the results agree with the references to
rounding (``tests/kernels/test_ssd_single_chunk.py``).

:func:`ssd_single_chunk_ref` is the naive reference (the mask and the scores materialised,
through autograd); :func:`ssd_single_chunk` runs the C loops where they are available and
the reference otherwise; :func:`kernels.ssd.grouped.ssd_grouped` calls the C loops where
they apply (:func:`single_chunk_applies`) and keeps its torch form everywhere else.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..compiled import as_rows, c_library_status, c_suffix, data_pointer, typed_library
from ..first_order import first_order

__all__ = ["c_library", "compiled_kernel_status", "single_chunk_applies", "ssd_single_chunk", "ssd_single_chunk_ref"]


def _check(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor) -> None:
    g, t, h, _ = x.shape
    n = B.shape[-1]
    if dt.shape != (g, t, h) or A.shape != (g, h) or B.shape != (g, t, n) or C.shape != B.shape:
        raise ValueError(f"ssd_single_chunk: need x [G, T, H, P], dt [G, T, H], A [G, H], B and C [G, T, N]; got "
                         f"{tuple(x.shape)}, {tuple(dt.shape)}, {tuple(A.shape)}, {tuple(B.shape)}, {tuple(C.shape)}")


def ssd_single_chunk_ref(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                         C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The naive reference through autograd: x ``[G, T, H, P]``, dt ``[G, T, H]``, A ``[G, H]``,
    B and C ``[G, T, N]`` -> ``(y [G, T, H, P], final state [G, H, P, N])`` (module docstring),
    with the ``[G, T, T, H]`` decay mask and the ``[G, T, T]`` scores formed."""
    _check(x, dt, A, B, C)
    t = x.shape[1]
    c = torch.cumsum(dt * A[:, None, :], dim=1)  # [G, T, H]
    causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[None, :, :, None]
    seg = c[:, :, None, :] - c[:, None, :, :]  # [G, T(t), T(s), H]
    decay = torch.exp(torch.where(causal, seg, torch.full_like(seg, float("-inf"))))
    scores = torch.einsum("gtn,gsn->gts", C, B)
    u = dt[..., None] * x  # [G, T, H, P]
    y = torch.einsum("gtsh,gts,gshp->gthp", decay, scores, u)
    final = torch.einsum("gsh,gshp,gsn->ghpn", torch.exp(c[:, -1:] - c), u, B)
    return y, final


def single_chunk_applies(x: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether :func:`ssd_single_chunk` runs the C loops for these tensors: CPU, float32 or
    float64, one dtype, at least one step, and the library available."""
    return (x.device.type == "cpu" and c_suffix(x.dtype) is not None and x.shape[1] > 0
            and all(o.dtype == x.dtype and o.device.type == "cpu" for o in others) and c_library() is not None)


def ssd_single_chunk(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                     C: torch.Tensor, need_final: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`ssd_single_chunk_ref`'s function: the C loops where :func:`single_chunk_applies`,
    else the reference itself.  With ``need_final=False`` the C loops skip the final state
    (most of a forward pass's products when the state is wider than the chunk is long) and
    return None for it; y is the same, bit for bit."""
    _check(x, dt, A, B, C)
    if single_chunk_applies(x, dt, A, B, C):
        return _ssd_single_chunk_c(x, dt, A, B, C, need_final)
    return ssd_single_chunk_ref(x, dt, A, B, C)


#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "ssd_chunk.c").read_text(encoding="utf-8")



def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`ssd_single_chunk` runs the reference)."""
    return c_library_status("ssd_chunk", _C_SOURCE)


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_ssd1_fwd_{suf}": ([_I64] * 8 + [_PTR] * 7, ctypes.c_int),
    "dl_ssd1_bwd_{suf}": ([_I64] * 12 + [_PTR] * 13, ctypes.c_int),
}


def c_library() -> ctypes.CDLL | None:
    """The single-chunk SSD's compiled library (``dl_ssd1_fwd_*``, ``dl_ssd1_bwd_*``), or None where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("ssd_chunk", _C_SOURCE, _SIGNATURES)


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _ssd_single_chunk_c(x, dt, A, B, C, need_final=True):
    return _SSDSingleChunkC.apply(x, dt, A, B, C, need_final)


class _SSDSingleChunkC(torch.autograd.Function):
    """The compiled loops: one pass per sequence forward, one backward (decay mask, scores
    and ``dt·x`` recomputed; the output y kept for the mask's gradient)."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, need_final):
        g, t, h, p = x.shape
        n = B.shape[-1]
        (xr, ldx), (br, ldb), (cr, ldc) = as_rows(x.reshape(g, t, h * p)), as_rows(B), as_rows(C)
        dt, A = dt.contiguous(), A.contiguous()
        y = torch.empty(g, t, h, p, dtype=x.dtype)
        final = torch.empty(g, h, p, n, dtype=x.dtype) if need_final else None
        fn = getattr(c_library(), f"dl_ssd1_fwd_{c_suffix(x.dtype)}")
        if fn(g, t, h, p, n, ldx, ldb, ldc, *map(data_pointer, (xr, dt, A, br, cr, y, final))):
            raise MemoryError(f"single-chunk SSD: out of memory for [{t}, {t}] buffers")
        ctx.save_for_backward(xr, dt, A, br, cr, y)
        ctx.set_materialize_grads(False)  # an unused final state: a null gradient, its terms skipped
        ctx.sizes = (g, t, h, p, n, ldx, ldb, ldc)
        return y, final

    @staticmethod
    @first_order("ssd_single_chunk")
    def backward(ctx, grad_y, grad_final):
        x, dt, A, B, C, y = ctx.saved_tensors
        g, t, h, p, n, ldx, ldb, ldc = ctx.sizes
        gy = torch.zeros(g, t, h, p, dtype=x.dtype) if grad_y is None else grad_y.contiguous()
        gf = None if grad_final is None else grad_final.contiguous()
        gx, gdt, gA = torch.empty(g, t, h, p, dtype=x.dtype), torch.empty_like(dt), torch.empty_like(A)
        gB, gC = torch.empty(g, t, n, dtype=x.dtype), torch.empty(g, t, n, dtype=x.dtype)
        fn = getattr(c_library(), f"dl_ssd1_bwd_{c_suffix(x.dtype)}")
        if fn(g, t, h, p, n, ldx, ldb, ldc, h * p, n, n, 0, *map(data_pointer, (x, dt, A, B, C, y, gy, gf, gx, gdt, gA, gB, gC))):
            raise MemoryError(f"single-chunk SSD backward: out of memory for [{t}, {t}] buffers")
        return gx, gdt, gA, gB, gC, None
