
#include <math.h>
#include <stdint.h>

static void tanh_run(int64_t n, float* x) {
    _Pragma("omp simd")
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float t = fabsf(v);
        float tc = t < 9.0f ? t : 9.0f;
        /* e = exp(-2 tc) = 2^k exp(r), k = round(-2 tc / ln 2), r = -2 tc - k ln 2 */
        float y = -2.0f * tc;
        float kf = rintf(y * 1.44269504088896341f);
        float r = y - kf * 0.693145751953125f;  /* ln 2, high part: exact in k * hi */
        r = r - kf * 1.428606765330187045e-06f;  /* ln 2, low part */
        float p = 1.0f / 5040.0f;
        p = p * r + 1.0f / 720.0f;
        p = p * r + 1.0f / 120.0f;
        p = p * r + 1.0f / 24.0f;
        p = p * r + 1.0f / 6.0f;
        p = p * r + 0.5f;
        p = p * r + 1.0f;
        p = p * r + 1.0f;
        union { int32_t i; float f; } two_k;
        two_k.i = ((int32_t)kf + 127) << 23;  /* k in [-26, 0]: a normal float */
        float e = p * two_k.f;
        float far = (1.0f - e) / (1.0f + e);
        /* tanh t = t (1 - t^2/3 + 2t^4/15 - ...): the Taylor series to t^19, 2^2n (2^2n - 1) B_2n / (2n)! */
        float t2 = t * t;
        float q = -443861162.0f / 1856156927625.0f;
        q = q * t2 + 6404582.0f / 10854718875.0f;
        q = q * t2 - 929569.0f / 638512875.0f;
        q = q * t2 + 21844.0f / 6081075.0f;
        q = q * t2 - 1382.0f / 155925.0f;
        q = q * t2 + 62.0f / 2835.0f;
        q = q * t2 - 17.0f / 315.0f;
        q = q * t2 + 2.0f / 15.0f;
        q = q * t2 - 1.0f / 3.0f;
        q = q * t2 + 1.0f;
        float res = t < 0.55f ? t * q : far;
        res = t == t ? res : v;  /* NaN in, NaN out */
        x[i] = copysignf(res, v);  /* odd, -0 included */
    }
}

/* blocks of n contiguous floats, stride apart (a step's slice [N, B, S] of a [N, T, B, S] buffer) */
void dl_tanh_f32(int64_t blocks, int64_t n, int64_t stride, float* x) {
    for (int64_t j = 0; j < blocks; j++) tanh_run(n, x + j * stride);
}
