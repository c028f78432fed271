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
otherwise.  On CUDA the backends are :func:`kernels.triton_gla.selective_scan_triton` (a
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

import torch

from .compiled import C_KERNELS_ENV, c_library, c_library_status

__all__ = [
    "selective_scan_ref",
    "selective_scan_fused",
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
    check_selective_scan_inputs(u, delta, A, B, C)
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
    check_selective_scan_inputs(u, delta, A, B, C)
    b, t, d = u.shape
    n = A.shape[1]
    h0 = u.new_zeros(b, d, n) if initial_state is None else initial_state  # [B, D, N]
    if t == 0:
        y = u.new_zeros(b, 0, d)
        return (y, h0) if return_final_state else y
    dtype = torch.promote_types(u.dtype, A.dtype)
    args = [x.to(dtype) for x in (u, delta, A, B, C, h0)]
    if u.device.type == "cpu" and dtype in _C_SUFFIX and _c_library() is not None:
        # keep the decays for the backward pass when one will run and they are not too large
        save = (torch.is_grad_enabled() and any(x.requires_grad for x in args)
                and b * t * d * n * args[0].element_size() <= SAVE_DECAYS_MAX_BYTES)
        y, final, _ = _SelectiveScanC.apply(*(x.contiguous() for x in args), save)  # y [B, T, D], final [B, D, N]
    else:
        y, final, *_ = _SelectiveScan.apply(*args)  # y [B, T, D], final [B, D, N]
    return (y, final) if return_final_state else y


# --------------------------------------------------------------------------------------
# Compiled CPU kernel
# --------------------------------------------------------------------------------------

#: Largest decay buffer ``[B, D, T, N]`` (bytes) the C kernel keeps from the forward for the
#: backward pass; larger scans recompute the decays there (the same numbers; about 15 % more
#: time for the scan, measured at the LM study's quick sizes, whose buffer is 16 MiB a layer).
SAVE_DECAYS_MAX_BYTES = 64 * 2**20

_C_SOURCE = r"""
/* dynlab selective scan, CPU.  Layouts (all contiguous): u, delta, y [B, T, D]; A [D, N];
   B, C [B, T, N]; h0, final state [B, D, N].  Forward:
       h_t[d, :] = exp(delta_t[d] A[d, :]) * h_{t-1}[d, :] + delta_t[d] u_t[d] B_t[:],
       y_t[d] = sum_n C_t[n] h_t[d, n].
   Backward: the adjoint lam_t = dL/dh_t runs back through time,
       lam_t = decay_{t+1} * lam_{t+1} + gy_t[d] C_t,
   with gz = lam_t * decay_t * h_{t-1} = dL/d(delta_t A) per entry.  dsave [B, D, T, N]: the
   forward pass stores the decays there and the backward pass reads them; when null, the
   backward pass recomputes them (the exps are most of the kernel's time).  A null gy or
   gfinal pointer means a zero gradient.  Both return 0, or 1 when a buffer cannot be
   allocated. */
/* fuse a*b + c into one FMA (one rounding instead of two; ISO C mode forbids it by default):
   about 11 % less time for the scan */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* exp for float32 that the compiler can vectorise: x = k ln2 + r with |r| <= ln2/2 (ln2 split
   in a 9-bit head and a tail, so k ln2 is exact), e^r by a degree-6 polynomial (coefficients
   fitted for this kernel: least squares on 4000 Chebyshev nodes of [-ln2/2, ln2/2], reweighted
   towards the minimax relative error, 1.9e-9 = 0.03 ulp in exact arithmetic; at most 1.02
   ulp measured as evaluated in float32 with FMAs over [-87.3, 88.7]), then 2^k applied in two halves (k reaches 128 just below the
   overflow threshold).  0 below ln(FLT_MIN) = -87.34: no denormal results, which x86 cores
   multiply far more slowly (and which hold no precision anyway); inf above 88.72. */
static inline float dl_expf(float x) {
    float xc = x < -87.33654475f ? -87.33654475f : x;
    xc = xc > 88.72283935546875f ? 88.72283935546875f : xc;
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = xc - k * 0.693359375f;
    r = r + k * 2.12194440054690583e-4f;
    float p = 1.383684561759668e-3f;
    p = p * r + 8.374815802238297e-3f;
    p = p * r + 4.166822557617618e-2f;
    p = p * r + 1.666642016988013e-1f;
    p = p * r + 4.999999207978722e-1f;
    p = p * r + 1.0000000363231898f;
    p = p * r + 1.0000000005541678f;
    int32_t ki = (int32_t)k;
    int32_t k1 = ki >> 1, k2 = ki - (ki >> 1);
    union { int32_t i; float f; } s1, s2;
    s1.i = (k1 + 127) << 23;
    s2.i = (k2 + 127) << 23;
    float e = p * s1.f * s2.f;
    e = x < -87.33654475f ? 0.0f : e;
    return x > 88.72283935546875f ? INFINITY : e;
}

static inline double dl_exp(double x) { return exp(x); }

#define SCAN_KERNELS(T, SUF, EXP)                                                                  \
int dl_ss_fwd_##SUF(int64_t nb, int64_t nt, int64_t nd, int64_t nn, const T *u, const T *delta,    \
                    const T *A, const T *B, const T *C, const T *h0, T *y, T *hT, T *dsave) {      \
    T *h = (T *)malloc(sizeof(T) * (size_t)nn);                                                    \
    if (!h) return 1;                                                                              \
    for (int64_t b = 0; b < nb; b++)                                                               \
        for (int64_t d = 0; d < nd; d++) {                                                         \
            const T *a = A + d * nn;                                                               \
            memcpy(h, h0 + (b * nd + d) * nn, sizeof(T) * (size_t)nn);                             \
            for (int64_t t = 0; t < nt; t++) {                                                     \
                int64_t i = (b * nt + t) * nd + d;                                                 \
                const T *Bt = B + (b * nt + t) * nn, *Ct = C + (b * nt + t) * nn;                  \
                T dl = delta[i], du = dl * u[i], acc = 0;                                          \
                if (dsave) {                                                                       \
                    T *ds = dsave + ((b * nd + d) * nt + t) * nn;                                  \
                    _Pragma("omp simd reduction(+:acc)")                                           \
                    for (int64_t n = 0; n < nn; n++) {                                             \
                        T e = EXP(dl * a[n]);                                                      \
                        T hn = e * h[n] + du * Bt[n];                                              \
                        ds[n] = e;                                                                 \
                        h[n] = hn;                                                                 \
                        acc += hn * Ct[n];                                                         \
                    }                                                                              \
                } else {                                                                           \
                    _Pragma("omp simd reduction(+:acc)")                                           \
                    for (int64_t n = 0; n < nn; n++) {                                             \
                        T hn = EXP(dl * a[n]) * h[n] + du * Bt[n];                                 \
                        h[n] = hn;                                                                 \
                        acc += hn * Ct[n];                                                         \
                    }                                                                              \
                }                                                                                  \
                y[i] = acc;                                                                        \
            }                                                                                      \
            memcpy(hT + (b * nd + d) * nn, h, sizeof(T) * (size_t)nn);                             \
        }                                                                                          \
    free(h);                                                                                       \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_ss_bwd_##SUF(int64_t nb, int64_t nt, int64_t nd, int64_t nn, const T *u, const T *delta,    \
                    const T *A, const T *B, const T *C, const T *h0, const T *dsave, const T *gy,  \
                    const T *gfinal, T *gu, T *gdelta, T *gA, T *gB, T *gC, T *gh0) {              \
    T *hs = (T *)malloc(sizeof(T) * (size_t)((nt + 1) * nn));                                      \
    T *decs = dsave ? NULL : (T *)malloc(sizeof(T) * (size_t)(nt * nn + 1));                       \
    T *lam = (T *)malloc(sizeof(T) * (size_t)nn);                                                  \
    if (!hs || (!dsave && !decs) || !lam) { free(hs); free(decs); free(lam); return 1; }           \
    for (int64_t b = 0; b < nb; b++)                                                               \
        for (int64_t d = 0; d < nd; d++) {                                                         \
            const T *a = A + d * nn;                                                               \
            T *ga = gA + d * nn;                                                                   \
            const T *row = dsave ? dsave + (b * nd + d) * nt * nn : decs; /* decays of the row, [T, N] */\
            memcpy(hs, h0 + (b * nd + d) * nn, sizeof(T) * (size_t)nn);                            \
            for (int64_t t = 0; t < nt; t++) {                                                     \
                int64_t i = (b * nt + t) * nd + d;                                                 \
                const T *Bt = B + (b * nt + t) * nn;                                               \
                const T *hp = hs + t * nn;                                                         \
                T *hn = hs + (t + 1) * nn;                                                         \
                T dl = delta[i], du = dl * u[i];                                                   \
                if (dsave) {                                                                       \
                    const T *dc = row + t * nn;                                                    \
                    _Pragma("omp simd")                                                            \
                    for (int64_t n = 0; n < nn; n++) hn[n] = dc[n] * hp[n] + du * Bt[n];           \
                } else {                                                                           \
                    T *dc = decs + t * nn;                                                         \
                    _Pragma("omp simd")                                                            \
                    for (int64_t n = 0; n < nn; n++) {                                             \
                        T e = EXP(dl * a[n]);                                                      \
                        dc[n] = e;                                                                 \
                        hn[n] = e * hp[n] + du * Bt[n];                                            \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            if (gfinal) memcpy(lam, gfinal + (b * nd + d) * nn, sizeof(T) * (size_t)nn);           \
            else memset(lam, 0, sizeof(T) * (size_t)nn);                                           \
            for (int64_t t = nt - 1; t >= 0; t--) {                                                \
                int64_t i = (b * nt + t) * nd + d;                                                 \
                const T *Bt = B + (b * nt + t) * nn, *Ct = C + (b * nt + t) * nn;                  \
                T *gBt = gB + (b * nt + t) * nn, *gCt = gC + (b * nt + t) * nn;                    \
                const T *hp = hs + t * nn, *hc = hs + (t + 1) * nn, *dc = row + t * nn;            \
                T dl = delta[i], du = dl * u[i], g = gy ? gy[i] : (T)0, gdu = 0, gz = 0;           \
                _Pragma("omp simd reduction(+:gdu,gz)")                                            \
                for (int64_t n = 0; n < nn; n++) {                                                 \
                    T l = lam[n] + g * Ct[n];                                                      \
                    gCt[n] += g * hc[n];                                                           \
                    gdu += l * Bt[n];                                                              \
                    gBt[n] += du * l;                                                              \
                    T w = l * dc[n];                                                               \
                    T gw = w * hp[n];                                                              \
                    gz += gw * a[n];                                                               \
                    ga[n] += gw * dl;                                                              \
                    lam[n] = w;                                                                    \
                }                                                                                  \
                gu[i] = gdu * dl;                                                                  \
                gdelta[i] = gz + gdu * u[i];                                                       \
            }                                                                                      \
            memcpy(gh0 + (b * nd + d) * nn, lam, sizeof(T) * (size_t)nn);                          \
        }                                                                                          \
    free(hs); free(decs); free(lam);                                                               \
    return 0;                                                                                      \
}

SCAN_KERNELS(float, f32, dl_expf)
SCAN_KERNELS(double, f64, dl_exp)
"""

_C_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CONFIGURED: set[int] = set()  # ids of the loaded libraries whose argtypes are set


def compiled_kernel_status() -> str:
    """``"compiled: <path of the shared library>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or
    ``"unavailable: <reason>"`` (then :func:`selective_scan_fused` runs the torch loop).
    Builds the kernel on first call (:mod:`kernels.compiled`; under a second with gcc)."""
    return c_library_status("selective_scan", _C_SOURCE)


def _c_library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None when turned off or it cannot be built."""
    lib = c_library("selective_scan", _C_SOURCE)
    if lib is not None and id(lib) not in _CONFIGURED:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        for suf in _C_SUFFIX.values():
            fwd, bwd = getattr(lib, f"dl_ss_fwd_{suf}"), getattr(lib, f"dl_ss_bwd_{suf}")
            fwd.argtypes, fwd.restype = [i64] * 4 + [ptr] * 9, ctypes.c_int
            bwd.argtypes, bwd.restype = [i64] * 4 + [ptr] * 15, ctypes.c_int
        _CONFIGURED.add(id(lib))
    return lib


def _ptr(x: torch.Tensor | None) -> int | None:
    return None if x is None else x.data_ptr()


class _SelectiveScanC(torch.autograd.Function):
    """The compiled kernel.  Forward: per (batch, channel), the ``[N]`` state stepped through
    time; with ``save_decays`` the decays go to a ``[B, D, T, N]`` buffer kept for the
    backward pass.  Backward: per (batch, channel), the row's states are recomputed into a
    ``[T + 1, N]`` scratch buffer (and its decays, when not kept), then the adjoint is
    stepped back through time."""

    @staticmethod
    def forward(u, delta, A, B, C, h0, save_decays):
        b, t, d = u.shape
        n = A.shape[1]
        y = torch.empty(b, t, d, dtype=u.dtype)  # [B, T, D]
        final = torch.empty(b, d, n, dtype=u.dtype)  # [B, D, N]
        decays = torch.empty((b, d, t, n) if save_decays else (0,), dtype=u.dtype)  # [B, D, T, N]
        fn = getattr(_c_library(), f"dl_ss_fwd_{_C_SUFFIX[u.dtype]}")
        if fn(b, t, d, n, *map(_ptr, (u, delta, A, B, C, h0, y, final, decays if save_decays else None))):
            raise MemoryError("selective scan: out of memory for an [N] buffer")
        return y, final, decays

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[2])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs[:6], output[2])

    @staticmethod
    def backward(ctx, grad_y, grad_final, _grad_decays):
        u, delta, A, B, C, h0, decays = ctx.saved_tensors
        if grad_y is None and grad_final is None:
            return None, None, None, None, None, None, None
        b, t, d = u.shape
        n = A.shape[1]
        gy = None if grad_y is None else grad_y.contiguous()
        gf = None if grad_final is None else grad_final.contiguous()
        grad_u, grad_delta = torch.empty(b, t, d, dtype=u.dtype), torch.empty(b, t, d, dtype=u.dtype)
        grad_A = torch.zeros(d, n, dtype=u.dtype)  # accumulated over batch and time
        grad_B, grad_C = torch.zeros(b, t, n, dtype=u.dtype), torch.zeros(b, t, n, dtype=u.dtype)  # over channels
        grad_h0 = torch.empty(b, d, n, dtype=u.dtype)
        saved = decays if decays.numel() else None
        fn = getattr(_c_library(), f"dl_ss_bwd_{_C_SUFFIX[u.dtype]}")
        if fn(b, t, d, n, *map(_ptr, (u, delta, A, B, C, h0, saved, gy, gf, grad_u, grad_delta, grad_A, grad_B,
                                      grad_C, grad_h0))):
            raise MemoryError(f"selective scan backward: out of memory for a [{t + 1}, {n}] buffer")
        return grad_u, grad_delta, grad_A, grad_B, grad_C, grad_h0, None
