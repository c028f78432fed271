/* dynlab gated RMSNorm, CPU (the LM stacks' Mamba-2 and GLA output norm).  Layouts (all
   contiguous): y, z, out, gout, gy, gz [E, R, D] (R rows per member); w, gw [E, D].
   Forward, per row:  g = y silu(z),  r = 1 / sqrt(mean(g^2) + eps),  out = (g r) w.
   Backward (the row's g and r recomputed):  gg = r (gout w) - r^3 g mean(gout w g),
   gy = gg silu(z),  gz = gg y silu'(z),  gw += gout g r  (accumulated; gw must be zeroed).
   Both return 0, or 1 when a [D] buffer cannot be allocated. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

#define NORM_KERNELS(T, SUF, EXP, SQRT)                                                            \
int dl_gn_fwd_##SUF(int64_t ne, int64_t nr, int64_t nd, double eps, const T *y, const T *z,        \
                    const T *w, T *out) {                                                          \
    T *g = (T *)malloc(sizeof(T) * (size_t)(nd + 1));                                              \
    if (!g) return 1;                                                                              \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T *we = w + e * nd;                                                                  \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            int64_t o = (e * nr + r) * nd;                                                         \
            const T *yr = y + o, *zr = z + o;                                                      \
            T ss = 0;                                                                              \
            _Pragma("omp simd reduction(+:ss)")                                                    \
            for (int64_t d = 0; d < nd; d++) {                                                     \
                T gd = yr[d] * (zr[d] / ((T)1 + EXP(-zr[d])));                                     \
                g[d] = gd;                                                                         \
                ss += gd * gd;                                                                     \
            }                                                                                      \
            T rs = (T)1 / SQRT(ss / (T)nd + (T)eps);                                               \
            T *outr = out + o;                                                                     \
            _Pragma("omp simd")                                                                    \
            for (int64_t d = 0; d < nd; d++) outr[d] = (g[d] * rs) * we[d];                        \
        }                                                                                          \
    }                                                                                              \
    free(g);                                                                                       \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_gn_bwd_##SUF(int64_t ne, int64_t nr, int64_t nd, double eps, const T *y, const T *z,        \
                    const T *w, const T *gout, T *gy, T *gz, T *gw) {                              \
    T *g = (T *)malloc(sizeof(T) * (size_t)(2 * nd + 1));                                          \
    if (!g) return 1;                                                                              \
    T *sg = g + nd;                                                                                \
    for (int64_t e = 0; e < ne; e++) {                                                             \
        const T *we = w + e * nd;                                                                  \
        T *gwe = gw + e * nd;                                                                      \
        for (int64_t r = 0; r < nr; r++) {                                                         \
            int64_t o = (e * nr + r) * nd;                                                         \
            const T *yr = y + o, *zr = z + o, *gr = gout + o;                                      \
            T ss = 0, dot = 0;                                                                     \
            _Pragma("omp simd reduction(+:ss, dot)")                                               \
            for (int64_t d = 0; d < nd; d++) {                                                     \
                T s = (T)1 / ((T)1 + EXP(-zr[d]));                                                 \
                T gd = yr[d] * (zr[d] * s);                                                        \
                g[d] = gd;                                                                         \
                sg[d] = s;                                                                         \
                ss += gd * gd;                                                                     \
                dot += gr[d] * we[d] * gd;                                                         \
            }                                                                                      \
            T rs = (T)1 / SQRT(ss / (T)nd + (T)eps);                                               \
            T c = rs * rs * rs * dot / (T)nd;                                                      \
            T *gyr = gy + o, *gzr = gz + o;                                                        \
            _Pragma("omp simd")                                                                    \
            for (int64_t d = 0; d < nd; d++) {                                                     \
                T s = sg[d];                                                                       \
                T gg = rs * (gr[d] * we[d]) - c * g[d];                                            \
                gyr[d] = gg * (zr[d] * s);                                                         \
                gzr[d] = gg * yr[d] * (s * ((T)1 + zr[d] * ((T)1 - s)));                           \
                gwe[d] += gr[d] * (g[d] * rs);                                                     \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    free(g);                                                                                       \
    return 0;                                                                                      \
}

NORM_KERNELS(float, f32, dl_expf, sqrtf)
NORM_KERNELS(double, f64, dl_exp, sqrt)
