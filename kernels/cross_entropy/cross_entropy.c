/* dynlab per-token cross-entropy, CPU (the LM stacks' next-token loss).  Layouts (all
   contiguous): logits, glogits [N, V]; targets int64 [N] (each in [0, V)); nll, lse, gnll [N].
   Forward, per row:  m = max_v x_v,  lse = m + log(sum_v exp(x_v - m)),  nll = lse - x_target.
   Backward, per row:  glogits_v = (exp(x_v - lse) - [v == target]) gnll.
   The forward keeps lse for the backward pass, which needs nothing else. */
#include <math.h>
#include <stdint.h>

/* exp for float32 that the compiler can vectorise (the one of selective_scan.c: about 1 ulp). */
static inline float dl_expf(float x) {
    float xc = x < -87.33654475f ? -87.33654475f : x;
    xc = xc > 88.72283935546875f ? 88.72283935546875f : xc;
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
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
}

CE_KERNELS(float, f32, dl_expf, logf)
CE_KERNELS(double, f64, dl_exp, log)
