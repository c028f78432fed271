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
   Both return 0, or 1 when a scratch row or buffer cannot be allocated. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#if defined(__GNUC__) || defined(__clang__)
#define DL_SC_INLINE static inline __attribute__((always_inline))
#else
#define DL_SC_INLINE static inline
#endif

/* Each sequence is one pass per direction, step by step: a step's K taps are summed in
   registers channel by channel (no partial sums written back), and the backward forms the
   tap and bias gradients at the step it computes g_t.  The per-sequence functions are inlined
   with K = 4 a constant (Mamba's default, the taps then unrolled) and with K at run time. */
#define CONV_KERNELS(T, SUF, EXP)                                                                  \
/* in[j] = in(t - K + 1 + j): x's row, the past window's row, or the zero row where there is none */ \
static inline void dl_sc_rows_##SUF(int64_t t, int64_t nc, int64_t nk, int64_t ldx, const T *x,    \
                                    const T *past, const T *zero, const T **in) {                  \
    for (int64_t j = 0; j < nk; j++) {                                                             \
        int64_t s = t - nk + 1 + j;                                                                \
        in[j] = s >= 0 ? x + s * ldx : (past ? past + (nk - 1 + s) * nc : zero);                   \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* one sequence: out_t = silu(a_t) */                                                              \
DL_SC_INLINE void dl_sc_seq_fwd_##SUF(int64_t nt, int64_t nc, int64_t nk, int64_t ldx, const T *x,  \
                                      const T *past, const T *w, const T *bias, const T *zero,     \
                                      T *out) {                                                    \
    const T *in[nk];                                                                               \
    for (int64_t t = 0; t < nt; t++) {                                                             \
        dl_sc_rows_##SUF(t, nc, nk, ldx, x, past, zero, in);                                       \
        T *o = out + t * nc;                                                                       \
        if (bias) {                                                                                \
            _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) {                                 \
                T a = in[0][c] * w[c];                                                             \
                for (int64_t j = 1; j < nk; j++) a = a + in[j][c] * w[j * nc + c];                 \
                a = a + bias[c];                                                                   \
                o[c] = a / ((T)1 + EXP(-a));                                                       \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) {                                 \
                T a = in[0][c] * w[c];                                                             \
                for (int64_t j = 1; j < nk; j++) a = a + in[j][c] * w[j * nc + c];                 \
                o[c] = a / ((T)1 + EXP(-a));                                                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
/* one sequence: g_t = gout_t silu'(a_t) into g [T, C] with gb and the taps' gradients of step t  \
   (each accumulates over t in order, as over the inputs s), then gx / gpast from g */             \
DL_SC_INLINE void dl_sc_seq_bwd_##SUF(int64_t nt, int64_t nc, int64_t nk, int64_t ldx, int64_t ldg, \
                                      const T *x, const T *past, const T *w, const T *bias,        \
                                      const T *zero, const T *go, T *g, T *gx, T *gpast, T *gw,    \
                                      T *gb) {                                                     \
    const T *in[nk];                                                                               \
    for (int64_t t = 0; t < nt; t++) {                                                             \
        dl_sc_rows_##SUF(t, nc, nk, ldx, x, past, zero, in);                                       \
        T *gt = g + t * nc;                                                                        \
        const T *got = go + t * nc;                                                                \
        _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) {                                     \
            T a = in[0][c] * w[c];                                                                 \
            for (int64_t j = 1; j < nk; j++) a = a + in[j][c] * w[j * nc + c];                     \
            if (bias) a = a + bias[c];                                                             \
            T sg = (T)1 / ((T)1 + EXP(-a));                                                        \
            gt[c] = got[c] * (sg * ((T)1 + a * ((T)1 - sg)));                                      \
        }                                                                                          \
        if (gb) { _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gb[c] += gt[c]; }           \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            if (in[j] == zero) continue; /* no input there (no past window): no term */            \
            T *gwj = gw + j * nc;                                                                  \
            const T *ij = in[j];                                                                   \
            _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gwj[c] += ij[c] * gt[c];          \
        }                                                                                          \
    }                                                                                              \
    /* gx[s] = sum_j w_j g[s + K - 1 - j] over the taps whose step lies in [0, T), j in order */   \
    for (int64_t s = -(nk - 1); s < nt; s++) {                                                     \
        T *gi = s >= 0 ? gx + s * ldg : (gpast ? gpast + (nk - 1 + s) * nc : NULL);                \
        if (!gi) continue;                                                                         \
        if (s >= 0 && s + nk - 1 < nt) { /* every tap meets a step */                              \
            const T *gs = g + (s + nk - 1) * nc;                                                   \
            _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) {                                 \
                T acc = 0;                                                                         \
                for (int64_t j = 0; j < nk; j++) acc = acc + w[j * nc + c] * gs[c - j * nc];       \
                gi[c] = acc;                                                                       \
            }                                                                                      \
            continue;                                                                              \
        }                                                                                          \
        _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gi[c] = 0;                            \
        for (int64_t j = 0; j < nk; j++) {                                                         \
            int64_t t = s + nk - 1 - j;                                                            \
            if (t < 0 || t >= nt) continue;                                                        \
            const T *gt = g + t * nc, *wj = w + j * nc;                                            \
            _Pragma("omp simd") for (int64_t c = 0; c < nc; c++) gi[c] = gi[c] + wj[c] * gt[c];    \
        }                                                                                          \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
int dl_sc_fwd_##SUF(int64_t ne, int64_t nb, int64_t nt, int64_t nc, int64_t nk, int64_t ldx,       \
                    const T *x, const T *past, const T *w, const T *bias, T *out) {                \
    T *zero = (T *)calloc((size_t)nc + 1, sizeof(T));                                              \
    if (!zero) return 1;                                                                           \
    for (int64_t e = 0; e < ne; e++)                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            int64_t seq = e * nb + b;                                                              \
            const T *xs = x + seq * nt * ldx, *ps = past ? past + seq * (nk - 1) * nc : NULL;       \
            const T *we = w + e * nk * nc, *be = bias ? bias + e * nc : NULL;                      \
            T *o = out + seq * nt * nc;                                                            \
            if (nk == 4) dl_sc_seq_fwd_##SUF(nt, nc, 4, ldx, xs, ps, we, be, zero, o);             \
            else dl_sc_seq_fwd_##SUF(nt, nc, nk, ldx, xs, ps, we, be, zero, o);                    \
        }                                                                                          \
    free(zero);                                                                                    \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_sc_bwd_##SUF(int64_t ne, int64_t nb, int64_t nt, int64_t nc, int64_t nk, int64_t ldx,       \
                    int64_t ldg, const T *x, const T *past, const T *w, const T *bias,             \
                    const T *gout, T *gx, T *gpast, T *gw, T *gb) {                                \
    T *g = (T *)calloc((size_t)((nt + 1) * nc + 1), sizeof(T)); /* g [T, C], then the zero row */ \
    if (!g) return 1;                                                                              \
    const T *zero = g + nt * nc;                                                                   \
    for (int64_t e = 0; e < ne; e++)                                                               \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            int64_t seq = e * nb + b;                                                              \
            const T *xs = x + seq * nt * ldx, *ps = past ? past + seq * (nk - 1) * nc : NULL;       \
            const T *we = w + e * nk * nc, *be = bias ? bias + e * nc : NULL, *go = gout + seq * nt * nc; \
            T *gxs = gx + seq * nt * ldg, *gps = gpast ? gpast + seq * (nk - 1) * nc : NULL;       \
            T *gwe = gw + e * nk * nc, *gbe = gb ? gb + e * nc : NULL;                             \
            if (nk == 4) dl_sc_seq_bwd_##SUF(nt, nc, 4, ldx, ldg, xs, ps, we, be, zero, go, g, gxs, gps, gwe, gbe); \
            else dl_sc_seq_bwd_##SUF(nt, nc, nk, ldx, ldg, xs, ps, we, be, zero, go, g, gxs, gps, gwe, gbe); \
        }                                                                                          \
    free(g);                                                                                       \
    return 0;                                                                                      \
}

CONV_KERNELS(float, f32, dl_expf)
CONV_KERNELS(double, f64, dl_exp)
