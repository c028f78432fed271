/* dynlab AdamW over a stack of E models, CPU (the LM stacks' optimiser step), in two passes
   around torch's own square root.  Layouts: p, g, m1, m2, s [E, P] contiguous; coef, alive
   [E]; decay [P].  Per member e and entry i, with a = alive[e] (1: training, 0: frozen) and
   c = coef[e] (the member's clipping factor):
     dl_adamw_moments:  g'  = a != 0 ? g c : 0
                        m1 = fma(w1, g' - m1, m1)        (torch's lerp_, w1 = 1 - beta1)
                        m2 = fma(w2 g', g', m2 beta2)    (torch's mul_ then addcmul_, w2 = 1 - beta2)
     (the caller: s = sqrt(m2), torch's sqrt, which need not be correctly rounded)
     dl_adamw_params:   p = p (1 - (lr decay_i) a)
                        p = p + (step (m1 a)) / (s / bc2s + eps)      (step = -lr / bc1)
   each product and sum rounded in the working precision in that order, with a fused
   multiply-add exactly where torch's vectorised CPU loops use one (lerp, addcmul): the ops
   of kernels/adamw/step.py's torch form, bit for bit where torch's loops fuse those two
   (x86 with AVX2 or newer).  A frozen member's parameters stay exactly as they were (the
   update adds zero and multiplies by one).  Three passes over the stack instead of a dozen:
   the step is bound by memory traffic. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include <math.h>
#include <stdint.h>

#define ADAMW_KERNELS(T, SUF, FMA)                                                                 \
int dl_adamw_moments_##SUF(int64_t ne, int64_t np, const T *g, T *m1, T *m2, const T *coef,        \
                           const T *alive, double w1d, double b2d, double w2d) {                  \
    const T w1 = (T)w1d, b2 = (T)b2d, w2 = (T)w2d;                                                 \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T c = coef[e], a = alive[e];                                                         \
        T *m1e = m1 + e * np, *m2e = m2 + e * np;                                                  \
        const T *ge = g + e * np;                                                                  \
        _Pragma("omp simd")                                                                        \
        for (int64_t i = 0; i < np; i++) {                                                         \
            const T gi = a != (T)0 ? ge[i] * c : (T)0;                                             \
            m1e[i] = FMA(w1, gi - m1e[i], m1e[i]);                                                 \
            m2e[i] = FMA(w2 * gi, gi, m2e[i] * b2);                                                \
        }                                                                                          \
    }                                                                                              \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_adamw_params_##SUF(int64_t ne, int64_t np, T *p, const T *m1, const T *s, const T *alive,   \
                          const T *decay, double lr, double stepd, double bc2sd, double epsd) {   \
    const T flr = (T)lr, step = (T)stepd, bc2s = (T)bc2sd, eps = (T)epsd;                          \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T a = alive[e];                                                                      \
        T *pe = p + e * np;                                                                        \
        const T *m1e = m1 + e * np, *se = s + e * np;                                              \
        _Pragma("omp simd")                                                                        \
        for (int64_t i = 0; i < np; i++) {                                                         \
            const T q = pe[i] * ((T)1 - (flr * decay[i]) * a);                                     \
            pe[i] = q + (step * (m1e[i] * a)) / (se[i] / bc2s + eps);                              \
        }                                                                                          \
    }                                                                                              \
    return 0;                                                                                      \
}

ADAMW_KERNELS(float, f32, fmaf)
ADAMW_KERNELS(double, f64, fma)
