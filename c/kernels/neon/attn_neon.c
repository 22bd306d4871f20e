/* NEON attention block products and softmax (core/kernels.h), the avx2 plan at 128 bits: where
 * the neon table had none, attention looped a dot per (query, key) pair, each with its own
 * horizontal sum, and an axpy per (head, value row) that loaded and stored its output row, and
 * the softmax took expf per score.
 *  - Scores: a tile of four query rows x four key rows keeps its dot products in 16 accumulators
 *    (8 loads per 16 FMAs) and reduces each with the same pairwise tree; a last part of the row
 *    (dim not a multiple of 4) is read zero-padded, so that a pair's score depends on nothing
 *    but its two rows.
 *  - Values: a tile of four output rows x 16 columns stays in registers across the block of
 *    rows (16 accumulators, 4 value vectors and the 4 probabilities per row).  Per output lane
 *    the products go in row order from the loaded output, fused where mg_neon_axpy fuses them
 *    (its lanes in whole vectors) and multiplied, then added, in the last dim % 4 columns, as its
 *    scalar tail does: bit for bit a loop of mg_neon_axpy (tests/c/test_kernels.c).
 *  - Softmax: three passes, e^x from kernels/exp_poly.h's polynomial four lanes at a time
 *    (within 2 ulp of expf). */
#include <math.h>
#include <string.h>
#include "kernels/exp_poly.h"
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

/* Lane j: the sum of a_j's four lanes ((l0 + l1) + (l2 + l3)), for every j alike. */
ALWAYS_INLINE float32x4_t lane_sums4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3) {
    return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
}

/* Four floats of p from column d of a row of dim: in place when they exist, else zero-padded. */
ALWAYS_INLINE float32x4_t load_part(const float *p, int64_t d, int64_t dim) {
    if (d + 4 <= dim) return vld1q_f32(p + d);
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(t, p + d, sizeof(float) * (size_t)(dim - d));
    return vld1q_f32(t);
}

/* Scores of the R <= 4 query rows q + i * qs against the nk <= 4 key rows k + j * ks (rows past
 * nk repeat the last, unstored) into s + i * ss. */
ALWAYS_INLINE void scores_tile(const float *q, int64_t qs, const float *k, int64_t ks, int nk, int64_t dim,
                               float scale, float *s, int64_t ss, const int R) {
    const float *kr[4];
    for (int j = 0; j < 4; j++) kr[j] = k + (j < nk ? j : nk - 1) * ks;
    float32x4_t acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = vdupq_n_f32(0.0f);
    for (int64_t d = 0; d < dim; d += 4) {
        float32x4_t x[4];
        for (int i = 0; i < R; i++) x[i] = load_part(q + i * qs, d, dim);
        for (int j = 0; j < 4; j++) {
            const float32x4_t kv = load_part(kr[j], d, dim);
            for (int i = 0; i < R; i++) acc[i][j] = vfmaq_f32(acc[i][j], x[i], kv);
        }
    }
    const float32x4_t sc = vdupq_n_f32(scale);
    for (int i = 0; i < R; i++) {
        const float32x4_t r = vmulq_f32(lane_sums4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]), sc);
        if (nk == 4) {
            vst1q_f32(s + i * ss, r);
        } else {
            float out[4];
            vst1q_f32(out, r);
            memcpy(s + i * ss, out, sizeof(float) * (size_t)nk);
        }
    }
}

ALWAYS_INLINE void scores_rows(const float *q, int64_t qs, const float *k, int64_t ks, int64_t n, int64_t dim,
                               float scale, float *s, int64_t ss, const int R) {
    for (int64_t j = 0; j < n; j += 4)
        scores_tile(q, qs, k + j * ks, ks, n - j < 4 ? (int)(n - j) : 4, dim, scale, s + j, ss, R);
}

void mg_neon_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                         int64_t dim, float scale, float *s, int64_t s_stride) {
    int i = 0;
#define ROWS(R) scores_rows(q + i * q_stride, q_stride, k, k_stride, n, dim, scale, s + i * s_stride, s_stride, R)
    for (; i + 4 <= m; i += 4) ROWS(4);
    if (i + 2 <= m) ROWS(2), i += 2;
    if (i < m) ROWS(1);
#undef ROWS
}

/* Columns [0, 4 * C) of the R output rows o + i * os += sum over rows j < n of p[i * ps + j] * v_j
 * (C <= 4 whole vectors). */
ALWAYS_INLINE void values_tile(float *o, int64_t os, const float *p, int64_t ps, const float *v, int64_t vs, int64_t n,
                               const int R, const int C) {
    float32x4_t acc[4][4];
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) acc[i][c] = vld1q_f32(o + i * os + 4 * c);
    for (int64_t j = 0; j < n; j++) {
        float32x4_t x[4];
        for (int c = 0; c < C; c++) x[c] = vld1q_f32(v + j * vs + 4 * c);
        for (int i = 0; i < R; i++) {
            const float w = p[i * ps + j];
            for (int c = 0; c < C; c++) acc[i][c] = vfmaq_n_f32(acc[i][c], x[c], w);
        }
    }
    for (int i = 0; i < R; i++)
        for (int c = 0; c < C; c++) vst1q_f32(o + i * os + 4 * c, acc[i][c]);
}

