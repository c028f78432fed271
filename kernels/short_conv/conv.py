"""Causal depthwise convolution over time followed by SiLU, per member of a stack, as one
op with a hand-written backward.

``causal_conv_silu(x, w, bias, past)`` computes, for every leading index (member ``e``,
sequence ``b``), step ``t`` and channel ``c``::

    a_t = Σ_j in(t − K + 1 + j) · w[e, j]  (+ bias[e]),   out_t = silu(a_t)

with ``in(s) = x[s]`` for ``s ≥ 0`` and ``past[K − 1 + s]`` (the carried window, zeros when
None) before the chunk.  It is :func:`dynlab.lm.models.mixers.causal_conv` per member.

Written with autograd, the K shifted products cost a step far more than their arithmetic on
a CPU: every slice of the padded input turns, in the backward pass, into a zero-filled
tensor and a copy; every product with a broadcast tap is its own pass over the activations,
and the SiLU and its backward two more.  This op does the forward in one pass and the
backward in one more (the pre-activations are recomputed there, not stored):

- the C loops (``short_conv.c``, built on first use by :mod:`kernels.compiled`) for float32
  and float64 CPU tensors;
- otherwise (no compiler, ``DYNLAB_C_KERNELS=0``, other devices or dtypes) the same backward
  in torch: a few in-place multiply-adds over the whole tensor, no slices' zeros.

:func:`causal_conv_silu_ref` is the autograd reference (the shifted products as the stack
wrote them before).  Both paths sum the taps in the reference's order with each product
rounded, so the convolution itself matches it exactly; the C loop's float32 SiLU uses its
own exp (about 1 ulp), so outputs and gradients agree to rounding
(``tests/kernels/test_short_conv.py``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiled import as_rows, c_library_status, c_suffix, data_pointer, typed_library
from ..first_order import first_order

__all__ = ["c_library", "causal_conv_silu", "causal_conv_silu_ref", "compiled_kernel_status", "last_window"]


def _check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, past: torch.Tensor | None) -> None:
    e, b, t, c = x.shape
    k = w.shape[1]
    if (k < 1 or w.shape != (e, k, c) or (bias is not None and bias.shape != (e, c))
            or (past is not None and past.shape != (e, b, k - 1, c))):
        raise ValueError(f"causal_conv_silu: need x [E, B, T, C], w [E, K ≥ 1, C], bias [E, C] or None, past "
                         f"[E, B, K - 1, C] or None; got {tuple(x.shape)}, {tuple(w.shape)}, "
                         f"{None if bias is None else tuple(bias.shape)}, {None if past is None else tuple(past.shape)}")


def causal_conv_silu_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                         past: torch.Tensor | None) -> torch.Tensor:
    """The reference, through autograd: x ``[E, B, T, C]``, taps w ``[E, K, C]`` (tap ``K − 1``
    multiplies the current input), bias ``[E, C]`` or None, past ``[E, B, K − 1, C]`` or None
    (zeros) -> ``silu(conv) [E, B, T, C]``."""
    _check(x, w, bias, past)
    e, b, t, c = x.shape
    k = w.shape[1]
    full = torch.cat([x.new_zeros(e, b, k - 1, c) if past is None else past, x], dim=2)  # [E, B, K - 1 + T, C]
    taps = w[:, :, None, None, :]  # [E, K, 1, 1, C]
    y = full[:, :, 0:t] * taps[:, 0]
    for j in range(1, k):
        y = y + full[:, :, j:j + t] * taps[:, j]
    if bias is not None:
        y = y + bias[:, None, None, :]
    return F.silu(y)


def last_window(x: torch.Tensor, past: torch.Tensor | None, k: int) -> torch.Tensor:
    """The last ``K − 1`` inputs seen (the window for the next chunk): x ``[E, B, T, C]``, past
    ``[E, B, K − 1, C]`` or None (zeros) -> ``[E, B, K − 1, C]``."""
    t = x.shape[2]
    if t >= k - 1:
        return x[:, :, t - (k - 1):]
    e, b, _, c = x.shape
    before = x.new_zeros(e, b, k - 1, c) if past is None else past.to(x.dtype)
    return torch.cat([before[:, :, t:], x], dim=2)


def causal_conv_silu(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                     past: torch.Tensor | None) -> torch.Tensor:
    """:func:`causal_conv_silu_ref`'s function with a hand-written backward (module
    docstring): the C loops for float32/float64 CPU tensors when they are available, else the
    torch form.  The inputs are cast to x's dtype."""
    _check(x, w, bias, past)
    w = w.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    past = None if past is None else past.to(x.dtype)
    if x.device.type == "cpu" and c_suffix(x.dtype) is not None and c_library() is not None:
        return _conv_silu_c(x, w.contiguous(), bias if bias is None else bias.contiguous(),
                            past if past is None else past.contiguous())
    return _ConvSiluTorch.apply(x, w, bias, past)


