/* dynlab single-chunk SSD (Mamba-2's scan of a whole sequence as one chunk), CPU: the LM stacks'
   scan when the training length fits one chunk.  B and C are one per sequence (shared by its
   heads), the initial state is zero.  Layouts: x [G, Q, H·P] with row stride ldx (the step of t;
   heads and channels contiguous); B, C [G, Q, N] with row strides ldb, ldc (slices of a wider
   last dim); dt [G, Q, H], A [G, H] contiguous; outputs and gradients contiguous: y, gy
   [G, Q, H, P]; final, gfinal [G, H, P, N] (final null: not computed); gdt [G, Q, H]; gA [G, H];
   except gx [G, Q, H·P] and gB, gC [G, Q, N], with row strides ldgx, ldgb, ldgc (the backward may
   write them into slices of a wider gradient); with addx the backward adds its gx to what gx holds.
   Per sequence, with c_t = sum_{s<=t} dt_s A (per head; summed in double, as torch's CPU
   cumsum does), u_s = dt_s x_s, S_ts = C_t . B_s and L_ts = exp(c_t - c_s):
       y_t = sum_{s<=t} L_ts S_ts u_s,      final = sum_s exp(c_{Q-1} - c_s) u_s B_s^T.
   Backward (c, S, L and u recomputed, y read back; gfinal null: a zero gradient):
       gu_s = sum_{t>=s} L_ts S_ts gy_t,  gS_ts = sum_h L_ts (gy_t . u_s),
       gc_t = gy_t . y_t - u_t . gu_t (per head: the mask's gradient summed over its rows and columns),
       gC_t = sum_{s<=t} gS_ts B_s,  gB_s = sum_{t>=s} gS_ts C_t,
   with the final state's terms, then gx = gu dt, gdt = gu . x + ga A, gA = sum_s ga_s dt_s,
   ga_s = sum_{t>=s} gc_t.  Both return 0, or 1 when a buffer cannot be allocated. */
#include "dl_prelude.h"  /* dl_expf (float32 exp, about 1 ulp), dl_exp */
#include <stdlib.h>
#include <string.h>

/* Per sequence the work is a few small matrix products, each through one register-blocked
   loop (dl_ssd_mm: a DL_MB x DL_NB block of the result summed in registers), on full [Q, Q]
   matrices whose upper triangle is zero.  Scratch per call: c [Q·H] (then gc), ch [H·Q] (c per
   head), u, v (then gu) [Q·H·P], uT [P·Q], Bt [N·Q], S, W, L, G, gS [Q·Q]. */
#define DL_MB 4
#define DL_NB 16
#define DL_LOWER 1
#define DL_UPPER 2
#define DL_OUT_LOWER 3
#define SSD_KERNELS(T, SUF, EXP)                                                                   \
/* out[m, n] (+)= sum_k A[m am + k ak] B[k bk + n], out row-major with row stride cm.  tri skips   \
   what is zero or not wanted: DL_LOWER  A[m, k] = 0 for k > m;  DL_UPPER  A[m, k] = 0 for k < m;    \
   DL_OUT_LOWER  only out[m, n] with n <= m is wanted (blocks of it wholly above the diagonal are   \
   not written). */                                                                                \
