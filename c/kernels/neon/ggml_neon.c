/* NEON kernels (arm64) for the ggml block formats, twins of the scalar decoder in
 * core/ggml_blocks.h and of c/kernels/avx2/ggml_avx2.c, with the same plan: activations stay
 * fp32; every 32 elements become two int8x16 of signed codes in element order (nibble masks,
 * vqtbl1q_u8 value tables for Q4_0 / IQ4 / MXFP4, masks for the Q5 / Q6 / Q3_K high bits); decode
 * dots them with x (widened to fp32) and multiplies the sub-block's sum by its scale once; the
 * mins (Q4_K, Q5_K, Q4_1, Q5_1 per 32 columns, Q2_K per 16) go through sums of x computed once
 * per call; prefill's blocks are dequantised exactly (bit-equal to the scalar decoder: each value
 * is one rounding of an exact product, and ds*q - dm or d*q + m one FMA with an exact product) by
 * mg_neon_ggml_dequant_block, which linear_neon.c's tiles call.  The IQ1 / IQ2 / IQ3 codebook
 * formats have their own file (iq_neon.c), reached through row_dot_of and the dequant switch. */
#include <stdlib.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"
#include "kernels/scalar/scalar.h"
#include "core/ggml_blocks.h"
#include "kernels/neon/ggml_codes.h" /* the codes, shared with q8_decode_neon.c */
#include "kernels/neon/q8_rows_neon.h"

/* ---- decode ---------------------------------------------------------------------------------- */

/* One row's dot product with x over nb blocks of format f; xs: sums of x per 32 columns (per 16
 * for Q2_K; see x_sum_width). */
