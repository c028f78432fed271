
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Real states.  Rows of the tables a, b: [K*H] state-major; C: [K]; ge: [2H] (g then e).
   hs [T, M, K*H], ch [T, M, H], y [T, M, H]; steps [T, M] table rows. */
#define DIAG_KERNELS(T, S)                                                                         \
static void dl_readout_bwd_##S(int64_t h, int64_t nc, const T* z, const T* W, const T* c, const T* g,      \
                               T* ger, T* ggr, T* dy, T* dch) {                                     \
    /* dy = dz_t W; dE += dy; dG += dy * ch_t; dch = dy * g (one row) */                           \
    for (int64_t d = 0; d < h; d++) dy[d] = 0;                                                      \
    for (int64_t q = 0; q < nc; q++) {                                                              \
        const T* w = W + q * h;                                                                     \
        _Pragma("omp simd")                                                                         \
        for (int64_t d = 0; d < h; d++) dy[d] += z[q] * w[d];                                       \
    }                                                                                               \
    _Pragma("omp simd")                                                                             \
    for (int64_t d = 0; d < h; d++) {                                                               \
        ger[d] += dy[d]; ggr[d] += dy[d] * c[d]; dch[d] = dy[d] * g[d];                             \
    }                                                                                               \
}                                                                                                   \
                                                                                                    \
/* One step of one sequence, real states: h_t = a ⊙ h_{t-1} + b (hp, the previous state, may be     \
   ht itself), c = Σ_k C_k h_t[k, :] and y = g ⊙ c + e (y may be c).  The real form's training      \
   forward and its evaluation stream both step through here. */                                     \
static void dl_dt_step_##S(int64_t k, int64_t h, const T* ar, const T* br, const T* cr, const T* g, \
                           const T* e, const T* hp, T* ht, T* c, T* y) {                            \
    for (int64_t q = 0; q < k; q++) {  /* h_t and its readout in one pass */                        \
        const T *aq = ar + q * h, *bq = br + q * h, *pq = hp + q * h;                               \
        T *hq = ht + q * h, w = cr[q];                                                              \
        if (q == 0) {                                                                               \
            _Pragma("omp simd")                                                                     \
            for (int64_t d = 0; d < h; d++) { T v = aq[d] * pq[d] + bq[d]; hq[d] = v; c[d] = w * v; }\
        } else {                                                                                    \
            _Pragma("omp simd")                                                                     \
            for (int64_t d = 0; d < h; d++) { T v = aq[d] * pq[d] + bq[d]; hq[d] = v; c[d] += w * v; }\
        }                                                                                           \
    }                                                                                               \
    _Pragma("omp simd")                                                                             \
    for (int64_t d = 0; d < h; d++) y[d] = g[d] * c[d] + e[d];                                      \
}                                                                                                   \
                                                                                                    \
int dl_dt_fwd_##S(int64_t tl, int64_t m, int64_t k, int64_t h, const int64_t* steps,                \
                  const T* a, const T* b, const T* C, const T* ge, T* hs, T* ch, T* y) {            \
    int64_t s = k * h;                                                                              \
    T* zeros = (T*)calloc((size_t)s, sizeof(T));                                                    \
    if (!zeros) return 1;                                                                           \
    for (int64_t t = 0; t < tl; t++)                                                                \
        for (int64_t i = 0; i < m; i++) {                                                           \
            int64_t r = steps[t * m + i], row = t * m + i;                                          \
            const T* g = ge + r * 2 * h;                                                            \
            const T* hp = t > 0 ? hs + ((t - 1) * m + i) * s : zeros;                               \
            dl_dt_step_##S(k, h, a + r * s, b + r * s, C + r * k, g, g + h, hp, hs + row * s, ch + row * h,\
                           y + row * h);                                                            \
        }                                                                                           \
    free(zeros);                                                                                    \
    return 0;                                                                                       \
}                                                                                                   \
                                                                                                    \