/* R output rows: columns by 16, then the whole vectors left, then the last dim % 4 columns as
 * mg_neon_axpy's scalar tail computes them (a product rounded, then added). */
ALWAYS_INLINE void values_rows(float *o, int64_t os, const float *p, int64_t ps, const float *v, int64_t vs, int64_t n,
                               int64_t dim, const int R) {
    const int64_t whole = dim & ~(int64_t)3;
    int64_t d = 0;
    for (; d + 16 <= whole; d += 16) values_tile(o + d, os, p, ps, v + d, vs, n, R, 4);
    switch ((whole - d) / 4) {
    case 3: values_tile(o + d, os, p, ps, v + d, vs, n, R, 3); break;
    case 2: values_tile(o + d, os, p, ps, v + d, vs, n, R, 2); break;
    case 1: values_tile(o + d, os, p, ps, v + d, vs, n, R, 1); break;
    default: break;
    }
    for (int i = 0; i < R; i++)
        for (int64_t j = 0; j < n; j++)
            for (int64_t c = whole; c < dim; c++) {
                const float prod = p[i * ps + j] * v[j * vs + c];
                o[i * os + c] += prod;
            }
}

void mg_neon_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                         int64_t v_stride, int64_t n, int64_t dim) {
    int i = 0;
#define ROWS(R) values_rows(o + i * o_stride, o_stride, p + i * p_stride, p_stride, v, v_stride, n, dim, R)
    for (; i + 4 <= m; i += 4) ROWS(4);
    if (i + 2 <= m) ROWS(2), i += 2;
    if (i < m) ROWS(1);
#undef ROWS
}

/* e^x per lane (kernels/exp_poly.h): the avx2 exp8's steps at 128 bits. */
ALWAYS_INLINE float32x4_t exp4(float32x4_t x) {
    /* clamped; a NaN stays NaN (vminq / vmaxq propagate it, and it stays through the rest) */
    x = vminq_f32(vdupq_n_f32(MG_EXP_HI), vmaxq_f32(vdupq_n_f32(MG_EXP_LO), x));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(MG_EXP_LOG2E)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(MG_EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(MG_EXP_LN2_LO));
    float32x4_t pv = vdupq_n_f32(MG_EXP_P0);
    pv = vfmaq_f32(vdupq_n_f32(MG_EXP_P1), pv, r);
    pv = vfmaq_f32(vdupq_n_f32(MG_EXP_P2), pv, r);
    pv = vfmaq_f32(vdupq_n_f32(MG_EXP_P3), pv, r);
    pv = vfmaq_f32(vdupq_n_f32(MG_EXP_P4), pv, r);
    pv = vfmaq_f32(vdupq_n_f32(MG_EXP_P5), pv, r);
    pv = vaddq_f32(vfmaq_f32(r, pv, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    const int32x4_t k = vcvtq_s32_f32(n), k1 = vshrq_n_s32(k, 1), k2 = vsubq_s32(k, k1), bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k1, bias), 23)),
                      s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(k2, bias), 23));
    return vmulq_f32(vmulq_f32(pv, s1), s2);
}

/* Three passes over the row (in L1): the max, e^(x_j - max) stored and summed per lane, the
 * scaling by 1 / sum; the last n % 4 through a zero-padded copy. */
void mg_neon_softmax(float *x, int64_t n, float sink) {
    const int64_t nf = n & ~(int64_t)3, nt = n - nf;
    float t[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    memcpy(t, x + nf, sizeof(float) * (size_t)nt);
    float32x4_t mv = vdupq_n_f32(sink);
    /* max(x_j, m): x_j > m ? x_j : m, so that a NaN x_j is skipped as in the scalar loop */
#define MAX_STEP(V)                                  \
    {                                                \
        const float32x4_t xv = (V);                  \
        mv = vbslq_f32(vcgtq_f32(xv, mv), xv, mv);   \
    }
    for (int64_t j = 0; j < nf; j += 4) MAX_STEP(vld1q_f32(x + j))
    MAX_STEP(vld1q_f32(t))
#undef MAX_STEP
    float lanes[4];
    vst1q_f32(lanes, mv);
    float mx = lanes[0];
    for (int l = 1; l < 4; l++) mx = lanes[l] > mx ? lanes[l] : mx;
    const float32x4_t mxv = vdupq_n_f32(mx);
    /* the sink's term in lane 0 (0 without a sink) */
    float32x4_t sum = vsetq_lane_f32(vgetq_lane_f32(exp4(vdupq_n_f32(sink - mx)), 0), vdupq_n_f32(0.0f), 0);
    for (int64_t j = 0; j < nf; j += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + j), mxv));
        vst1q_f32(x + j, e);
        sum = vaddq_f32(sum, e);
    }
    if (nt) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(t), mxv)); /* the padding: e^-inf = 0 */
        vst1q_f32(t, e);
        memcpy(x + nf, t, sizeof(float) * (size_t)nt);
        sum = vaddq_f32(sum, e);
    }
    const float32x4_t inv = vdupq_n_f32(1.0f / vaddvq_f32(sum));
    for (int64_t j = 0; j < nf; j += 4) vst1q_f32(x + j, vmulq_f32(vld1q_f32(x + j), inv));
    for (int64_t j = nf; j < n; j++) x[j] *= vgetq_lane_f32(inv, 0);
}
#endif