class _ConvSiluTorch(torch.autograd.Function):
    """The torch form: forward as the reference (the pre-activations kept), backward as K
    in-place multiply-adds into one padded gradient and K product-sums for the taps."""

    @staticmethod
    def forward(ctx, x, w, bias, past):
        e, b, t, c = x.shape
        k = w.shape[1]
        full = torch.cat([x.new_zeros(e, b, k - 1, c) if past is None else past, x], dim=2)
        taps = w[:, :, None, None, :]
        a = full[:, :, 0:t] * taps[:, 0]
        for j in range(1, k):
            a.add_(full[:, :, j:j + t] * taps[:, j])
        if bias is not None:
            a.add_(bias[:, None, None, :])
        ctx.save_for_backward(full, w, a)
        ctx.has_bias, ctx.has_past = bias is not None, past is not None
        return F.silu(a)

    @staticmethod
    @first_order("causal_conv_silu")
    def backward(ctx, grad_out):
        full, w, a = ctx.saved_tensors
        t = a.shape[2]
        k = w.shape[1]
        g = torch.ops.aten.silu_backward(grad_out, a)  # dL/da
        gfull = torch.zeros_like(full)
        gw = torch.empty_like(w)
        for j in range(k):
            gfull[:, :, j:j + t].addcmul_(g, w[:, j, None, None, :])
            gw[:, j] = (full[:, :, j:j + t] * g).sum(dim=(1, 2))
        gb = g.sum(dim=(1, 2)) if ctx.has_bias else None
        gpast = gfull[:, :, :k - 1] if ctx.has_past and ctx.needs_input_grad[3] else None
        return gfull[:, :, k - 1:], gw, gb, gpast


# --------------------------------------------------------------------------------------
# Compiled CPU kernel
# --------------------------------------------------------------------------------------

#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "short_conv.c").read_text(encoding="utf-8")



def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`causal_conv_silu` runs the torch form)."""
    return c_library_status("short_conv", _C_SOURCE)


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_sc_fwd_{suf}": ([_I64] * 6 + [_PTR] * 5, ctypes.c_int),
    "dl_sc_bwd_{suf}": ([_I64] * 7 + [_PTR] * 9, ctypes.c_int),
}


def c_library() -> ctypes.CDLL | None:
    """The short convolution's compiled library (``dl_sc_fwd_*``, ``dl_sc_bwd_*``), or None where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("short_conv", _C_SOURCE, _SIGNATURES)


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _conv_silu_c(x, w, bias, past):
    return _ConvSiluC.apply(x, w, bias, past)


class _ConvSiluC(torch.autograd.Function):
    """The compiled loops: one pass forward; one pass backward per sequence (pre-activations
    recomputed into a ``[T, C]`` scratch row, then the input and tap gradients)."""

    @staticmethod
    def forward(ctx, x, w, bias, past):
        e, b, t, c = x.shape
        k = w.shape[1]
        xr, ld = as_rows(x)  # a slice of a linear layer's output is read in place
        out = torch.empty(e, b, t, c, dtype=x.dtype)
        if getattr(c_library(), f"dl_sc_fwd_{c_suffix(x.dtype)}")(e, b, t, c, k, ld, *map(data_pointer, (xr, past, w, bias, out))):
            raise MemoryError(f"short conv: out of memory for a [{c}] zero row")
        ctx.save_for_backward(xr, w, bias, past)
        ctx.ld = ld
        return out

    @staticmethod
    @first_order("causal_conv_silu")
    def backward(ctx, grad_out):
        x, w, bias, past = ctx.saved_tensors
        e, b, t, c = x.shape
        k = w.shape[1]
        gx = torch.empty(e, b, t, c, dtype=x.dtype)
        gw = torch.zeros_like(w)
        gb = None if bias is None else torch.zeros_like(bias)
        gpast = torch.empty_like(past) if past is not None and ctx.needs_input_grad[3] else None
        fn = getattr(c_library(), f"dl_sc_bwd_{c_suffix(x.dtype)}")
        if fn(e, b, t, c, k, ctx.ld, c, *map(data_pointer, (x, past, w, bias, grad_out.contiguous(), gx, gpast, gw, gb))):
            raise MemoryError(f"short conv backward: out of memory for a [{t}, {c}] buffer")
        return gx, gw, gb, gpast
