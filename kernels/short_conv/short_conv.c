/* dynlab short causal depthwise convolution + SiLU, CPU (the LM stacks' Mamba/GLA short conv).
   Layouts: x [E, B, T, C] with row stride ldx (the step of t; channels contiguous, rows
   evenly spaced: a slice of a wider last dim); gx [E, B, T, C] with row stride ldg (the backward
   may write it into a slice of a wider gradient); all others contiguous: out, gout [E, B, T, C]; past, gpast [E, B, K - 1, C] (null:
   zeros / not wanted); w, gw [E, K, C] (tap K - 1 multiplies the current input); bias, gb [E, C]
   (null: none).  Forward, per member e, sequence b, step t, channel c, with in(s) = x[s] for
   s >= 0 and past[K - 1 + s] for s < 0:
       a_t = ((in(t - K + 1) w_0 + in(t - K + 2) w_1) + ...) + bias,   out_t = a_t sigmoid(a_t).
   The taps are summed in that order, each product rounded (no FMA contraction), as the
   torch form does.  Backward: the pre-activations are recomputed, g_t = gout_t silu'(a_t),
       gx[s] = sum_j w_j g[s + K - 1 - j] (over the steps inside [0, T)),
       gw_j += in(t - K + 1 + j) g_t, gb += g_t (accumulated over b and t; gw and gb must be zeroed).
   Both return 0, or 1 when a [T, C] buffer cannot be allocated. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

/* the pre-activations a [T, C] of one sequence: x [T, C], past [K - 1, C] or null */
#define CONV_PRE(T, SUF)                                                                           \
static void dl_sc_pre_##SUF(int64_t nt, int64_t nc, int64_t nk, int64_t ldx, const T *x, const T *past,         \
                            const T *w, const T *bias, T *a) {                                     \
    for (int64_t t = 0; t < nt; t++) {                                                             \
        T *at = a + t * nc;                                                                        \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            int64_t s = t - nk + 1 + j;                                                            \
            const T *in = s >= 0 ? x + s * ldx : (past ? past + (nk - 1 + s) * nc : NULL);         \
            const T *wj = w + j * nc;                                                              \
            if (j == 0) {                                                                          \
                if (in) { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) at[c] = in[c] * wj[c]; } \
                else { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) at[c] = (T)0 * wj[c]; } \
            } else if (in) {                                                                       \
                _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) at[c] = at[c] + in[c] * wj[c]; \
            } else {                                                                               \
                _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) at[c] = at[c] + (T)0 * wj[c]; \
            }                                                                                      \
        }                                                                                          \
        if (bias) { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) at[c] = at[c] + bias[c]; } \
    }                                                                                              \
}

#define CONV_KERNELS(T, SUF, EXP)                                                                  \
CONV_PRE(T, SUF)                                                                                   \
int dl_sc_fwd_##SUF(int64_t ne, int64_t nb, int64_t nt, int64_t nc, int64_t nk, int64_t ldx, const T *x,        \
                    const T *past, const T *w, const T *bias, T *out) {                            \
    for (int64_t e = 0; e < ne; e++)                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            int64_t seq = e * nb + b;                                                              \
            T *o = out + seq * nt * nc;                                                            \
            dl_sc_pre_##SUF(nt, nc, nk, ldx, x + seq * nt * ldx, past ? past + seq * (nk - 1) * nc : NULL, \
                            w + e * nk * nc, bias ? bias + e * nc : NULL, o);                      \
            _Pragma("omp simd")                                                                    \
            for (int64_t i = 0; i < nt * nc; i++) o[i] = o[i] / ((T)1 + EXP(-o[i]));               \
        }                                                                                          \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_sc_bwd_##SUF(int64_t ne, int64_t nb, int64_t nt, int64_t nc, int64_t nk, int64_t ldx, int64_t ldg,    \
                    const T *x,                                                                    \
                    const T *past, const T *w, const T *bias, const T *gout, T *gx, T *gpast,      \
                    T *gw, T *gb) {                                                                \
    T *g = (T *)malloc(sizeof(T) * (size_t)(nt * nc + 1));                                         \
    if (!g) return 1;                                                                              \
    for (int64_t e = 0; e < ne; e++)                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            int64_t seq = e * nb + b;                                                              \
            const T *xs = x + seq * nt * ldx, *ps = past ? past + seq * (nk - 1) * nc : NULL;       \
            const T *we = w + e * nk * nc, *go = gout + seq * nt * nc;                             \
            T *gwe = gw + e * nk * nc;                                                             \
            dl_sc_pre_##SUF(nt, nc, nk, ldx, xs, ps, we, bias ? bias + e * nc : NULL, g);               \
            _Pragma("omp simd")                                                                    \
            for (int64_t i = 0; i < nt * nc; i++) {                                                \
                T a = g[i], sg = (T)1 / ((T)1 + EXP(-a));                                          \
                g[i] = go[i] * (sg * ((T)1 + a * ((T)1 - sg)));                                    \
            }                                                                                      \
            if (gb) {                                                                              \
                T *gbe = gb + e * nc;                                                              \
                for (int64_t t = 0; t < nt; t++) {                                                 \
                    _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gbe[c] += g[t * nc + c];  \
                }                                                                                  \
            }                                                                                      \
            /* inputs s in [-(K - 1), T): gx / gpast and the taps' gradients */                    \
            for (int64_t s = -(nk - 1); s < nt; s++) {                                             \
                const T *in = s >= 0 ? xs + s * ldx : (ps ? ps + (nk - 1 + s) * nc : NULL);        \
                T *gi = s >= 0 ? gx + (seq * nt + s) * ldg                                         \
                               : (gpast ? gpast + (seq * (nk - 1) + nk - 1 + s) * nc : NULL);      \
                if (gi) memset(gi, 0, sizeof(T) * (size_t)nc);                                     \
                for (int64_t j = 0; j < nk; j++) {                                                 \
                    int64_t t = s + nk - 1 - j; /* the output step this input meets tap j at */    \
                    if (t < 0 || t >= nt) continue;                                                \
                    const T *gt = g + t * nc, *wj = we + j * nc;                                   \
                    T *gwj = gwe + j * nc;                                                         \
                    if (gi) { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gi[c] += wj[c] * gt[c]; } \
                    if (in) { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gwj[c] += in[c] * gt[c]; } \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    free(g);                                                                                       \
    return 0;                                                                                      \
}

CONV_KERNELS(float, f32, dl_expf)
CONV_KERNELS(double, f64, dl_exp)