int dl_dt_bwd_##S(int64_t tl, int64_t m, int64_t k, int64_t h, int64_t nc, const int64_t* steps,    \
                  const T* dz, const T* W, const T* a, const T* C, const T* gt, const T* hs,        \
                  const T* ch, T* ga, T* gb, T* gC, T* gg, T* gE) {                                 \
    int64_t s = k * h;                                                                              \
    T* lam = (T*)calloc((size_t)(2 * m * s + 2 * h + s), sizeof(T));                                \
    if (!lam) return 1;                                                                             \
    T *nxt = lam + m * s, *dy = nxt + m * s, *dch = dy + h, *zeros = dch + h;                       \
    for (int64_t t = tl - 1; t >= 0; t--) {                                                         \
        for (int64_t i = 0; i < m; i++) {                                                           \
            int64_t r = steps[t * m + i];                                                           \
            const T *z = dz + (t * m + i) * nc, *c = ch + (t * m + i) * h, *g = gt + r * h;         \
            const T *cr = C + r * k, *ht = hs + (t * m + i) * s;                                    \
            dl_readout_bwd_##S(h, nc, z, W, c, g, gE + r * h, gg + r * h, dy, dch);                 \
            T *L = lam + i * s, *Ln = nxt + i * s, *gbr = gb + r * s, *gar = ga + r * s;              \
            const T* an = t < tl - 1 ? a + steps[(t + 1) * m + i] * s : zeros;                     \
            const T* hp = t > 0 ? hs + ((t - 1) * m + i) * s : zeros;                               \
            for (int64_t q = 0; q < k; q++) {  /* lambda, its sums and dC in one pass */             \
                const T *anq = an + q * h, *lnq = Ln + q * h, *hq = ht + q * h, *pq = hp + q * h;   \
                T *lq = L + q * h, *gbq = gbr + q * h, *gaq = gar + q * h, w = cr[q], acc = 0;       \
                _Pragma("omp simd reduction(+:acc)")                                                \
                for (int64_t d = 0; d < h; d++) {                                                   \
                    T l = w * dch[d] + anq[d] * lnq[d];                                             \
                    lq[d] = l; gbq[d] += l; gaq[d] += l * pq[d]; acc += dch[d] * hq[d];             \
                }                                                                                   \
                gC[r * k + q] += acc;                                                               \
            }                                                                                       \
        }                                                                                           \
        T* sw = lam; lam = nxt; nxt = sw;                                                           \
    }                                                                                               \
    free(lam < nxt ? lam : nxt);                                                                    \
    return 0;                                                                                       \
}                                                                                                   \
                                                                                                    \
/* Complex states, (re, im) interleaved: a, b, C rows [2H]; g [H]; ge [2H]; hs [T, M, 2H]. */       \
int dl_dtc_fwd_##S(int64_t tl, int64_t m, int64_t h, const int64_t* steps, const T* a,             \
                   const T* b, const T* C, const T* ge, T* hs, T* ch, T* y) {                       \
    for (int64_t t = 0; t < tl; t++)                                                                \
        for (int64_t i = 0; i < m; i++) {                                                           \
            int64_t r = steps[t * m + i];                                                           \
            const T *ar = a + r * 2 * h, *br = b + r * 2 * h, *cr = C + r * 2 * h;                  \
            const T *g = ge + r * 2 * h, *e = g + h;                                                \
            T* ht = hs + (t * m + i) * 2 * h;                                                       \
            if (t == 0) memcpy(ht, br, sizeof(T) * (size_t)(2 * h));                               \
            else {                                                                                  \
                const T* hp = hs + ((t - 1) * m + i) * 2 * h;                                       \
                _Pragma("omp simd")                                                                 \
                for (int64_t d = 0; d < h; d++) {                                                   \
                    T pr = hp[2 * d], pi = hp[2 * d + 1], xr = ar[2 * d], xi = ar[2 * d + 1];       \
                    ht[2 * d] = xr * pr - xi * pi + br[2 * d];                                      \
                    ht[2 * d + 1] = xr * pi + xi * pr + br[2 * d + 1];                              \
                }                                                                                   \
            }                                                                                       \
            T *c = ch + (t * m + i) * h, *yy = y + (t * m + i) * h;                                 \
            _Pragma("omp simd")                                                                     \
            for (int64_t d = 0; d < h; d++) {                                                       \
                c[d] = cr[2 * d] * ht[2 * d] - cr[2 * d + 1] * ht[2 * d + 1];                       \
                yy[d] = g[d] * c[d] + e[d];                                                         \
            }                                                                                       \
        }                                                                                           \
    return 0;                                                                                       \
}                                                                                                   \
                                                                                                    \