static void dl_ssd_mm_##SUF(int64_t M, int64_t N, int64_t K, const T *A, int64_t am, int64_t ak,  \
                            const T *B, int64_t bk, T *out, int64_t cm, int add, int tri) {        \
    int64_t m0 = 0;                                                                                \
    for (; m0 + DL_MB <= M; m0 += DL_MB) {                                                         \
        int64_t n0 = 0;                                                                            \
        const int64_t k0 = tri == DL_UPPER ? m0 : 0;                                               \
        const int64_t k1 = tri == DL_LOWER && m0 + DL_MB < K ? m0 + DL_MB : K;                     \
        const int64_t n1 = tri == DL_OUT_LOWER && m0 + DL_MB < N ? m0 + DL_MB : N;                 \
        for (; n0 < n1 && n0 + DL_NB <= N; n0 += DL_NB) {                                          \
            T acc[DL_MB][DL_NB];                                                                   \
            for (int i = 0; i < DL_MB; i++)                                                        \
                _Pragma("omp simd") for (int j = 0; j < DL_NB; j++) acc[i][j] = 0;                 \
            for (int64_t k = k0; k < k1; k++) {                                                    \
                const T *br = B + k * bk + n0;                                                     \
                for (int i = 0; i < DL_MB; i++) {                                                  \
                    const T a = A[(m0 + i) * am + k * ak];                                         \
                    _Pragma("omp simd") for (int j = 0; j < DL_NB; j++) acc[i][j] += a * br[j];    \
                }                                                                                  \
            }                                                                                      \
            for (int i = 0; i < DL_MB; i++) {                                                      \
                T *o = out + (m0 + i) * cm + n0;                                                   \
                if (add) { _Pragma("omp simd") for (int j = 0; j < DL_NB; j++) o[j] += acc[i][j]; } \
                else { _Pragma("omp simd") for (int j = 0; j < DL_NB; j++) o[j] = acc[i][j]; }     \
            }                                                                                      \
        }                                                                                          \
        for (; n0 < n1; n0++)                                                                      \
            for (int i = 0; i < DL_MB; i++) {                                                      \
                T acc = 0;                                                                         \
                for (int64_t k = 0; k < K; k++) acc += A[(m0 + i) * am + k * ak] * B[k * bk + n0]; \
                out[(m0 + i) * cm + n0] = add ? out[(m0 + i) * cm + n0] + acc : acc;               \
            }                                                                                      \
    }                                                                                              \
    for (; m0 < M; m0++)                                                                           \
        for (int64_t n = 0; n < N; n++) {                                                          \
            T acc = 0;                                                                             \
            for (int64_t k = 0; k < K; k++) acc += A[m0 * am + k * ak] * B[k * bk + n];            \
            out[m0 * cm + n] = add ? out[m0 * cm + n] + acc : acc;                                 \
        }                                                                                          \
}                                                                                                  \
                                                                                                   \
typedef struct { T *c, *ch, *u, *v, *ut, *bt, *S, *W, *L, *G, *gS; } dl_ssd_scr_##SUF;            \
                                                                                                   \
static T *dl_ssd_alloc_##SUF(int64_t nq, int64_t nh, int64_t np, int64_t nn, dl_ssd_scr_##SUF *w) { \
    const int64_t hp = nh * np;                                                                    \
    T *buf = (T *)malloc(sizeof(T) * (size_t)(2 * nq * nh + 2 * nq * hp + np * nq + nn * nq + 5 * nq * nq)); \
    if (!buf) return 0;                                                                            \
    w->c = buf; w->ch = w->c + nq * nh; w->u = w->ch + nq * nh; w->v = w->u + nq * hp;             \
    w->ut = w->v + nq * hp; w->bt = w->ut + np * nq; w->S = w->bt + nn * nq;                       \
    w->W = w->S + nq * nq; w->L = w->W + nq * nq; w->G = w->L + nq * nq; w->gS = w->G + nq * nq;   \
    return buf;                                                                                    \
}                                                                                                  \
                                                                                                   \
