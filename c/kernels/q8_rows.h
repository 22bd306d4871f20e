/* The driver the SIMD int8-activation files share (kernels/avx2/q8_avx2.c, q8_iq_avx2.c,
 * q8_fp4_avx2.c, kernels/avx512/q8_avx512vnni.c, q8_iq_avx512vnni.c, q8_fp4_avx512vnni.c): per token, and per pass of at most xp_max
 * columns, x is prepared once in the file's own layout (prep), then the rows run n at a time
 * (group) and the last ones singly (one).  A row's result does not depend on its grouping. */
#ifndef MG_Q8_ROWS_H
#define MG_Q8_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include "core/kernels.h"
#include "core/matrix.h"
#include "core/q8_act.h"

/* x's codes q, scales dx and sums sx (per 32) of kc columns, prepared for format f into x (the
 * calling file's prep_x). */
typedef void mg_q8_prep_fn(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t kc, void *x);
/* Rows at p, rb bytes apart, nb blocks each, against the prepared x: their sums added to out[]. */
typedef void mg_q8_rows_fn(const uint8_t *p, size_t rb, int64_t nb, const void *x, float *out);

static inline __attribute__((always_inline)) void
mg_q8_drive_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                 int64_t r1, int64_t xp_max, mg_q8_prep_fn *prep, void *x, mg_q8_rows_fn *group, int n,
                 mg_q8_rows_fn *one) {
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32;
    for (int64_t t = 0; t < n_tok; t++) {
        float *yt = y + t * y_stride;
        for (int64_t r = r0; r < r1; r++) yt[r] = 0.0f;
        for (int64_t c0 = 0; c0 < w->cols; c0 += xp_max) {
            const int64_t kc = w->cols - c0 < xp_max ? w->cols - c0 : xp_max;
            prep(w->format, xq->q + t * xq->cols + c0, xq->d + t * groups + c0 / 32, xq->s + t * groups + c0 / 32, kc,
                 x);
            const uint8_t *base = (const uint8_t *)w->data + (size_t)(c0 / e * bytes);
            int64_t r = r0;
            for (; r + n <= r1; r += n) group(base + (size_t)r * rb, rb, kc / e, x, yt + r);
            for (; r < r1; r++) one(base + (size_t)r * rb, rb, kc / e, x, yt + r);
        }
    }
}

/* mg_q8_drive_rows for matrices whose scales live in an array of their own (native FP4: one
 * ue8m0 byte per 32 columns, w->scale, kernels/q8_fp4.h): x prepared from its codes and scales
 * (prep_s), rows given their scale bytes too (sb apart), ng = groups of 32 per pass. */
typedef void mg_q8_prep_s_fn(const int8_t *q, const float *dx, int64_t kc, void *x);
typedef void mg_q8_rows_s_fn(const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng, const void *x,
                             float *out);

static inline __attribute__((always_inline)) void
mg_q8_drive_rows_scaled(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1, int64_t xp_max, mg_q8_prep_s_fn *prep, void *x,
                        mg_q8_rows_s_fn *group, int n, mg_q8_rows_s_fn *one) {
    const size_t rb = mg_matrix_row_bytes(w), sb = (size_t)w->scale_cols;
    const int64_t groups = w->cols / 32;
    for (int64_t t = 0; t < n_tok; t++) {
        float *yt = y + t * y_stride;
        for (int64_t r = r0; r < r1; r++) yt[r] = 0.0f;
        for (int64_t c0 = 0; c0 < w->cols; c0 += xp_max) {
            const int64_t kc = w->cols - c0 < xp_max ? w->cols - c0 : xp_max;
            prep(xq->q + t * xq->cols + c0, xq->d + t * groups + c0 / 32, kc, x);
            const uint8_t *p = (const uint8_t *)w->data + (size_t)(c0 * (int64_t)rb / w->cols);
            const uint8_t *s = (const uint8_t *)w->scale + c0 / 32;
            int64_t r = r0;
            for (; r + n <= r1; r += n) group(p + (size_t)r * rb, rb, s + (size_t)r * sb, sb, kc / 32, x, yt + r);
            for (; r < r1; r++) one(p + (size_t)r * rb, rb, s + (size_t)r * sb, sb, kc / 32, x, yt + r);
        }
    }
}

/* The two table entries (mg_linear_q8_fn) of TO, an int8 entry whose last argument is where its
 * row loops prefetch (kernels/prefetch_rows.h), and NAME(prefetch_l2), which returns the one for
 * mg_cpu_features.prefetch_l2. */
#define MG_Q8_PREFETCH_ENTRIES(NAME, TO)                                                               \
    static void TO##_l1(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, \
                        int64_t r0, int64_t r1) {                                                      \
        TO(w, xq, n_tok, y, y_stride, r0, r1, 0);                                                      \
    }                                                                                                  \
    static void TO##_l2(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, \
                        int64_t r0, int64_t r1) {                                                      \
        TO(w, xq, n_tok, y, y_stride, r0, r1, 1);                                                      \
    }                                                                                                  \
    mg_linear_q8_fn NAME(int prefetch_l2) { return prefetch_l2 ? TO##_l2 : TO##_l1; }

/* The entries (as MG_Q8_PREFETCH_ENTRIES) of an int8 GEMM's table entry: GEMM (mg_linear_q8_fn)
 * from MIN_TOK(format) tokens on, the row loops ROWS (with the prefetch argument) below. */
#define MG_Q8_GEMM_ENTRIES(NAME, MIN_TOK, GEMM, ROWS)                                                   \
    static void NAME##_to(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, \
                          int64_t r0, int64_t r1, int l2) {                                              \
        if (n_tok >= MIN_TOK(w->format))                                                                 \
            GEMM(w, xq, n_tok, y, y_stride, r0, r1);                                                     \
        else                                                                                             \
            ROWS(w, xq, n_tok, y, y_stride, r0, r1, l2);                                                 \
    }                                                                                                    \
    MG_Q8_PREFETCH_ENTRIES(NAME, NAME##_to)

#endif
