"""In-place tanh for the dense tracker kernels' float32 states, faster than ``Tensor.tanh_`` on the CPU.

The dense kernels (:mod:`.dense_tracker`, :mod:`.gated_tracker`) apply tanh to every state
of every step in place, a noticeable share of an ensemble's training step with torch's
float32 ``tanh_`` (``docs/performance.md`` has the timings).  :func:`tanh_` computes the same function in one vectorised C
loop (:data:`_C_SOURCE`, built by :mod:`.compiled`):

- |x| < 0.55: the odd Taylor polynomial of tanh to degree 19 (truncation below 1e-9);
- otherwise (1 − e)/(1 + e) with e = exp(−2|x|) (|x| clamped at 9, where tanh is 1 in
  float32), exp by range reduction to |r| ≤ ln 2 / 2 (ln 2 split in two for exactness), its
  degree-7 Taylor polynomial and a power of two built from the exponent bits;
- the sign of x restored; NaN stays NaN.

Its largest error against float64 tanh is 1.5 float32 ulp (1.5e-7 relative; torch's own
is 0.5 ulp), measured on 2 M points in [−12, 12], 10 k in [1e-8, 0.3] and every float32
magnitude by ``tests/kernels/test_fast_tanh.py``, which holds it to 2 ulp.  Elementwise, so a stack of members and each member alone get the same
bits.  float64 tensors, other devices, other layouts than contiguous blocks, no C compiler or
``DYNLAB_C_KERNELS=0``: ``Tensor.tanh_``.

One thread: the loop is not split over threads; one thread of it was faster than torch's
``tanh_`` on two, and splitting it over two Python threads was slower (torch's OpenMP
workers spin on the second core after each parallel region; ``docs/performance.md``).
"""

from __future__ import annotations

import ctypes

from pathlib import Path

import torch

from .compiled import c_library

__all__ = ["tanh_"]

#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "fast_tanh.c").read_text(encoding="utf-8")


def _lib() -> ctypes.CDLL | None:
    lib = c_library("fast_tanh", _C_SOURCE)
    if lib is not None and not hasattr(lib, "_dynlab_ready"):
        lib.dl_tanh_f32.argtypes, lib.dl_tanh_f32.restype = [ctypes.c_int64] * 3 + [ctypes.c_void_p], None
        lib._dynlab_ready = True
    return lib


def _blocks(x: torch.Tensor) -> tuple[int, int, int] | None:
    """``(blocks, n, stride)`` when ``x`` is blocks of n contiguous elements along its first
    dimension (contiguous, or one step's slice of a time-major buffer), else None."""
    if x.is_contiguous():
        return 1, x.numel(), 0
    inner = x[0] if x.dim() > 1 else None
    if inner is None or not inner.is_contiguous() or x.stride(0) < inner.numel():
        return None
    return x.shape[0], inner.numel(), x.stride(0)


def tanh_(x: torch.Tensor) -> torch.Tensor:
    """``x.tanh_()``: in place, returns ``x`` (module docstring for when the C loop runs)."""
    plan = _blocks(x) if x.dtype == torch.float32 and x.device.type == "cpu" else None
    lib = _lib() if plan is not None else None
    if lib is None:
        return x.tanh_()
    lib.dl_tanh_f32(*plan, x.data_ptr())
    return x
