/* dynlab GLA recurrence, CPU (the LM stacks' GLA layer).  Layouts: q, k, gk [N, T, H, K] and
   v [N, T, H, V] as rows of (n, t) with row strides ldq, ldk, ldg, ldv (heads and keys
   contiguous: slices of a wider last dim); contiguous: gq, gkk, ggk [N, T, H, K]; o, gv, go
   [N, T, H, V]; h0, final, gh0, gfinal [N, H, K, V] (h0 null: zeros; final null: not written;
   gfinal null: a zero gradient).  Per sequence n and
   head h, with the state S [K, V] and e_t = exp(gk_t):
       S_t = diag(e_t) S_{t-1} + k_t v_t^T,      o_t = (scale q_t)^T S_t,      S_{-1} = h0.
   Backward: the states S_0 .. S_{T-1} are recomputed into a [T + 1, V, K] scratch buffer
   (transposed), then the adjoint L = dLoss/dS_t runs back through time:
       L += (scale q_t) go_t^T,   gq_t = scale S_t go_t,   gk_t = L v_t,   gv_t = L^T k_t,
       ggk_t = e_t * (L . S_{t-1}) (rowwise),   L = diag(e_t) L   (then gh0 = L).
   Sums over K and V run in index order, with fused multiply-adds where the compiler forms
   them (this kernel has no torch twin to match bit for bit; tests/kernels/test_gla_recurrent.py
   compares it with the step-by-step reference).  Both return 0, or 1 when a buffer cannot be
   allocated. */
