"""Gated RMSNorm per member of a stack, as one op with a hand-written backward.

``gated_rms_norm(y, z, w, eps)`` computes, per member ``e`` and row (the last dim ``D``)::

    g = y · silu(z),   out = g / sqrt(mean(g²) + eps) · w[e]

— ``nn.RMSNorm(D, eps)(y * F.silu(z))`` with member ``e``'s weight, the output norm of
Mamba-2's and GLA's mixers.  Through autograd that is about six passes over the activations
forward and a dozen backward; the C loops (``gated_norm.c``, built on first use by
:mod:`kernels.compiled`) do one pass each way, recomputing ``g`` and the row's scale in the
backward pass instead of storing them.  Without them (no compiler, ``DYNLAB_C_KERNELS=0``,
other devices or dtypes) the op is :func:`gated_rms_norm_ref`, the autograd reference.
The C loop's float32 SiLU uses its own exp (about 1 ulp) and sums a row's squares in its
own order, so it agrees with the reference to rounding (``tests/test_kernels_gated_norm.py``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiled import c_library, c_library_status

__all__ = ["compiled_kernel_status", "gated_rms_norm", "gated_rms_norm_ref"]


def _check(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> None:
    if y.shape != z.shape or y.dim() < 2 or w.shape != (y.shape[0], y.shape[-1]):
        raise ValueError(f"gated_rms_norm: need y and z [E, ..., D] and w [E, D]; got {tuple(y.shape)}, "
                         f"{tuple(z.shape)}, {tuple(w.shape)}")


def gated_rms_norm_ref(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float | None) -> torch.Tensor:
    """The reference, through autograd: y, z ``[E, ..., D]``, w ``[E, D]``; eps None: the dtype's
    machine epsilon (``nn.RMSNorm``'s)."""
    _check(y, z, w)
    g = y * F.silu(z)
    return F.rms_norm(g, (g.shape[-1],), None, eps) * w.view(w.shape[0], *([1] * (y.dim() - 2)), w.shape[1])


def gated_rms_norm(y: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float | None) -> torch.Tensor:
    """:func:`gated_rms_norm_ref`'s function: the C loops for float32/float64 CPU tensors when
    they are available (module docstring), else the reference itself."""
    _check(y, z, w)
    if (y.device.type == "cpu" and y.dtype in _C_SUFFIX and z.dtype == y.dtype and w.dtype == y.dtype
            and _c_library() is not None):
        e = torch.finfo(y.dtype).eps if eps is None else float(eps)
        return _GatedNormC.apply(y.contiguous(), z.contiguous(), w.contiguous(), e)
    return gated_rms_norm_ref(y, z, w, eps)


#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "gated_norm.c").read_text(encoding="utf-8")

_C_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CONFIGURED: set[int] = set()  # ids of the loaded libraries whose argtypes are set


def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`gated_rms_norm` runs the reference)."""
    return c_library_status("gated_norm", _C_SOURCE)


def _c_library() -> ctypes.CDLL | None:
    lib = c_library("gated_norm", _C_SOURCE)
    if lib is not None and id(lib) not in _CONFIGURED:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        for suf in _C_SUFFIX.values():
            fwd, bwd = getattr(lib, f"dl_gn_fwd_{suf}"), getattr(lib, f"dl_gn_bwd_{suf}")
            fwd.argtypes, fwd.restype = [i64] * 3 + [ctypes.c_double] + [ptr] * 4, ctypes.c_int
            bwd.argtypes, bwd.restype = [i64] * 3 + [ctypes.c_double] + [ptr] * 7, ctypes.c_int
        _CONFIGURED.add(id(lib))
    return lib


class _GatedNormC(torch.autograd.Function):
    """The compiled loops: one pass forward, one backward (``g`` and the row scale recomputed)."""

    @staticmethod
    def forward(ctx, y, z, w, eps):
        e, d = w.shape
        out = torch.empty_like(y)
        fn = getattr(_c_library(), f"dl_gn_fwd_{_C_SUFFIX[y.dtype]}")
        if fn(e, y.numel() // (e * d), d, eps, y.data_ptr(), z.data_ptr(), w.data_ptr(), out.data_ptr()):
            raise MemoryError(f"gated norm: out of memory for a [{d}] buffer")
        ctx.save_for_backward(y, z, w)
        ctx.eps = eps
        return out

    @staticmethod
    def backward(ctx, grad_out):
        y, z, w = ctx.saved_tensors
        e, d = w.shape
        go = grad_out.contiguous()
        gy, gz, gw = torch.empty_like(y), torch.empty_like(z), torch.zeros_like(w)
        fn = getattr(_c_library(), f"dl_gn_bwd_{_C_SUFFIX[y.dtype]}")
        if fn(e, y.numel() // (e * d), d, ctx.eps, *(t.data_ptr() for t in (y, z, w, go, gy, gz, gw))):
            raise MemoryError(f"gated norm backward: out of memory for a [{2 * d}] buffer")
        return gy, gz, gw, None