int dl_dtc_bwd_##S(int64_t tl, int64_t m, int64_t h, int64_t nc, const int64_t* steps,            \
                   const T* dz, const T* W, const T* a, const T* C, const T* gt, const T* hs,       \
                   const T* ch, T* ga, T* gb, T* gC, T* gg, T* gE) {                                \
    T* lam = (T*)calloc((size_t)(4 * m * h + 2 * h), sizeof(T));                                    \
    if (!lam) return 1;                                                                             \
    T *nxt = lam + 2 * m * h, *dy = nxt + 2 * m * h, *dch = dy + h;                                 \
    for (int64_t t = tl - 1; t >= 0; t--) {                                                         \
        for (int64_t i = 0; i < m; i++) {                                                           \
            int64_t r = steps[t * m + i];                                                           \
            const T *z = dz + (t * m + i) * nc, *c = ch + (t * m + i) * h, *g = gt + r * h;         \
            const T *cr = C + r * 2 * h, *ht = hs + (t * m + i) * 2 * h;                            \
            dl_readout_bwd_##S(h, nc, z, W, c, g, gE + r * h, gg + r * h, dy, dch);                 \
            T *L = lam + i * 2 * h, *Ln = nxt + i * 2 * h;                                          \
            const T* an = t < tl - 1 ? a + steps[(t + 1) * m + i] * 2 * h : 0;                     \
            T *gCr = gC + r * 2 * h, *gbr = gb + r * 2 * h, *gar = ga + r * 2 * h;                  \
            const T* hp = t > 0 ? hs + ((t - 1) * m + i) * 2 * h : 0;                               \
            for (int64_t d = 0; d < h; d++) {                                                       \
                T lr = cr[2 * d] * dch[d], li = -cr[2 * d + 1] * dch[d];  /* dch * conj(C) */      \
                if (an) {  /* + conj(a[t+1]) * lam[t+1] */                                           \
                    T xr = an[2 * d], xi = an[2 * d + 1], nr = Ln[2 * d], ni = Ln[2 * d + 1];       \
                    lr += xr * nr + xi * ni; li += xr * ni - xi * nr;                               \
                }                                                                                   \
                L[2 * d] = lr; L[2 * d + 1] = li;                                                   \
                gCr[2 * d] += dch[d] * ht[2 * d]; gCr[2 * d + 1] -= dch[d] * ht[2 * d + 1];         \
                gbr[2 * d] += lr; gbr[2 * d + 1] += li;                                             \
                if (hp) {  /* lam * conj(h[t-1]) */                                                  \
                    T pr = hp[2 * d], pi = hp[2 * d + 1];                                           \
                    gar[2 * d] += lr * pr + li * pi; gar[2 * d + 1] += li * pr - lr * pi;           \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        T* sw = lam; lam = nxt; nxt = sw;                                                           \
    }                                                                                               \
    free(lam < nxt ? lam : nxt);                                                                    \
    return 0;                                                                                       \
}                                                                                                   \
                                                                                                    \
/* Forward only, from a given state: one sequence at a time (its state row stays in cache for   \
   all T steps).  tok [M, T]; state [M, K*H] state-major (in: h_{-1}, out: h_{T-1}); each of the  \
   outputs may be NULL: logits z [M, T, nc], states hs [M, T, H*K] in the cell's layout,          \
   readout features ys [M, T, H]. */                                                             \
static void dl_logits_row_##S(int64_t h, int64_t nc, const T* y, const T* W, const T* cb, T* z) { \
    for (int64_t q = 0; q < nc; q++) {                                                              \
        const T* w = W + q * h;                                                                     \
        T acc = 0;                                                                                  \
        _Pragma("omp simd reduction(+:acc)")                                                        \
        for (int64_t d = 0; d < h; d++) acc += w[d] * y[d];                                         \
        z[q] = acc + cb[q];                                                                         \
    }                                                                                               \
}                                                                                                   \
                                                                                                    \
int dl_dt_stream_##S(int64_t tl, int64_t m, int64_t k, int64_t h, int64_t nc, const int64_t* tok,   \
                     const T* a, const T* b, const T* C, const T* ge, const T* W, const T* cb,      \
                     T* state, T* z, T* hs, T* ys) {                                                \
    int64_t s = k * h;                                                                              \
    T* y = (T*)malloc(sizeof(T) * (size_t)(h > 0 ? h : 1));                                         \
    if (!y) return 1;                                                                               \
    for (int64_t i = 0; i < m; i++) {                                                               \
        T* hr = state + i * s;                                                                      \
        for (int64_t t = 0; t < tl; t++) {                                                          \
            int64_t r = tok[i * tl + t];                                                            \
            const T* g = ge + r * 2 * h;                                                            \
            dl_dt_step_##S(k, h, a + r * s, b + r * s, C + r * k, g, g + h, hr, hr, y, y);  /* in place */\
            if (z) dl_logits_row_##S(h, nc, y, W, cb, z + (i * tl + t) * nc);                       \
            if (ys) memcpy(ys + (i * tl + t) * h, y, sizeof(T) * (size_t)h);                        \
            if (hs) {  /* the cell's layout [H, K] */                                               \
                T* o = hs + (i * tl + t) * s;                                                       \
                for (int64_t q = 0; q < k; q++)                                                     \
                    for (int64_t d = 0; d < h; d++) o[d * k + q] = hr[q * h + d];                   \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
    free(y);                                                                                        \
    return 0;                                                                                       \
}                                                                                                   \
                                                                                                    \
/* The same for complex states: state [M, 2H] (re, im) interleaved. */                            \
int dl_dtc_stream_##S(int64_t tl, int64_t m, int64_t h, int64_t nc, const int64_t* tok,            \
                      const T* a, const T* b, const T* C, const T* ge, const T* W, const T* cb,     \
                      T* state, T* z, T* hs, T* ys) {                                               \
    T* y = (T*)malloc(sizeof(T) * (size_t)(h > 0 ? h : 1));                                        \
    if (!y) return 1;                                                                               \
    for (int64_t i = 0; i < m; i++) {                                                               \
        T* hr = state + i * 2 * h;                                                                  \
        for (int64_t t = 0; t < tl; t++) {                                                          \
            int64_t r = tok[i * tl + t];                                                            \
            const T *ar = a + r * 2 * h, *br = b + r * 2 * h, *cr = C + r * 2 * h;                  \
            const T *g = ge + r * 2 * h, *e = g + h;                                                \
            _Pragma("omp simd")                                                                     \
            for (int64_t d = 0; d < h; d++) {                                                       \
                T pr = hr[2 * d], pi = hr[2 * d + 1], xr = ar[2 * d], xi = ar[2 * d + 1];           \
                T nr = xr * pr - xi * pi + br[2 * d], ni = xr * pi + xi * pr + br[2 * d + 1];       \
                hr[2 * d] = nr; hr[2 * d + 1] = ni;                                                 \
                y[d] = g[d] * (cr[2 * d] * nr - cr[2 * d + 1] * ni) + e[d];                         \
            }                                                                                       \
            if (z) dl_logits_row_##S(h, nc, y, W, cb, z + (i * tl + t) * nc);                       \
            if (ys) memcpy(ys + (i * tl + t) * h, y, sizeof(T) * (size_t)h);                        \
            if (hs) memcpy(hs + (i * tl + t) * 2 * h, hr, sizeof(T) * (size_t)(2 * h));             \
        }                                                                                           \
    }                                                                                               \
    free(y);                                                                                        \
    return 0;                                                                                       \
}

DIAG_KERNELS(float, f32)
DIAG_KERNELS(double, f64)
