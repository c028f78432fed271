/* dynlab C kernels' shared prelude: kernels/compiled.py puts this text where a kernel source has
   the line  #include "dl_prelude.h"  (after the source's own pragmas, which then apply to these
   functions too), and hashes it with the source, so a change here rebuilds every kernel. */
#include <math.h>
#include <stdint.h>

/* exp for float32 that the compiler can vectorise: x = k ln2 + r with |r| <= ln2/2 (ln2 split
   in a 9-bit head and a tail, so k ln2 is exact), e^r by a degree-6 polynomial (coefficients
   fitted for this kernel: least squares on 4000 Chebyshev nodes of [-ln2/2, ln2/2], reweighted
   towards the minimax relative error, 1.9e-9 = 0.03 ulp in exact arithmetic; at most 1.02
   ulp measured as evaluated in float32 with FMAs over [-87.3, 88.7]), then 2^k applied in two
   halves (k reaches 128 just below the overflow threshold).  0 below ln(FLT_MIN) = -87.34: no
   denormal results, which x86 cores multiply far more slowly (and which hold no precision
   anyway); inf above 88.72. */
static inline float dl_expf(float x) {
    float xc = x < -87.33654475f ? -87.33654475f : x;
    xc = xc > 88.72283935546875f ? 88.72283935546875f : xc;
    float k = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
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

/* the float64 kernels' exp: libm's */
static inline double dl_exp(double x) { return exp(x); }