/* c (cumulative log decay, [Q, H] and per head [H, Q]), u = dt x ([Q, H·P]) and S = C B^T */     \
static void dl_ssd_prep_##SUF(int64_t nq, int64_t nh, int64_t np, int64_t nn, int64_t ldx,         \
                              int64_t ldb, int64_t ldc, const T *x, const T *dt, const T *A,       \
                              const T *B, const T *C, dl_ssd_scr_##SUF *w) {                       \
    const int64_t hp = nh * np;                                                                    \
    for (int64_t h = 0; h < nh; h++) {                                                             \
        double acc = 0;                                                                            \
        for (int64_t t = 0; t < nq; t++) {                                                         \
            acc += (double)(dt[t * nh + h] * A[h]);                                                \
            w->c[t * nh + h] = w->ch[h * nq + t] = (T)acc;                                         \
        }                                                                                          \
    }                                                                                              \
    for (int64_t t = 0; t < nq; t++)                                                               \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            const T d = dt[t * nh + h], *xr = x + t * ldx + h * np;                                \
            T *ur = w->u + t * hp + h * np;                                                        \
            _Pragma("omp simd") for (int64_t p = 0; p < np; p++) ur[p] = d * xr[p];                \
        }                                                                                          \
    for (int64_t s = 0; s < nq; s++)                                                               \
        for (int64_t n = 0; n < nn; n++) w->bt[n * nq + s] = B[s * ldb + n];                       \
    dl_ssd_mm_##SUF(nq, nq, nn, C, ldc, 1, w->bt, nq, w->S, nq, 0, DL_OUT_LOWER);                                \
}                                                                                                  \
                                                                                                   \
/* head h's mask L_ts = exp(c_t - c_s) and W = L S (zero above the diagonal) */                    \
static void dl_ssd_mask_##SUF(int64_t nq, int64_t h, dl_ssd_scr_##SUF *w) {                        \
    const T *chh = w->ch + h * nq;                                                                 \
    for (int64_t t = 0; t < nq; t++) {                                                             \
        const T ct = chh[t], *sr = w->S + t * nq;                                                  \
        T *lr = w->L + t * nq, *wr = w->W + t * nq;                                                \
        _Pragma("omp simd") for (int64_t s = 0; s <= t; s++) { lr[s] = EXP(ct - chh[s]); wr[s] = lr[s] * sr[s]; } \
        _Pragma("omp simd") for (int64_t s = t + 1; s < nq; s++) { lr[s] = 0; wr[s] = 0; }        \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
int dl_ssd1_fwd_##SUF(int64_t ng, int64_t nq, int64_t nh, int64_t np, int64_t nn, int64_t ldx,    \
                      int64_t ldb, int64_t ldc, const T *x, const T *dt, const T *A, const T *B,   \
                      const T *C, T *y, T *fin) {                                                  \
    const int64_t hp = nh * np;                                                                    \
    dl_ssd_scr_##SUF w;                                                                            \
    T *buf = dl_ssd_alloc_##SUF(nq, nh, np, nn, &w);                                               \
    if (!buf) return 1;                                                                            \
    for (int64_t g = 0; g < ng; g++) {                                                             \
        const T *xg = x + g * nq * ldx, *Bg = B + g * nq * ldb, *Cg = C + g * nq * ldc;            \
        T *yg = y + g * nq * hp, *fg = fin ? fin + g * hp * nn : NULL;                             \
        dl_ssd_prep_##SUF(nq, nh, np, nn, ldx, ldb, ldc, xg, dt + g * nq * nh, A + g * nh, Bg, Cg, &w); \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            dl_ssd_mask_##SUF(nq, h, &w);                                                          \
            dl_ssd_mm_##SUF(nq, np, nq, w.W, nq, 1, w.u + h * np, hp, yg + h * np, hp, 0, DL_LOWER);         \
            if (!fg) continue; /* the final state is not wanted */                                 \
            const T *chh = w.ch + h * nq, clast = chh[nq - 1];                                     \
            for (int64_t s = 0; s < nq; s++) { /* v_s = exp(c_{Q-1} - c_s) u_s */                  \
                const T e = EXP(clast - chh[s]), *us = w.u + s * hp + h * np;                      \
                T *vs = w.v + s * hp + h * np;                                                     \
                _Pragma("omp simd") for (int64_t p = 0; p < np; p++) vs[p] = e * us[p];            \
            }                                                                                      \
            dl_ssd_mm_##SUF(np, nn, nq, w.v + h * np, 1, hp, Bg, ldb, fg + h * np * nn, nn, 0, 0);    \
        }                                                                                          \
    }                                                                                              \
    free(buf);                                                                                     \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