#if defined(__clang__)
#pragma clang fp contract(fast)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=fast")
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#define GLA_KERNELS(T, SUF, EXP)                                                                   \
int dl_gla_fwd_##SUF(int64_t nn, int64_t nt, int64_t nh, int64_t nk, int64_t nv, int64_t ldq,      \
                     int64_t ldk, int64_t ldv, int64_t ldg, double sc, const T *q, const T *k,     \
                     const T *v, const T *gk, const T *h0, T *o, T *fin) {                         \
    const T scale = (T)sc;                                                                         \
    const int64_t kv = nk * nv;                                                                    \
    T *S = (T *)malloc(sizeof(T) * (size_t)(kv + nk));                                             \
    if (!S) return 1;                                                                              \
    T *e = S + kv;                                                                                 \
    for (int64_t n = 0; n < nn; n++)                                                               \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            if (h0) memcpy(S, h0 + (n * nh + h) * kv, sizeof(T) * (size_t)kv);                     \
            else memset(S, 0, sizeof(T) * (size_t)kv);                                             \
            for (int64_t t = 0; t < nt; t++) {                                                     \
                const int64_t r = n * nt + t, iv = (r * nh + h) * nv;                              \
                const T *g = gk + r * ldg + h * nk, *kt = k + r * ldk + h * nk;                    \
                const T *qt = q + r * ldq + h * nk, *vt = v + r * ldv + h * nv;                    \
                T *ot = o + iv;                                                                    \
                _Pragma("omp simd") for (int64_t i = 0; i < nk; i++) e[i] = EXP(g[i]);             \
                _Pragma("omp simd") for (int64_t j = 0; j < nv; j++) ot[j] = 0;                    \
                for (int64_t i = 0; i < nk; i++) { /* S = diag(e) S + k v^T;  o += (scale q_i) S_i */ \
                    const T ei = e[i], ki = kt[i], a = scale * qt[i];                              \
                    T *s = S + i * nv;                                                             \
                    _Pragma("omp simd") for (int64_t j = 0; j < nv; j++) {                         \
                        s[j] = ei * s[j] + ki * vt[j];                                             \
                        ot[j] += a * s[j];                                                         \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            if (fin) memcpy(fin + (n * nh + h) * kv, S, sizeof(T) * (size_t)kv);                   \
        }                                                                                          \
    free(S);                                                                                       \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
/* The backward pass keeps the states and the adjoint transposed, [V, K], so that every sum it     \
   takes over V (gq, gk, ggk) is a K-wide vector accumulated row by row; only gv sums over K. */   \
int dl_gla_bwd_##SUF(int64_t nn, int64_t nt, int64_t nh, int64_t nk, int64_t nv, int64_t ldq,      \
                     int64_t ldk, int64_t ldv, int64_t ldg, double sc, const T *q, const T *k,     \
                     const T *v, const T *gk, const T *h0, const T *go,                            \
                     const T *gfin, T *gq, T *gkk, T *gv, T *ggk, T *gh0) {                        \
    const T scale = (T)sc;                                                                         \
    const int64_t kv = nk * nv;                                                                    \
    T *Ss = (T *)malloc(sizeof(T) * (size_t)((nt + 2) * kv + 4 * nk));                             \
    if (!Ss) return 1;                                                                             \
    T *L = Ss + (nt + 1) * kv, *e = L + kv, *aq = e + nk, *ak = aq + nk, *ae = ak + nk;            \
    for (int64_t n = 0; n < nn; n++)                                                               \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            const int64_t row = (n * nh + h) * kv;                                                 \
            /* Ss[t + 1] = S_t^T, Ss[0] = S_{-1}^T, each [V, K] */                                 \
            for (int64_t j = 0; j < nv; j++)                                                       \
                for (int64_t i = 0; i < nk; i++) Ss[j * nk + i] = h0 ? h0[row + i * nv + j] : (T)0; \
            for (int64_t t = 0; t < nt; t++) {                                                     \
                const int64_t r = n * nt + t;                                                      \
                const T *g = gk + r * ldg + h * nk, *kt = k + r * ldk + h * nk;                    \
                const T *vt = v + r * ldv + h * nv;                                                \
                _Pragma("omp simd") for (int64_t i = 0; i < nk; i++) e[i] = EXP(g[i]);             \
                for (int64_t j = 0; j < nv; j++) {                                                 \
                    const T *sp = Ss + t * kv + j * nk;                                            \
                    T *s = Ss + (t + 1) * kv + j * nk;                                             \
                    const T vj = vt[j];                                                            \
                    _Pragma("omp simd") for (int64_t i = 0; i < nk; i++) s[i] = e[i] * sp[i] + kt[i] * vj; \
                }                                                                                  \
            }                                                                                      \
            for (int64_t j = 0; j < nv; j++)                                                       \
                for (int64_t i = 0; i < nk; i++) L[j * nk + i] = gfin ? gfin[row + i * nv + j] : (T)0; \
            for (int64_t t = nt - 1; t >= 0; t--) {                                                \
                const int64_t r = n * nt + t, ik = (r * nh + h) * nk, iv = (r * nh + h) * nv;      \
                const T *g = gk + r * ldg + h * nk, *kt = k + r * ldk + h * nk;                    \
                const T *qt = q + r * ldq + h * nk, *vt = v + r * ldv + h * nv, *gt = go + iv;     \
                T *gvt = gv + iv;                                                                  \
                _Pragma("omp simd") for (int64_t i = 0; i < nk; i++) {                             \
                    e[i] = EXP(g[i]);                                                              \
                    aq[i] = 0; ak[i] = 0; ae[i] = 0;                                               \
                }                                                                                  \
                for (int64_t j = 0; j < nv; j++) {                                                 \
                    const T *s = Ss + (t + 1) * kv + j * nk, *sp = Ss + t * kv + j * nk;           \
                    T *l = L + j * nk;                                                             \
                    const T gj = gt[j], vj = vt[j];                                                \
                    T acc = 0;                                                                     \
                    _Pragma("omp simd reduction(+:acc)")                                           \
                    for (int64_t i = 0; i < nk; i++) {                                             \
                        const T li = l[i] + (scale * qt[i]) * gj; /* dLoss/dS_t */                 \
                        aq[i] += s[i] * gj;                                                        \
                        ak[i] += li * vj;                                                          \
                        ae[i] += li * sp[i];                                                       \
                        acc += li * kt[i];                                                         \
                        l[i] = e[i] * li; /* dLoss/dS_{t-1} through S_t */                         \
                    }                                                                              \
                    gvt[j] = acc;                                                                  \
                }                                                                                  \
                T *gqt = gq + ik, *gkt = gkk + ik, *ggt = ggk + ik;                                \
                _Pragma("omp simd") for (int64_t i = 0; i < nk; i++) {                             \
                    gqt[i] = scale * aq[i];                                                        \
                    gkt[i] = ak[i];                                                                \
                    ggt[i] = e[i] * ae[i];                                                         \
                }                                                                                  \
            }                                                                                      \
            if (gh0)                                                                               \
                for (int64_t i = 0; i < nk; i++)                                                   \
                    for (int64_t j = 0; j < nv; j++) gh0[row + i * nv + j] = L[j * nk + i];        \
        }                                                                                          \
    free(Ss);                                                                                      \
    return 0;                                                                                      \
}

GLA_KERNELS(float, f32, dl_expf)
GLA_KERNELS(double, f64, dl_exp)
