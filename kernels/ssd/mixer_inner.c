/* dynlab Mamba-2 mixer between its projections, CPU: the order in which mixer_inner.py's op runs
   the C loops of three other libraries (short_conv.c, ssd_chunk.c, gated_norm.c), whose functions
   it receives as pointers.  Run one after the other over all of a stack's sequences, each loop
   streams the activations the previous one wrote through memory; here they run block by block of
   `blk` sequences of one member, so that a block's intermediates stay in cache between them.
   Every loop sums what it sums per sequence, and the tap, bias and weight gradients accumulate in
   memory sequence after sequence in the same order as over the whole stack, so the numbers are
   those of the three loops run one after the other.
   Layouts (contiguous): zx, gzx [E, B, T, W] (W = H·P + C + H, C = H·P + 2N: z | x B C | dt);
   post [E, B, T, C] (silu(conv(x B C))); dt [E·B, T, H]; a_rows [E·B, H]; y, gy [E·B, T, H·P];
   out, gout [E, B, T, H·P]; conv_w, gconv_w [E, K, C]; conv_b, gconv_b [E, C] (null: none);
   d_rep, norm_w and their gradients [E, H·P]; gdt [E·B, T, H]; ga [E·B, H].  The backward keeps
   y's and post's gradients in its own [blk, T, ·] scratch; it accumulates into gconv_w, gconv_b,
   gd_rep and gnorm_w, which must be zeroed.
   Return: 0; 1, 2 or 3 when the convolution's, the scan's or the norm's loop could not
   allocate its buffers; 4 when the backward's scratch could not be allocated. */
#include <stdint.h>
#include <stdlib.h>

#define INNER_KERNELS(T, SUF)                                                                      \
typedef int (*dl_m2_scf_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const T *,    \
                               const T *, const T *, const T *, T *);                              \
typedef int (*dl_m2_scb_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                               const T *, const T *, const T *, const T *, const T *, T *, T *,    \
                               T *, T *);                                                          \
typedef int (*dl_m2_ssdf_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,     \
                                int64_t, const T *, const T *, const T *, const T *, const T *,    \
                                T *, T *);                                                         \
typedef int (*dl_m2_ssdb_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,     \
                                int64_t, int64_t, int64_t, int64_t, int64_t, const T *, const T *, \
                                const T *, const T *, const T *, const T *, const T *, const T *,  \
                                T *, T *, T *, T *, T *);                                          \
typedef int (*dl_m2_gnf_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,       \
                               const T *, const T *, const T *, const T *, const T *, T *);        \
typedef int (*dl_m2_gnb_##SUF)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                               int64_t, double, const T *, const T *, const T *, const T *,        \
                               const T *, const T *, T *, T *, T *, T *, T *);                     \
                                                                                                   \