ALWAYS_INLINE float row_dot(mg_format f, const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0, accm = acc0;
    switch (f) {
#define CASE32(FMT, BYTES, SCALE, CODES)                                          \
    case FMT:                                                                     \
        for (int64_t i = 0; i < nb; i++, p += (BYTES), x += 32) {                 \
            if (i & 1)                                                            \
                acc1 = vfmaq_n_f32(acc1, dot32(CODES, x), SCALE);                 \
            else                                                                  \
                acc0 = vfmaq_n_f32(acc0, dot32(CODES, x), SCALE);                 \
        }                                                                         \
        break;
        MG_NEON_FORMATS32(CASE32)
#undef CASE32
    case MG_Q4_K:
    case MG_Q5_K: {
        const int q5 = f == MG_Q5_K;
        for (int64_t i = 0; i < nb; i++, p += q5 ? 176 : 144, x += 256, xs += 8) {
            float ds[8], dm[8];
            k4_scales(p + 4, f16_at(p), f16_at(p + 2), ds, dm);
            accm = vfmaq_f32(accm, vld1q_f32(dm), vld1q_f32(xs));
            accm = vfmaq_f32(accm, vld1q_f32(dm + 4), vld1q_f32(xs + 4));
            const uint8_t *qs = p + (q5 ? 48 : 16), *qh = q5 ? p + 16 : NULL;
            for (int j = 0; j < 8; j += 2) {
                acc0 = vfmaq_n_f32(acc0, dot32(codes_k4(qs, qh, j), x + 32 * j), ds[j]);
                acc1 = vfmaq_n_f32(acc1, dot32(codes_k4(qs, qh, j + 1), x + 32 * j + 32), ds[j + 1]);
            }
        }
        break;
    }
    case MG_Q6_K:
        for (int64_t i = 0; i < nb; i++, p += 210, x += 256) {
            const float d = f16_at(p + 208);
            const int8_t *sc = (const int8_t *)(p + 192);
            for (int h = 0; h < 2; h++)
                for (int g = 0; g < 4; g++) {
                    const codes32 c = codes_q6_k(p, h, g);
                    const float *xg = x + 128 * h + 32 * g;
                    const int s = 8 * h + 2 * g;
                    acc0 = vfmaq_n_f32(acc0, dot16(c.v[0], xg), d * (float)sc[s]);
                    acc1 = vfmaq_n_f32(acc1, dot16(c.v[1], xg + 16), d * (float)sc[s + 1]);
                }
        }
        break;
    case MG_IQ4_XS:
        for (int64_t i = 0; i < nb; i++, p += 136, x += 256) {
            float dl[8];
            iq4_xs_scales(p, f16_at(p), dl);
            for (int j = 0; j < 8; j += 2) {
                acc0 = vfmaq_n_f32(acc0, dot32(nib_lut(p + 8 + 16 * j, MG_IQ4NL_VALUES), x + 32 * j), dl[j]);
                acc1 = vfmaq_n_f32(acc1, dot32(nib_lut(p + 24 + 16 * j, MG_IQ4NL_VALUES), x + 32 * j + 32), dl[j + 1]);
            }
        }
        break;
    case MG_Q4_1:
    case MG_Q5_1: { /* d * sum(q x) + m * sum(x); the min term in a scalar: one per 32 weights */
        const int q5 = f == MG_Q5_1;
        float mx = 0.0f;
        for (int64_t i = 0; i < nb; i++, p += q5 ? 24 : 20, x += 32) {
            const codes32 c = q5 ? codes_q5_u(p + 4, p + 8) : nib_u(p + 4);
            if (i & 1)
                acc1 = vfmaq_n_f32(acc1, dot32(c, x), f16_at(p));
            else
                acc0 = vfmaq_n_f32(acc0, dot32(c, x), f16_at(p));
            mx += f16_at(p + 2) * xs[i];
        }
        return vaddvq_f32(vaddq_f32(acc0, acc1)) + mx;
    }
    case MG_Q2_K:
        for (int64_t i = 0; i < nb; i++, p += 84, x += 256, xs += 16) {
            float ds[16], dm[16];
            q2_k_scales(p, ds, dm);
            for (int k = 0; k < 16; k += 4) accm = vfmaq_f32(accm, vld1q_f32(dm + k), vld1q_f32(xs + k));
            for (int g = 0; g < 8; g++) {
                const codes32 c = codes_q2_k(p, g);
                acc0 = vfmaq_n_f32(acc0, dot16(c.v[0], x + 32 * g), ds[2 * g]);
                acc1 = vfmaq_n_f32(acc1, dot16(c.v[1], x + 32 * g + 16), ds[2 * g + 1]);
            }
        }
        break;
    case MG_Q3_K:
        for (int64_t i = 0; i < nb; i++, p += 110, x += 256) {
            const float d = f16_at(p + 108);
            int k[16];
            q3_k_scales(p, k);
            for (int g = 0; g < 8; g++) {
                const codes32 c = codes_q3_k(p, g);
                acc0 = vfmaq_n_f32(acc0, dot16(c.v[0], x + 32 * g), d * (float)k[2 * g]);
                acc1 = vfmaq_n_f32(acc1, dot16(c.v[1], x + 32 * g + 16), d * (float)k[2 * g + 1]);
            }
        }
        break;
    default: break;
    }
    return vaddvq_f32(vsubq_f32(vaddq_f32(acc0, acc1), accm));
}

#define ROW_DOT_FOR(NAME, FMT) \
    static float NAME(const uint8_t *p, int64_t nb, const float *x, const float *xs) { return row_dot(FMT, p, nb, x, xs); }
