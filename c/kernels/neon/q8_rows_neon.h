/* The neon table's int8-activation rows (core/q8_act.h; arithmetic and scalar twin:
 * kernels/scalar/q8_scalar.c), included by two files so that they are built twice: for the
 * baseline by ggml_neon.c (mg_neon_linear_q8) and with the dot-product extension by
 * q8_gemm_neondot.c (its entry's rows below the GEMM's token count), where sdot16 becomes one
 * sdot instead of four widening instructions.  Include only from the NEON kernel files, after
 * kernels/neon/neon.h; defines the file-local neon_q8_rows. */
#ifndef MG_KERNELS_NEON_Q8_ROWS_NEON_H
#define MG_KERNELS_NEON_Q8_ROWS_NEON_H

#include <stdlib.h>
#include "kernels/neon/neon.h"
#include "kernels/neon/ggml_codes.h"
#include "kernels/scalar/scalar.h"
#include "kernels/q8_fp4.h"
#include "core/ggml_blocks.h"

/* The same int8 code registers as ggml_neon.c's fp32 decode, dotted with x's int8 codes in integers:
 * sdot (vdotq_s32: 16 products into 4 i32 lanes) where the compiler targets the dot-product
 * extension (__ARM_FEATURE_DOTPROD, e.g. -march=armv8.2-a+dotprod), else widening multiplies
 * (vmull_s8, products < 2^15) added pairwise into the i32 lanes (vpadalq_s16): the same exact
 * sums either way.  NEON's dot is signed x signed, so no sign trick: K-quant codes (0..31) are
 * non-negative int8 already (Q4_1 / Q5_1 / Q2_K codes too).  Each 32-column group's 4 lanes are
 * converted and multiplied by wd * dx once; Q6_K's and Q3_K's per-16 integer scales (Q2_K's
 * 4-bit ones) multiply its two halves' lanes first (exact).  Q2_K's mins are per 16 columns, finer
 * than the per-32 sums sx: its integer min term sum_h m_h * sum_l qx is one more dot, of qx with
 * m_h broadcast, scaled by dmin * dx. */

ALWAYS_INLINE int32x4_t sdot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    return vpadalq_s16(vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b))), vmull_high_s8(a, b));
#endif
}
ALWAYS_INLINE int32x4_t sdot32(codes32 c, const int8_t *q) {
    return sdot16(sdot16(vdupq_n_s32(0), c.v[0], vld1q_s8(q)), c.v[1], vld1q_s8(q + 16));
}

/* sum over the two 16-element halves of k_h * (codes . q): a Q6_K / Q3_K / Q2_K group's isum. */
ALWAYS_INLINE int32x4_t sdot32_k(codes32 c, const int8_t *q, int k0, int k1) {
    const int32x4_t a = sdot16(vdupq_n_s32(0), c.v[0], vld1q_s8(q));
    const int32x4_t b = sdot16(vdupq_n_s32(0), c.v[1], vld1q_s8(q + 16));
    return vmlaq_n_s32(vmulq_n_s32(a, k0), b, k1);
}

