/* dynlab per-token cross-entropy, CPU (the LM stacks' next-token loss).  Layouts (all
   contiguous): logits, glogits [N, V]; targets int64 [N] (each in [0, V)); nll, lse, gnll [N].
   Forward, per row:  m = max_v x_v,  lse = m + log(sum_v exp(x_v - m)),  nll = lse - x_target.
   Backward, per row:  glogits_v = (exp(x_v - lse) - [v == target]) gnll.
   The forward keeps lse for the backward pass, which needs nothing else.
   In place (the LM head's logits, which nothing else reads): dl_ce_probs overwrites each row
   of x with its softmax exp(x_v - m) / sum (and writes nll, lse as the forward does);
   dl_ce_probs_grad overwrites those probabilities p with (p_v - [v == target]) gnll. */
#include <math.h>
#include <stdint.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#define CE_KERNELS(T, SUF, EXP, LOG)                                                               \
void dl_ce_fwd_##SUF(int64_t nn, int64_t nv, const T *x, const int64_t *tgt, T *nll, T *lse) {     \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        const T *xr = x + i * nv;                                                                  \
        T m = xr[0];                                                                               \
        _Pragma("omp simd reduction(max:m)")                                                       \
        for (int64_t v = 1; v < nv; v++) m = xr[v] > m ? xr[v] : m;                                \
        T s = 0;                                                                                   \
        _Pragma("omp simd reduction(+:s)")                                                         \
        for (int64_t v = 0; v < nv; v++) s += EXP(xr[v] - m);                                      \
        T l = m + LOG(s);                                                                          \
        lse[i] = l;                                                                                \
        nll[i] = l - xr[tgt[i]];                                                                   \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
void dl_ce_bwd_##SUF(int64_t nn, int64_t nv, const T *x, const int64_t *tgt, const T *lse,         \
                     const T *gnll, T *gx) {                                                       \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        const T *xr = x + i * nv;                                                                  \
        T *gr = gx + i * nv;                                                                       \
        T l = lse[i], g = gnll[i];                                                                 \
        _Pragma("omp simd")                                                                        \
        for (int64_t v = 0; v < nv; v++) gr[v] = EXP(xr[v] - l) * g;                               \
        gr[tgt[i]] -= g;                                                                           \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
void dl_ce_probs_##SUF(int64_t nn, int64_t nv, T *x, const int64_t *tgt, T *nll, T *lse) {         \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        T *xr = x + i * nv;                                                                        \
        T m = xr[0], xt = xr[tgt[i]];                                                              \
        _Pragma("omp simd reduction(max:m)")                                                       \
        for (int64_t v = 1; v < nv; v++) m = xr[v] > m ? xr[v] : m;                                \
        T s = 0;                                                                                   \
        _Pragma("omp simd reduction(+:s)")                                                         \
        for (int64_t v = 0; v < nv; v++) { xr[v] = EXP(xr[v] - m); s += xr[v]; }                   \
        T l = m + LOG(s), r = (T)1 / s;                                                            \
        lse[i] = l;                                                                                \
        nll[i] = l - xt;                                                                           \
        _Pragma("omp simd")                                                                        \
        for (int64_t v = 0; v < nv; v++) xr[v] = xr[v] * r;                                        \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
void dl_ce_probs_grad_##SUF(int64_t nn, int64_t nv, T *p, const int64_t *tgt, const T *gnll) {     \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        T *pr = p + i * nv;                                                                        \
        T g = gnll[i];                                                                             \
        _Pragma("omp simd")                                                                        \
        for (int64_t v = 0; v < nv; v++) pr[v] = pr[v] * g;                                        \
        pr[tgt[i]] -= g;                                                                           \
    }                                                                                              \
}

CE_KERNELS(float, f32, dl_expf, logf)
CE_KERNELS(double, f64, dl_exp, log)