/* the final state's terms of one sequence and head: gu += e (gF B_s), gB_s += e u_s^T gF,           \
   gc_{Q-1} += ge e, gc_s -= ge e with ge_s = u_s . (gF B_s) */                                    \
static void dl_ssd_final_bwd_##SUF(int64_t nq, int64_t nh, int64_t np, int64_t nn, int64_t ldb,   \
                                   int64_t ldgb, int64_t h, const dl_ssd_scr_##SUF *w, const T *Bg,   \
                                   const T *gf,                                                    \
                                   T *gu, T *gB, T *gc) {                                          \
    const int64_t hp = nh * np;                                                                    \
    const T clast = w->ch[h * nq + nq - 1];                                                        \
    for (int64_t s = 0; s < nq; s++) {                                                             \
        const T e = EXP(clast - w->ch[h * nq + s]), *us = w->u + s * hp + h * np, *bs = Bg + s * ldb; \
        T ge = 0;                                                                                  \
        T *gbs = gB + s * ldgb, *gus = gu + s * hp + h * np;                                       \
        for (int64_t p = 0; p < np; p++) {                                                         \
            const T *fr = gf + (h * np + p) * nn;                                                  \
            T acc = 0;                                                                             \
            _Pragma("omp simd reduction(+:acc)") for (int64_t n = 0; n < nn; n++) acc += fr[n] * bs[n]; \
            ge += us[p] * acc;                                                                     \
            gus[p] += e * acc;                                                                     \
            const T k = e * us[p];                                                                 \
            _Pragma("omp simd") for (int64_t n = 0; n < nn; n++) gbs[n] += k * fr[n];              \
        }                                                                                          \
        gc[(nq - 1) * nh + h] += ge * e;                                                           \
        gc[s * nh + h] -= ge * e;                                                                  \
    }                                                                                              \
}                                                                                                  \
                                                                                                   \