ALWAYS_INLINE float q8_row(mg_format f, const uint8_t *p, int64_t nb, const int8_t *q, const float *dx, const float *sx) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, accm = acc0;
    switch (f) {
#define CASE32(FMT, BYTES, SCALE, CODES)                                                    \
    case FMT:                                                                               \
        for (int64_t i = 0; i < nb; i++, p += (BYTES), q += 32, dx++) {                     \
            const float32x4_t s = vcvtq_f32_s32(sdot32(CODES, q));                          \
            if (i & 1)                                                                      \
                acc1 = vfmaq_n_f32(acc1, s, (SCALE) * dx[0]);                               \
            else                                                                            \
                acc0 = vfmaq_n_f32(acc0, s, (SCALE) * dx[0]);                               \
        }                                                                                   \
        break;
        MG_NEON_FORMATS32(CASE32)
#undef CASE32
    case MG_Q4_K:
    case MG_Q5_K: {
        const int q5 = f == MG_Q5_K;
        for (int64_t i = 0; i < nb; i++, p += q5 ? 176 : 144, q += 256, dx += 8, sx += 8) {
            float ds[8], dm[8];
            k4_scales(p + 4, f16_at(p), f16_at(p + 2), ds, dm);
            accm = vfmaq_f32(accm, vld1q_f32(dm), vld1q_f32(sx));
            accm = vfmaq_f32(accm, vld1q_f32(dm + 4), vld1q_f32(sx + 4));
            const uint8_t *qs = p + (q5 ? 48 : 16), *qh = q5 ? p + 16 : NULL;
            for (int j = 0; j < 8; j += 2) {
                acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sdot32(codes_k4(qs, qh, j), q + 32 * j)), ds[j] * dx[j]);
                acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(sdot32(codes_k4(qs, qh, j + 1), q + 32 * j + 32)),
                                   ds[j + 1] * dx[j + 1]);
            }
        }
        break;
    }
    case MG_Q6_K:
        for (int64_t i = 0; i < nb; i++, p += 210, q += 256, dx += 8) {
            const float d = f16_at(p + 208);
            const int8_t *sc = (const int8_t *)(p + 192);
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 4; g++) {
                    const int s = 8 * h + 2 * g;
                    const int32x4_t sum = sdot32_k(codes_q6_k(p, h, g), q + 128 * h + 32 * g, sc[s], sc[s + 1]);
                    if (g & 1)
                        acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(sum), d * dx[4 * h + g]);
                    else
                        acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sum), d * dx[4 * h + g]);
                }
        }
        break;
    case MG_IQ4_XS:
        for (int64_t i = 0; i < nb; i++, p += 136, q += 256, dx += 8) {
            float dl[8];
            iq4_xs_scales(p, f16_at(p), dl);
            for (int j = 0; j < 8; j += 2) {
                acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sdot32(nib_lut(p + 8 + 16 * j, MG_IQ4NL_VALUES), q + 32 * j)),
                                   dl[j] * dx[j]);
                acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(sdot32(nib_lut(p + 24 + 16 * j, MG_IQ4NL_VALUES), q + 32 * j + 32)),
                                   dl[j + 1] * dx[j + 1]);
            }
        }
        break;
    case MG_Q4_1:
    case MG_Q5_1: { /* (d * dx) * isum + m * sx; the min term in a scalar: one per 32 weights */
        const int q5 = f == MG_Q5_1;
        float msx = 0.0f;
        for (int64_t i = 0; i < nb; i++, p += q5 ? 24 : 20, q += 32, dx++, sx++) {
            const float32x4_t s = vcvtq_f32_s32(sdot32(q5 ? codes_q5_u(p + 4, p + 8) : nib_u(p + 4), q));
            if (i & 1)
                acc1 = vfmaq_n_f32(acc1, s, f16_at(p) * dx[0]);
            else
                acc0 = vfmaq_n_f32(acc0, s, f16_at(p) * dx[0]);
            msx += f16_at(p + 2) * sx[0];
        }
        return vaddvq_f32(vaddq_f32(acc0, acc1)) + msx;
    }
    case MG_Q2_K:
        for (int64_t i = 0; i < nb; i++, p += 84, q += 256, dx += 8) {
            const float d = f16_at(p + 80), dmin = f16_at(p + 82);
            for (int g = 0; g < 8; g++) {
                const uint8_t s0 = p[2 * g], s1 = p[2 * g + 1];
                const int8_t *qg = q + 32 * g;
                const codes32 mins = {{vdupq_n_s8((int8_t)(s0 >> 4)), vdupq_n_s8((int8_t)(s1 >> 4))}};
                const int32x4_t isum = sdot32_k(codes_q2_k(p, g), qg, s0 & 15, s1 & 15);
                if (g & 1)
                    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(isum), d * dx[g]);
                else
                    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(isum), d * dx[g]);
                accm = vfmaq_n_f32(accm, vcvtq_f32_s32(sdot32(mins, qg)), dmin * dx[g]);
            }
        }
        break;
    case MG_Q3_K:
        for (int64_t i = 0; i < nb; i++, p += 110, q += 256, dx += 8) {
            const float d = f16_at(p + 108);
            int k[16];
            q3_k_scales(p, k);
            for (int g = 0; g < 8; g++) {
                const int32x4_t isum = sdot32_k(codes_q3_k(p, g), q + 32 * g, k[2 * g], k[2 * g + 1]);
                if (g & 1)
                    acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(isum), d * dx[g]);
                else
                    acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(isum), d * dx[g]);
            }
        }
        break;
    default: break;
    }
    return vaddvq_f32(vsubq_f32(vaddq_f32(acc0, acc1), accm));
}

#define Q8_ROW_FOR(NAME, FMT)                                                                                 \
    static float NAME(const uint8_t *p, int64_t nb, const int8_t *q, const float *dx, const float *sx) {     \
        return q8_row(FMT, p, nb, q, dx, sx);                                                                 \
    }