ROW_DOT_FOR(row_dot_q8_0, MG_Q8_0)
ROW_DOT_FOR(row_dot_q4_0, MG_Q4_0)
ROW_DOT_FOR(row_dot_q5_0, MG_Q5_0)
ROW_DOT_FOR(row_dot_q4_k, MG_Q4_K)
ROW_DOT_FOR(row_dot_q5_k, MG_Q5_K)
ROW_DOT_FOR(row_dot_q6_k, MG_Q6_K)
ROW_DOT_FOR(row_dot_mxfp4, MG_MXFP4)
ROW_DOT_FOR(row_dot_iq4_nl, MG_IQ4_NL)
ROW_DOT_FOR(row_dot_iq4_xs, MG_IQ4_XS)
ROW_DOT_FOR(row_dot_q4_1, MG_Q4_1)
ROW_DOT_FOR(row_dot_q5_1, MG_Q5_1)
ROW_DOT_FOR(row_dot_q2_k, MG_Q2_K)
ROW_DOT_FOR(row_dot_q3_k, MG_Q3_K)

typedef mg_neon_row_dot_fn row_dot_fn;

static row_dot_fn *row_dot_of(mg_format f) {
    static row_dot_fn *const fns[MG_FORMAT_COUNT] = {
        [MG_Q8_0] = row_dot_q8_0, [MG_Q4_0] = row_dot_q4_0,   [MG_Q5_0] = row_dot_q5_0,
        [MG_Q4_K] = row_dot_q4_k, [MG_Q5_K] = row_dot_q5_k,   [MG_Q6_K] = row_dot_q6_k,
        [MG_MXFP4] = row_dot_mxfp4, [MG_IQ4_NL] = row_dot_iq4_nl, [MG_IQ4_XS] = row_dot_iq4_xs,
        [MG_Q4_1] = row_dot_q4_1, [MG_Q5_1] = row_dot_q5_1,   [MG_Q2_K] = row_dot_q2_k,
        [MG_Q3_K] = row_dot_q3_k,
        /* the codebook formats: iq_neon.c */
        [MG_IQ2_XXS] = mg_neon_row_dot_iq2_xxs, [MG_IQ2_XS] = mg_neon_row_dot_iq2_xs, [MG_IQ2_S] = mg_neon_row_dot_iq2_s,
        [MG_IQ3_XXS] = mg_neon_row_dot_iq3_xxs, [MG_IQ3_S] = mg_neon_row_dot_iq3_s, [MG_IQ1_S] = mg_neon_row_dot_iq1_s,
        [MG_IQ1_M] = mg_neon_row_dot_iq1_m};
    return (unsigned)f < MG_FORMAT_COUNT ? fns[f] : NULL;
}

int mg_neon_ggml_takes(mg_format f) { return row_dot_of(f) != NULL; }

/* Columns per pass: the per-16 sums of x of one pass fit a stack array. */
enum { PASS_COLS = 65536 };

/* The columns per min (row_dot's xs): 32 for Q4_K, Q5_K, Q4_1, Q5_1, 16 for Q2_K, 0 (no mins). */
static int x_sum_width(mg_format f) {
    return f == MG_Q2_K ? 16 : f == MG_Q4_K || f == MG_Q5_K || f == MG_Q4_1 || f == MG_Q5_1 ? 32 : 0;
}

/* xs[g] = sum of x[wd * g ..][0..wd) for the n / wd groups (wd 16 or 32). */
static void x_sums(const float *x, int64_t n, int wd, float *xs) {
    for (int64_t g = 0; g < n / wd; g++) {
        const float *xg = x + wd * g;
        float32x4_t s = vaddq_f32(vld1q_f32(xg), vld1q_f32(xg + 4));
        for (int k = 8; k < wd; k += 8) s = vaddq_f32(s, vaddq_f32(vld1q_f32(xg + k), vld1q_f32(xg + k + 4)));
        xs[g] = vaddvq_f32(s);
    }
}

void mg_neon_decode_ggml(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    row_dot_fn *dot = row_dot_of(w->format);
    const int sum_wd = x_sum_width(w->format);
    const size_t rb = mg_matrix_row_bytes(w);
    float xs[PASS_COLS / 16];
    for (int64_t c0 = 0; c0 < w->cols; c0 += PASS_COLS) {
        const int64_t kc = w->cols - c0 < PASS_COLS ? w->cols - c0 : PASS_COLS;
        if (sum_wd) x_sums(x + c0, kc, sum_wd, xs);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb + (size_t)(c0 / e * bytes);
            const float part = dot(p, kc / e, x + c0, xs);
            y[r] = c0 == 0 ? part : y[r] + part;
        }
    }
}

