
/* dynlab selective scan, CPU.  Layouts (all contiguous): u, delta, y [B, T, D]; A [B / nbg, D, N]
   (batch row b reads A[b / nbg]: nbg = B, one A for all rows; the LM stacks pass the rows of
   all members at once, nbg rows per member); B, C [B, T, N]; h0, final state [B, D, N]; gA as A
   (accumulated over each group's rows, in row order).  Forward:
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

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#define SCAN_KERNELS(T, SUF, EXP)                                                                  \
int dl_ss_fwd_##SUF(int64_t nb, int64_t nbg, int64_t nt, int64_t nd, int64_t nn, const T *u,       \
                    const T *delta, const T *A, const T *B, const T *C, const T *h0, T *y, T *hT, T *dsave) { \
    T *h = (T *)malloc(sizeof(T) * (size_t)nn);                                                    \
    if (!h) return 1;                                                                              \
    for (int64_t b = 0; b < nb; b++)                                                               \
        for (int64_t d = 0; d < nd; d++) {                                                         \
            const T *a = A + ((b / nbg) * nd + d) * nn;                                            \
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
int dl_ss_bwd_##SUF(int64_t nb, int64_t nbg, int64_t nt, int64_t nd, int64_t nn, const T *u,       \
                    const T *delta, const T *A, const T *B, const T *C, const T *h0, const T *dsave, const T *gy, \
                    const T *gfinal, T *gu, T *gdelta, T *gA, T *gB, T *gC, T *gh0) {              \
    T *hs = (T *)malloc(sizeof(T) * (size_t)((nt + 1) * nn));                                      \
    T *decs = dsave ? NULL : (T *)malloc(sizeof(T) * (size_t)(nt * nn + 1));                       \
    T *lam = (T *)malloc(sizeof(T) * (size_t)nn);                                                  \
    if (!hs || (!dsave && !decs) || !lam) { free(hs); free(decs); free(lam); return 1; }           \
    for (int64_t b = 0; b < nb; b++)                                                               \
        for (int64_t d = 0; d < nd; d++) {                                                         \
            const T *a = A + ((b / nbg) * nd + d) * nn;                                            \
            T *ga = gA + ((b / nbg) * nd + d) * nn;                                                \
            const T *row = dsave ? dsave + (b * nd + d) * nt * nn : decs; /* decays of the row, [T, N] */ \
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
