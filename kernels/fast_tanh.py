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
magnitude by ``tests/test_fast_tanh.py``, which holds it to 2 ulp.  Elementwise, so a stack of members and each member alone get the same
bits.  float64 tensors, other devices, other layouts than contiguous blocks, no C compiler or
``DYNLAB_C_KERNELS=0``: ``Tensor.tanh_``.

One thread: the loop is not split over threads; one thread of it was faster than torch's
``tanh_`` on two, and splitting it over two Python threads was slower (torch's OpenMP
workers spin on the second core after each parallel region; ``docs/performance.md``).
"""

from __future__ import annotations

import ctypes

import torch

from .compiled import c_library

__all__ = ["tanh_"]

_C_SOURCE = r'''
#include <math.h>
#include <stdint.h>

static void tanh_run(int64_t n, float* x) {
    _Pragma("omp simd")
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = fabsf(v);
        float tc = t < 9.0f ? t : 9.0f;
        /* e = exp(-2 tc) = 2^k exp(r), k = round(-2 tc / ln 2), r = -2 tc - k ln 2 */
        float y = -2.0f * tc;
        float kf = rintf(y * 1.44269504088896341f);
        float r = y - kf * 0.693145751953125f;  /* ln 2, high part: exact in k * hi */
        r = r - kf * 1.428606765330187045e-06f;  /* ln 2, low part */
        float p = 1.0f / 5040.0f;
        p = p * r + 1.0f / 720.0f;
        p = p * r + 1.0f / 120.0f;
        p = p * r + 1.0f / 24.0f;
        p = p * r + 1.0f / 6.0f;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        union { int32_t i; float f; } two_k;
        two_k.i = ((int32_t)kf + 127) << 23;  /* k in [-26, 0]: a normal float */
        float e = p * two_k.f;
        float far = (1.0f - e) / (1.0f + e);
        /* tanh t = t (1 - t^2/3 + 2t^4/15 - ...): the Taylor series to t^19, 2^2n (2^2n - 1) B_2n / (2n)! */
        float t2 = t * t;
        float q = -443861162.0f / 1856156927625.0f;
        q = q * t2 + 6404582.0f / 10854718875.0f;
        q = q * t2 - 929569.0f / 638512875.0f;
        q = q * t2 + 21844.0f / 6081075.0f;
        q = q * t2 - 1382.0f / 155925.0f;
        q = q * t2 + 62.0f / 2835.0f;
        q = q * t2 - 17.0f / 315.0f;
        q = q * t2 + 2.0f / 15.0f;
        q = q * t2 - 1.0f / 3.0f;
        q = q * t2 + 1.0f;
        float res = t < 0.55f ? t * q : far;
        res = t == t ? res : v;  /* NaN in, NaN out */
        x[i] = copysignf(res, v);  /* odd, -0 included */
    }
}

/* blocks of n contiguous floats, stride apart (a step's slice [N, B, S] of a [N, T, B, S] buffer) */
void dl_tanh_f32(int64_t blocks, int64_t n, int64_t stride, float* x) {
    for (int64_t j = 0; j < blocks; j++) tanh_run(n, x + j * stride);
}
'''


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