/* ---- exact dequantisation of one block (prefill) -------------------------------------------- */

void mg_neon_ggml_dequant_block(mg_format f, const uint8_t *p, float *out) {
    switch (f) {
    case MG_Q8_0: emit32(codes_q8_0(p), f16_at(p), NULL, out); break;
    case MG_Q4_0: emit32(nib_lut(p + 2, Q4_0_VALUES), f16_at(p), NULL, out); break;
    case MG_Q5_0: emit32(codes_q5_0(p), f16_at(p), NULL, out); break;
    case MG_IQ4_NL: emit32(nib_lut(p + 2, MG_IQ4NL_VALUES), f16_at(p), NULL, out); break;
    case MG_MXFP4: emit32(nib_lut(p + 1, MG_MXFP4_VALUES2), MG_E8M0_HALF[p[0]], NULL, out); break;
    case MG_Q4_K:
    case MG_Q5_K: {
        const int q5 = f == MG_Q5_K;
        float ds[8], dm[8];
        k4_scales(p + 4, f16_at(p), f16_at(p + 2), ds, dm);
        for (int j = 0; j < 8; j++) {
            const float nm = -dm[j];
            emit32(codes_k4(p + (q5 ? 48 : 16), q5 ? p + 16 : NULL, j), ds[j], &nm, out + 32 * j);
        }
        break;
    }
    case MG_Q6_K: {
        const float d = f16_at(p + 208);
        const int8_t *sc = (const int8_t *)(p + 192);
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) {
                const codes32 c = codes_q6_k(p, h, g);
                for (int k = 0; k < 2; k++) emit16(c.v[k], d * (float)sc[8 * h + 2 * g + k], NULL, out + 128 * h + 32 * g + 16 * k);
            }
        break;
    }
    case MG_Q4_1:
    case MG_Q5_1: {
        const float m = f16_at(p + 2);
        emit32(f == MG_Q5_1 ? codes_q5_u(p + 4, p + 8) : nib_u(p + 4), f16_at(p), &m, out);
        break;
    }
    case MG_Q2_K: {
        float ds[16], dm[16];
        q2_k_scales(p, ds, dm);
        for (int g = 0; g < 8; g++) {
            const codes32 c = codes_q2_k(p, g);
            for (int k = 0; k < 2; k++) {
                const float nm = -dm[2 * g + k];
                emit16(c.v[k], ds[2 * g + k], &nm, out + 32 * g + 16 * k);
            }
        }
        break;
    }
    case MG_Q3_K: {
        const float d = f16_at(p + 108);
        int k[16];
        q3_k_scales(p, k);
        for (int g = 0; g < 8; g++) {
            const codes32 c = codes_q3_k(p, g);
            for (int h = 0; h < 2; h++) emit16(c.v[h], d * (float)k[2 * g + h], NULL, out + 32 * g + 16 * h);
        }
        break;
    }
    case MG_IQ4_XS: {
        float dl[8];
        iq4_xs_scales(p, f16_at(p), dl);
        for (int j = 0; j < 8; j++) emit32(nib_lut(p + 8 + 16 * j, MG_IQ4NL_VALUES), dl[j], NULL, out + 32 * j);
        break;
    }
    default: mg_neon_iq_dequant_block(f, p, out); break; /* the codebook formats: iq_neon.c */
    }
}
/* ---- int8 activations: the rows of q8_rows_neon.h, built here for the baseline ---------------- */

void mg_neon_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                       int64_t r1) {
    neon_q8_rows(w, xq, n_tok, y, y_stride, r0, r1);
}
#endif