Q8_ROW_FOR(q8_row_q8_0, MG_Q8_0)
Q8_ROW_FOR(q8_row_q4_0, MG_Q4_0)
Q8_ROW_FOR(q8_row_q5_0, MG_Q5_0)
Q8_ROW_FOR(q8_row_q4_k, MG_Q4_K)
Q8_ROW_FOR(q8_row_q5_k, MG_Q5_K)
Q8_ROW_FOR(q8_row_q6_k, MG_Q6_K)
Q8_ROW_FOR(q8_row_mxfp4, MG_MXFP4)
Q8_ROW_FOR(q8_row_iq4_nl, MG_IQ4_NL)
Q8_ROW_FOR(q8_row_iq4_xs, MG_IQ4_XS)
Q8_ROW_FOR(q8_row_q4_1, MG_Q4_1)
Q8_ROW_FOR(q8_row_q5_1, MG_Q5_1)
Q8_ROW_FOR(q8_row_q2_k, MG_Q2_K)
Q8_ROW_FOR(q8_row_q3_k, MG_Q3_K)

/* The grid formats (IQ1 / IQ2 / IQ3) have no int8 rows here: their fp32 rows (iq_neon.c) run on x
 * as the int8 path sees it, code * d per element, which is what the scalar twin multiplies too
 * (same products, another summation order), at the fp32 rows' speed instead of the twin's
 * (13-28x slower on x86).  Formats without fp32 rows, or no memory for x, take the twin. */
static void q8_by_fp32_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                            int64_t r0, int64_t r1) {
    float *xf = mg_neon_ggml_takes(w->format) ? malloc(sizeof(float) * (size_t)xq->cols) : NULL;
    if (!xf) {
        mg_scalar_linear_q8(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    for (int64_t t = 0; t < n_tok; t++) {
        const int8_t *q = xq->q + t * xq->cols;
        const float *d = xq->d + t * (xq->cols / 32);
        for (int64_t c = 0; c < xq->cols; c++) xf[c] = (float)q[c] * d[c / 32];
        mg_neon_linear_ggml(w, xf, xq->cols, 1, y + t * y_stride, y_stride, r0, r1);
    }
    free(xf);
}

/* Native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32, kernels/q8_fp4.h): MXFP4's codes, element 2i
 * in the low nibble of byte i and 2i + 1 in the high one, so the two table lookups are zipped
 * back to element order; the scale bytes live apart, s[g] for group g. */
ALWAYS_INLINE codes32 codes_fp4(const uint8_t *p) {
    const codes32 n = nib_lut(p, MG_MXFP4_VALUES2);
    codes32 c = {{vzip1q_s8(n.v[0], n.v[1]), vzip2q_s8(n.v[0], n.v[1])}};
    return c;
}

static float q8_row_fp4(const uint8_t *p, const uint8_t *s, int64_t ng, const int8_t *q, const float *dx) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    for (int64_t g = 0; g < ng; g++) {
        const float32x4_t v = vcvtq_f32_s32(sdot32(codes_fp4(p + 16 * g), q + 32 * g));
        const float f = mg_q8_fp4_wd(s[g]) * dx[g]; /* the twin's factor */
        if (g & 1)
            acc1 = vfmaq_n_f32(acc1, v, f);
        else
            acc0 = vfmaq_n_f32(acc0, v, f);
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

static void linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                          int64_t r1) {
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb;
        const uint8_t *s = (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols;
        for (int64_t t = 0; t < n_tok; t++)
            y[t * y_stride + r] = q8_row_fp4(p, s, groups, xq->q + t * xq->cols, xq->d + t * groups);
    }
}

static void neon_q8_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                         int64_t r1) {
    if (w->format == MG_FP4_E2M1) { /* only with ue8m0 scales per 32 (mg_matrix_has_q8_path) */
        linear_q8_fp4(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    float (*row)(const uint8_t *, int64_t, const int8_t *, const float *, const float *);
    switch (w->format) {
    case MG_Q8_0: row = q8_row_q8_0; break;
    case MG_Q4_0: row = q8_row_q4_0; break;
    case MG_Q5_0: row = q8_row_q5_0; break;
    case MG_Q4_K: row = q8_row_q4_k; break;
    case MG_Q5_K: row = q8_row_q5_k; break;
    case MG_Q6_K: row = q8_row_q6_k; break;
    case MG_MXFP4: row = q8_row_mxfp4; break;
    case MG_IQ4_NL: row = q8_row_iq4_nl; break;
    case MG_Q4_1: row = q8_row_q4_1; break;
    case MG_Q5_1: row = q8_row_q5_1; break;
    case MG_Q2_K: row = q8_row_q2_k; break;
    case MG_Q3_K: row = q8_row_q3_k; break;
    case MG_IQ4_XS: row = q8_row_iq4_xs; break;
    default:
        q8_by_fp32_rows(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb;
        for (int64_t t = 0; t < n_tok; t++)
            y[t * y_stride + r] = row(p, w->cols / e, xq->q + t * xq->cols, xq->d + t * groups, xq->s + t * groups);
    }
}

#endif
