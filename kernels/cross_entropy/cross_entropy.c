/* dynlab per-token cross-entropy, CPU (the LM stacks' next-token loss).  Layouts (all
   contiguous): logits, glogits [N, V]; targets int64 [N] (each in [0, V)); nll, mx, ls, lse, gnll [N].
   Forward, per row:  m = max_v x_v,  l = log(sum_v exp(x_v - m)),  nll = (m - x_target) + l.
   Backward, per row:  glogits_v = (exp((x_v - m) - l) - [v == target]) gnll.
   The forward keeps m and l for the backward pass, which needs nothing else.  m and l stay
   apart (not summed into the log-sum-exp m + l before use): with logits of a large common
   offset, m + l would round l away.
   In place (the LM head's logits, which nothing else reads): dl_ce_probs overwrites each row
   of x with its softmax exp(x_v - m) / sum (and writes nll as the forward does, and the
   log-sum-exp lse = m + l); dl_ce_probs_grad overwrites those probabilities p with
   (p_v - [v == target]) gnll. */
#include <math.h>
#include <stdint.h>

#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */

#define CE_KERNELS(T, SUF, EXP, LOG)                                                               \
void dl_ce_fwd_##SUF(int64_t nn, int64_t nv, const T *x, const int64_t *tgt, T *nll, T *mx, T *ls) { \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        const T *xr = x + i * nv;                                                                  \
        T m = xr[0];                                                                               \
        _Pragma("omp simd reduction(max:m)")                                                       \
        for (int64_t v = 1; v < nv; v++) m = xr[v] > m ? xr[v] : m;                                \
        T s = 0;                                                                                   \
        _Pragma("omp simd reduction(+:s)")                                                         \
        for (int64_t v = 0; v < nv; v++) s += EXP(xr[v] - m);                                      \
        T l = LOG(s);                                                                              \
        mx[i] = m;                                                                                 \
        ls[i] = l;                                                                                 \
        nll[i] = (m - xr[tgt[i]]) + l;                                                             \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
void dl_ce_bwd_##SUF(int64_t nn, int64_t nv, const T *x, const int64_t *tgt, const T *mx,          \
                     const T *ls, const T *gnll, T *gx) {                                          \
    for (int64_t i = 0; i < nn; i++) {                                                             \
        const T *xr = x + i * nv;                                                                  \
        T *gr = gx + i * nv;                                                                       \
        T m = mx[i], l = ls[i], g = gnll[i];                                                       \
        _Pragma("omp simd")                                                                        \
        for (int64_t v = 0; v < nv; v++) gr[v] = EXP((xr[v] - m) - l) * g;                         \
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
        T l = LOG(s), r = (T)1 / s;                                                                \
        lse[i] = m + l;                                                                            \
        nll[i] = (m - xt) + l;                                                                     \
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