int dl_m2i_fwd_##SUF(const void *scf, const void *ssdf, const void *gnf, int64_t ne, int64_t nb,   \
                     int64_t nt, int64_t nh, int64_t np, int64_t nn, int64_t nk, int64_t blk,      \
                     double eps, const T *zx, const T *conv_w, const T *conv_b, const T *dt,       \
                     const T *a_rows, const T *d_rep, const T *norm_w, T *post, T *y, T *out) {    \
    const int64_t di = nh * np, cc = di + 2 * nn, w = di + cc + nh;                                \
    for (int64_t e = 0; e < ne; e++)                                                               \
        for (int64_t b0 = 0; b0 < nb; b0 += blk) {                                                 \
            const int64_t nbk = nb - b0 < blk ? nb - b0 : blk, seq = e * nb + b0;                  \
            const T *zs = zx + seq * nt * w;                                                       \
            T *ps = post + seq * nt * cc, *ys = y + seq * nt * di;                                 \
            if (((dl_m2_scf_##SUF)scf)(1, nbk, nt, cc, nk, w, zs + di, NULL, conv_w + e * nk * cc, \
                                       conv_b ? conv_b + e * cc : NULL, ps))                       \
                return 1;                                                                          \
            if (((dl_m2_ssdf_##SUF)ssdf)(nbk, nt, nh, np, nn, cc, cc, cc, ps, dt + seq * nt * nh,  \
                                         a_rows + seq * nh, ps + di, ps + di + nn, ys, NULL))      \
                return 2;                                                                          \
            if (((dl_m2_gnf_##SUF)gnf)(1, nbk * nt, di, di, w, cc, eps, ys, zs, ps, d_rep + e * di, \
                                       norm_w + e * di, out + seq * nt * di))                      \
                return 3;                                                                          \
        }                                                                                          \
    return 0;                                                                                      \
}                                                                                                  \
                                                                                                   \
int dl_m2i_bwd_##SUF(const void *gnb, const void *ssdb, const void *scb, int64_t ne, int64_t nb,   \
                     int64_t nt, int64_t nh, int64_t np, int64_t nn, int64_t nk, int64_t blk,      \
                     double eps, const T *zx, const T *conv_w, const T *conv_b, const T *post,     \
                     const T *dt, const T *a_rows, const T *y, const T *d_rep, const T *norm_w,    \
                     const T *gout, T *gzx, T *gdt, T *ga, T *gd_rep, T *gnorm_w, T *gconv_w,      \
                     T *gconv_b) {                                                                 \
    const int64_t di = nh * np, cc = di + 2 * nn, w = di + cc + nh;                                \
    const int64_t rows = (nb < blk ? nb : blk) * nt;                                               \
    T *gps = (T *)malloc(sizeof(T) * (size_t)(rows * (cc + di) + 1)); /* post's, then y's */      \
    if (!gps) return 4;                                                                            \
    T *gys = gps + rows * cc;                                                                      \
    int status = 0;                                                                                \
    for (int64_t e = 0; e < ne && !status; e++)                                                    \
        for (int64_t b0 = 0; b0 < nb; b0 += blk) {                                                 \
            const int64_t nbk = nb - b0 < blk ? nb - b0 : blk, seq = e * nb + b0;                  \
            const T *zs = zx + seq * nt * w, *ps = post + seq * nt * cc, *ys = y + seq * nt * di;  \
            T *gzs = gzx + seq * nt * w;                                                           \
            /* the norm: z's gradient into gzx, the skip's (D·x) into x's slice of gps */          \
            if (((dl_m2_gnb_##SUF)gnb)(1, nbk * nt, di, di, w, cc, w, cc, eps, ys, zs, ps,         \
                                       d_rep + e * di, norm_w + e * di, gout + seq * nt * di, gys, \
                                       gzs, gps, gd_rep + e * di, gnorm_w + e * di)) {             \
                status = 3;                                                                        \
                break;                                                                             \
            }                                                                                      \
            /* the scan: x's gradient added to the skip's, B's and C's into their slices */        \
            if (((dl_m2_ssdb_##SUF)ssdb)(nbk, nt, nh, np, nn, cc, cc, cc, cc, cc, cc, 1, ps,       \
                                         dt + seq * nt * nh, a_rows + seq * nh, ps + di,           \
                                         ps + di + nn, ys, gys, NULL, gps, gdt + seq * nt * nh,    \
                                         ga + seq * nh, gps + di, gps + di + nn)) {                \
                status = 2;                                                                        \
                break;                                                                             \
            }                                                                                      \
            /* the convolution: x B C's gradient into gzx */                                       \
            if (((dl_m2_scb_##SUF)scb)(1, nbk, nt, cc, nk, w, w, zs + di, NULL,                    \
                                       conv_w + e * nk * cc, conv_b ? conv_b + e * cc : NULL, gps, \
                                       gzs + di, NULL, gconv_w + e * nk * cc,                      \
                                       gconv_b ? gconv_b + e * cc : NULL)) {                       \
                status = 1;                                                                        \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
    free(gps);                                                                                     \
    return status;                                                                                 \
}

INNER_KERNELS(float, f32)
INNER_KERNELS(double, f64)
