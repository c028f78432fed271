/* dynlab gated RMSNorm, CPU (the LM stacks' Mamba-2 and GLA output norm).  Layouts: y, z and
   s [E, R, D] (R rows per member) with row strides ldy, ldz, lds (last dim contiguous, rows
   evenly spaced: slices of a wider last dim); out, gout, gy [E, R, D] contiguous; gz and gs
   [E, R, D] with row strides ldgz, ldgs (the backward may write them into slices of wider gradients);
   w, gw, d, gd [E, D].  s and d are the optional skip (null: none; Mamba-2's D·x).
   Forward, per row:  u = y + d s,  g = u silu(z),  r = 1 / sqrt(mean(g^2) + eps),  out = (g r) w.
   Backward (the row's u, g and r recomputed):  gg = r (gout w) - r^3 g mean(gout w g),
   gu = gg silu(z) (= gy),  gs = gu d,  gz = gg u silu'(z),  gw += gout g r,  gd += gu s
   (gw and gd accumulated; they must be zeroed).
   Both return 0, or 1 when a buffer cannot be allocated. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#define NORM_KERNELS(T, SUF, EXP, SQRT)                                                            \
/* u = y + d s of one row into u */                                                                \
static inline void dl_gn_u_##SUF(int64_t nd, const T *yr, const T *sr, const T *de, T *u) {        \
    if (sr) { _Pragma("omp simd") for (int64_t i = 0; i < nd; i++) u[i] = yr[i] + de[i] * sr[i]; } \
    else { _Pragma("omp simd") for (int64_t i = 0; i < nd; i++) u[i] = yr[i]; }                    \
}                                                                                                  \
                                                                                                   \
int dl_gn_fwd_##SUF(int64_t ne, int64_t nr, int64_t nd, int64_t ldy, int64_t ldz, int64_t lds,     \
                    double eps, const T *y, const T *z, const T *s, const T *d, const T *w, T *out) { \
    T *g = (T *)malloc(sizeof(T) * (size_t)(nd + 1));                                              \
    if (!g) return 1;                                                                              \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T *we = w + e * nd, *de = d ? d + e * nd : NULL;                                     \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            int64_t row = e * nr + r;                                                              \
            const T *zr = z + row * ldz;                                                           \
            dl_gn_u_##SUF(nd, y + row * ldy, s ? s + row * lds : NULL, de, g);                     \
            T ss = 0;                                                                              \
            _Pragma("omp simd reduction(+:ss)")                                                    \
            for (int64_t i = 0; i < nd; i++) {                                                     \
                T gi = g[i] * (zr[i] / ((T)1 + EXP(-zr[i])));                                      \
                g[i] = gi;                                                                         \
                ss += gi * gi;                                                                     \
            }                                                                                      \
            T rs = (T)1 / SQRT(ss / (T)nd + (T)eps);                                               \
            T *outr = out + row * nd;                                                              \
            _Pragma("omp simd")                                                                    \
            for (int64_t i = 0; i < nd; i++) outr[i] = (g[i] * rs) * we[i];                        \
        }                                                                                          \
    }                                                                                              \
    free(g);                                                                                       \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_gn_bwd_##SUF(int64_t ne, int64_t nr, int64_t nd, int64_t ldy, int64_t ldz, int64_t lds,     \
                    int64_t ldgz, int64_t ldgs, double eps, const T *y, const T *z, const T *s,    \
                    const T *d, const T *w,                                                        \
                    const T *gout, T *gy, T *gz, T *gs, T *gd, T *gw) {                            \
    T *u = (T *)malloc(sizeof(T) * (size_t)(3 * nd + 1));                                          \
    if (!u) return 1;                                                                              \
    T *g = u + nd, *sg = u + 2 * nd;                                                               \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T *we = w + e * nd, *de = d ? d + e * nd : NULL;                                     \
        T *gwe = gw + e * nd, *gde = gd ? gd + e * nd : NULL;                                      \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            int64_t row = e * nr + r, o = row * nd;                                                \
            const T *zr = z + row * ldz, *sr = s ? s + row * lds : NULL, *gr = gout + o;           \
            dl_gn_u_##SUF(nd, y + row * ldy, sr, de, u);                                           \
            T ss = 0, dot = 0;                                                                     \
            _Pragma("omp simd reduction(+:ss, dot)")                                               \
            for (int64_t i = 0; i < nd; i++) {                                                     \
                T sgi = (T)1 / ((T)1 + EXP(-zr[i]));                                               \
                T gi = u[i] * (zr[i] * sgi);                                                       \
                g[i] = gi;                                                                         \
                sg[i] = sgi;                                                                       \
                ss += gi * gi;                                                                     \
                dot += gr[i] * we[i] * gi;                                                         \
            }                                                                                      \
            T rs = (T)1 / SQRT(ss / (T)nd + (T)eps);                                               \
            T c = rs * rs * rs * dot / (T)nd;                                                      \
            T *gyr = gy + o, *gzr = gz + row * ldgz;                                               \
            _Pragma("omp simd")                                                                    \
            for (int64_t i = 0; i < nd; i++) {                                                     \
                T sgi = sg[i];                                                                     \
                T gg = rs * (gr[i] * we[i]) - c * g[i];                                            \
                gyr[i] = gg * (zr[i] * sgi);                                                       \
                gzr[i] = gg * u[i] * (sgi * ((T)1 + zr[i] * ((T)1 - sgi)));                        \
                gwe[i] += gr[i] * (g[i] * rs);                                                     \
            }                                                                                      \
            if (sr) {                                                                              \
                T *gsr = gs + row * ldgs;                                                          \
                _Pragma("omp simd")                                                                \
                for (int64_t i = 0; i < nd; i++) {                                                 \
                    gsr[i] = gyr[i] * de[i];                                                       \
                    gde[i] += gyr[i] * sr[i];                                                      \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    free(u);                                                                                       \
    return 0;                                                                                      \
}

NORM_KERNELS(float, f32, dl_expf, sqrtf)
NORM_KERNELS(double, f64, dl_exp, sqrt)
