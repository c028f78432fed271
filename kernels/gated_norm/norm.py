"""Gated RMSNorm per member of a stack, as one op with a hand-written backward.

``gated_rms_norm(y, z, w, eps, skip, skip_weight)`` computes, per member ``e`` and row (the
last dim ``D``)::

    u = y + skip_weight[e] · skip   (u = y without a skip),
    g = u · silu(z),   out = g / sqrt(mean(g²) + eps) · w[e]

— ``nn.RMSNorm(D, eps)(u * F.silu(z))`` with member ``e``'s weight: the output norm of
Mamba-2's mixer (its skip ``D·x``) and of GLA's (no skip).  Through autograd that is about
eight passes over the activations forward and a dozen backward; the C loops
(``gated_norm.c``, built on first use by :mod:`kernels.compiled`) do one pass each way,
recomputing ``u``, ``g`` and the row's scale in the backward pass instead of storing them,
and read ``y``, ``z`` and ``skip`` in place where they are slices of a wider last dim (a
split of a linear layer's output).  Without them (no compiler, ``DYNLAB_C_KERNELS=0``,
other devices or dtypes) the op is :func:`gated_rms_norm_ref`, the autograd reference.
The C loop's float32 SiLU uses its own exp (about 1 ulp) and sums a row's squares in its
own order, so it agrees with the reference to rounding (``tests/kernels/test_gated_norm.py``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiled import as_rows, c_library_status, c_suffix, data_pointer, typed_library
from ..first_order import first_order

__all__ = ["c_library", "compiled_kernel_status", "gated_rms_norm", "gated_rms_norm_ref"]


def _check(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, skip: torch.Tensor | None,
           skip_weight: torch.Tensor | None) -> None:
    if (y.shape != z.shape or y.dim() < 2 or w.shape != (y.shape[0], y.shape[-1])
            or (skip is None) != (skip_weight is None)
            or (skip is not None and (skip.shape != y.shape or skip_weight.shape != w.shape))):
        raise ValueError(f"gated_rms_norm: need y and z [E, ..., D], w [E, D], and both or neither of skip "
                         f"[E, ..., D] and skip_weight [E, D]; got {tuple(y.shape)}, {tuple(z.shape)}, {tuple(w.shape)}, "
                         f"{None if skip is None else tuple(skip.shape)}, "
                         f"{None if skip_weight is None else tuple(skip_weight.shape)}")


def _per_member(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``[E, D]`` broadcast against ``[E, ..., D]``."""
    return v.view(v.shape[0], *([1] * (like.dim() - 2)), v.shape[1])


def gated_rms_norm_ref(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float | None,
                       skip: torch.Tensor | None = None, skip_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The reference, through autograd: y, z (and skip) ``[E, ..., D]``, w (and skip_weight)
    ``[E, D]``; eps None: the dtype's machine epsilon (``nn.RMSNorm``'s)."""
    _check(y, z, w, skip, skip_weight)
    u = y if skip is None else y + _per_member(skip_weight, y) * skip
    g = u * F.silu(z)
    return F.rms_norm(g, (g.shape[-1],), None, eps) * _per_member(w, y)


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float | None,
                   skip: torch.Tensor | None = None, skip_weight: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`gated_rms_norm_ref`'s function: the C loops for float32/float64 CPU tensors when
    they are available (module docstring), else the reference itself."""
    _check(y, z, w, skip, skip_weight)
    same = all(v is None or v.dtype == y.dtype for v in (z, w, skip, skip_weight))
    if (y.device.type == "cpu" and c_suffix(y.dtype) is not None and same and y.numel() > 0
            and c_library() is not None):  # (an empty input: the reference's empty result)
        e = torch.finfo(y.dtype).eps if eps is None else float(eps)
        return _gated_norm_c(y, z, w.contiguous(), e, skip, None if skip_weight is None else skip_weight.contiguous())
    return gated_rms_norm_ref(y, z, w, eps, skip, skip_weight)


#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "gated_norm.c").read_text(encoding="utf-8")



def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`gated_rms_norm` runs the reference)."""
    return c_library_status("gated_norm", _C_SOURCE)


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_gn_fwd_{suf}": ([_I64] * 6 + [ctypes.c_double] + [_PTR] * 6, ctypes.c_int),
    "dl_gn_bwd_{suf}": ([_I64] * 8 + [ctypes.c_double] + [_PTR] * 11, ctypes.c_int),
}


def c_library() -> ctypes.CDLL | None:
    """The gated norm's compiled library (``dl_gn_fwd_*``, ``dl_gn_bwd_*``), or None where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("gated_norm", _C_SOURCE, _SIGNATURES)


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _gated_norm_c(y, z, w, eps, skip, skip_weight):
    return _GatedNormC.apply(y, z, w, eps, skip, skip_weight)


class _GatedNormC(torch.autograd.Function):
    """The compiled loops: one pass forward, one backward (``u``, ``g`` and the row scale recomputed)."""

    @staticmethod
    def forward(ctx, y, z, w, eps, skip, skip_weight):
        e, d = w.shape
        (yr, ldy), (zr, ldz) = as_rows(y), as_rows(z)
        sr, lds = as_rows(skip) if skip is not None else (None, d)
        out = torch.empty(y.shape, dtype=y.dtype)
        fn = getattr(c_library(), f"dl_gn_fwd_{c_suffix(y.dtype)}")
        if fn(e, y.numel() // (e * d), d, ldy, ldz, lds, eps, *map(data_pointer, (yr, zr, sr, skip_weight, w, out))):
            raise MemoryError(f"gated norm: out of memory for a [{d}] buffer")
        ctx.save_for_backward(yr, zr, w, sr, skip_weight)
        ctx.eps, ctx.lds = eps, (ldy, ldz, lds)
        return out

    @staticmethod
    @first_order("gated_rms_norm")
    def backward(ctx, grad_out):
        y, z, w, s, sw = ctx.saved_tensors
        e, d = w.shape
        go = grad_out.contiguous()
        gy, gz, gw = torch.empty(go.shape, dtype=y.dtype), torch.empty(go.shape, dtype=y.dtype), torch.zeros_like(w)
        gs = None if s is None else torch.empty(go.shape, dtype=y.dtype)
        gsw = None if s is None else torch.zeros_like(sw)
        fn = getattr(c_library(), f"dl_gn_bwd_{c_suffix(y.dtype)}")
        if fn(e, go.numel() // (e * d), d, *ctx.lds, d, d, ctx.eps, *map(data_pointer, (y, z, s, sw, w, go, gy, gz, gs, gsw, gw))):
            raise MemoryError(f"gated norm backward: out of memory for a [{3 * d}] buffer")
        return gy, gz, gw, None, gs, gsw