int dl_ssd1_bwd_##SUF(int64_t ng, int64_t nq, int64_t nh, int64_t np, int64_t nn, int64_t ldx,    \
                      int64_t ldb, int64_t ldc, int64_t ldgx, int64_t ldgb, int64_t ldgc,          \
                      int64_t addx, const T *x, const T *dt, const T *A, const T *B,               \
                      const T *C, const T *y, const T *gy, const T *gfin, T *gx, T *gdt, T *gA,    \
                      T *gB, T *gC) {                                                              \
    const int64_t hp = nh * np;                                                                    \
    dl_ssd_scr_##SUF w;                                                                            \
    T *buf = dl_ssd_alloc_##SUF(nq, nh, np, nn, &w);                                               \
    if (!buf) return 1;                                                                            \
    T *gc = w.c, *gu = w.v; /* c [Q, H] is not needed after prep (ch holds it): it takes gc */     \
    for (int64_t g = 0; g < ng; g++) {                                                             \
        const T *xg = x + g * nq * ldx, *Bg = B + g * nq * ldb, *Cg = C + g * nq * ldc;            \
        const T *dtg = dt + g * nq * nh, *Ag = A + g * nh, *gyg = gy + g * nq * hp, *yg = y + g * nq * hp; \
        T *gBg = gB + g * nq * ldgb, *gCg = gC + g * nq * ldgc;                                    \
        dl_ssd_prep_##SUF(nq, nh, np, nn, ldx, ldb, ldc, xg, dtg, Ag, Bg, Cg, &w);                 \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            dl_ssd_mask_##SUF(nq, h, &w);                                                          \
            /* gu_s = sum_t W_ts gy_t;  G_ts = gy_t . u_s;  gS += L G */                           \
            dl_ssd_mm_##SUF(nq, np, nq, w.W, 1, nq, gyg + h * np, hp, gu + h * np, hp, 0, DL_UPPER);         \
            for (int64_t s = 0; s < nq; s++)                                                       \
                for (int64_t p = 0; p < np; p++) w.ut[p * nq + s] = w.u[s * hp + h * np + p];      \
            dl_ssd_mm_##SUF(nq, nq, np, gyg + h * np, hp, 1, w.ut, nq, w.G, nq, 0, DL_OUT_LOWER);                \
            for (int64_t t = 0; t < nq; t++) { /* lower triangle only: G is not formed above it */ \
                T *gr = w.gS + t * nq;                                                             \
                const T *lr = w.L + t * nq, *gg = w.G + t * nq;                                    \
                _Pragma("omp simd") for (int64_t s = 0; s <= t; s++) gr[s] = (h ? gr[s] : 0) + lr[s] * gg[s]; \
                if (!h) { _Pragma("omp simd") for (int64_t s = t + 1; s < nq; s++) gr[s] = 0; }   \
            }                                                                                      \
        }                                                                                          \
        for (int64_t t = 0; t < nq; t++)                                                           \
            for (int64_t h = 0; h < nh; h++) {                                                     \
                const T *gyr = gyg + t * hp + h * np, *yr = yg + t * hp + h * np;                  \
                const T *ur = w.u + t * hp + h * np, *gur = gu + t * hp + h * np;                  \
                T acc = 0;                                                                         \
                _Pragma("omp simd reduction(+:acc)") for (int64_t p = 0; p < np; p++) acc += gyr[p] * yr[p] - ur[p] * gur[p]; \
                gc[t * nh + h] = acc;                                                              \
            }                                                                                      \
        dl_ssd_mm_##SUF(nq, nn, nq, w.gS, nq, 1, Bg, ldb, gCg, ldgc, 0, DL_LOWER);  /* gC = gS B */          \
        dl_ssd_mm_##SUF(nq, nn, nq, w.gS, 1, nq, Cg, ldc, gBg, ldgb, 0, DL_UPPER);  /* gB = gS^T C */        \
        if (gfin)                                                                                  \
            for (int64_t h = 0; h < nh; h++)                                                       \
                dl_ssd_final_bwd_##SUF(nq, nh, np, nn, ldb, ldgb, h, &w, Bg, gfin + g * hp * nn, gu, gBg, gc); \
        T *gxg = gx + g * nq * ldgx, *gdtg = gdt + g * nq * nh, *gAg = gA + g * nh;                \
        for (int64_t h = 0; h < nh; h++) {                                                         \
            T ga = 0, gah = 0;                                                                     \
            for (int64_t s = nq - 1; s >= 0; s--) {                                                \
                ga += gc[s * nh + h];                                                              \
                const T d = dtg[s * nh + h], *xr = xg + s * ldx + h * np, *gus = gu + s * hp + h * np; \
                T *gxr = gxg + s * ldgx + h * np;                                                  \
                T acc = 0;                                                                         \
                if (addx) { _Pragma("omp simd reduction(+:acc)") for (int64_t p = 0; p < np; p++) { acc += gus[p] * xr[p]; gxr[p] += gus[p] * d; } } \
                else { _Pragma("omp simd reduction(+:acc)") for (int64_t p = 0; p < np; p++) { acc += gus[p] * xr[p]; gxr[p] = gus[p] * d; } } \
                gdtg[s * nh + h] = acc + ga * Ag[h];                                               \
                gah += ga * d;                                                                     \
            }                                                                                      \
            gAg[h] = gah;                                                                          \
        }                                                                                          \
    }                                                                                              \
    free(buf);                                                                                     \
    return 0;                                                                                      \
}

SSD_KERNELS(float, f32, dl_expf)
SSD_KERNELS(double, f64, dl_exp)
