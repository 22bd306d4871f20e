/* Scalar int8-activation linear for the ggml block formats: the twin every SIMD linear_q8 entry
 * is tested against (tests/c/test_ggml_q8.c), written for clarity.
 *
 * The arithmetic every table follows, per group g of 32 columns of a weight row (x quantised
 * by core/q8_act.h: codes qx, scale dx[g], sum sx[g] = dx[g] * sum(qx)):
 *     isum  = sum over the group's two halves h of k[h] * sum_l code_l * qx_l   (exact, int32)
 *     y    += (wd[g] * dx[g]) * (float)isum  -  wm[g] * sx[g]
 * with, per format, code / k / wd / wm:
 *     Q8_0, Q4_0 (q-8), Q5_0 (q-16), IQ4_NL (table), MXFP4 (2*e2m1): k = 1, wd = the block's
 *         scale (MXFP4: 2^(e-128), as ggml_blocks.h), wm = 0;
 *     Q4_K, Q5_K: the unsigned code, k = 1, wd = d*sc, wm = dmin*m (both exact);
 *     Q6_K: q-32, k = the int8 scales of the two 16-element halves, wd = d, wm = 0;
 *     IQ4_XS: the table value, k = 1, wd = d*(s-32) (exact), wm = 0;
 *     Q4_1, Q5_1: the unsigned code, k = 1, wd = d, wm = -m;
 *     Q3_K: q in -4..3, k = the 6-bit scales - 32 of the halves, wd = d, wm = 0;
 *     Q2_K: the code 0..3, k = the halves' 4-bit scales, wd = d, wm = 0, and its per-16 mins
 *         as one more term: imin = sum_h km[h] * sum_l qx_l (km: the 4-bit mins, exact int),
 *         y -= (wmk[g] * dx[g]) * imin with wmk = dmin (0 for the other formats).
 * isum is exact (|isum| < 2^24, so (float)isum is too); every table computes the same factors
 * wd*dx and wm*sx, so tables differ only in the order in which the per-group terms are added:
 * |simd - scalar| <= ~ (groups) * 2^-24 * sum |terms| (tests use a bound of that form). */
#include <string.h>
#include "kernels/scalar/scalar.h"
#include "core/ggml_blocks.h"

/* One block's integer codes (element order), the per-16 integer factors k and min factors km,
 * and the per-32 float factors wd, wm and wmk; returns the number of 32-groups (1 or 8). */
static int block_codes(mg_format f, const uint8_t *b, int codes[256], int k[16], int km[16], float wd[8], float wm[8],
                       float wmk[8]) {
    for (int i = 0; i < 16; i++) k[i] = 1, km[i] = 0;
    for (int g = 0; g < 8; g++) wm[g] = 0.0f, wmk[g] = 0.0f;
    switch (f) {
    case MG_Q4_1:
    case MG_Q5_1: {
        const int q5 = f == MG_Q5_1;
        uint32_t qh = 0;
        if (q5) memcpy(&qh, b + 4, 4);
        const uint8_t *qs = b + (q5 ? 8 : 4);
        wd[0] = mg_ggml_f16_at(b), wm[0] = -mg_ggml_f16_at(b + 2);
        for (int i = 0; i < 16; i++) {
            codes[i] = (qs[i] & 15) | (int)(((qh >> i) & 1) << 4);
            codes[i + 16] = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1) << 4);
        }
        return 1;
    }
    case MG_Q2_K:
    case MG_Q3_K: {
        const int q3 = f == MG_Q3_K;
        const uint8_t *qs = b + (q3 ? 32 : 16);
        for (int i = 0; i < 256; i++) {
            const int h = i / 128, s = (i / 32) % 4, l = i % 32;
            codes[i] = (qs[32 * h + l] >> (2 * s)) & 3;
            if (q3 && !((b[l] >> (4 * h + s)) & 1)) codes[i] -= 4;
        }
        for (int i = 0; i < 16; i++) {
            k[i] = q3 ? mg_ggml_q3_k_scale(b + 96, i) : b[i] & 15;
            km[i] = q3 ? 0 : b[i] >> 4;
        }
        for (int g = 0; g < 8; g++) wd[g] = mg_ggml_f16_at(b + (q3 ? 108 : 80)), wmk[g] = q3 ? 0.0f : mg_ggml_f16_at(b + 82);
        return 8;
    }
    case MG_Q8_0:
        wd[0] = mg_ggml_f16_at(b);
        for (int i = 0; i < 32; i++) codes[i] = (int8_t)b[2 + i];
        return 1;
    case MG_Q4_0:
    case MG_IQ4_NL:
    case MG_MXFP4: {
        const int off = f == MG_MXFP4 ? 1 : 2;
        wd[0] = f == MG_MXFP4 ? mg_ggml_e8m0_half(b[0]) : mg_ggml_f16_at(b);
        for (int i = 0; i < 16; i++) {
            const int lo = b[off + i] & 15, hi = b[off + i] >> 4;
            codes[i] = f == MG_Q4_0 ? lo - 8 : f == MG_IQ4_NL ? MG_IQ4NL_VALUES[lo] : MG_MXFP4_VALUES2[lo];
            codes[i + 16] = f == MG_Q4_0 ? hi - 8 : f == MG_IQ4_NL ? MG_IQ4NL_VALUES[hi] : MG_MXFP4_VALUES2[hi];
        }
        return 1;
    }
    case MG_Q5_0: {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        wd[0] = mg_ggml_f16_at(b);
        for (int i = 0; i < 16; i++) {
            codes[i] = ((b[6 + i] & 15) | (int)(((qh >> i) & 1) << 4)) - 16;
            codes[i + 16] = ((b[6 + i] >> 4) | (int)(((qh >> (i + 16)) & 1) << 4)) - 16;
        }
        return 1;
    }
    case MG_Q4_K:
    case MG_Q5_K: {
        const int q5 = f == MG_Q5_K;
        const float d = mg_ggml_f16_at(b), dmin = mg_ggml_f16_at(b + 2);
        const uint8_t *qh = b + 16, *qs = b + (q5 ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            mg_ggml_k4_scale_min(b + 4, j, &sc, &m);
            wd[j] = d * (float)sc, wm[j] = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * (j / 2) + l] >> (4 * (j & 1))) & 15;
                if (q5) v |= ((qh[l] >> j) & 1) << 4;
                codes[32 * j + l] = v;
            }
        }
        return 8;
    }
    case MG_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        for (int i = 0; i < 256; i++) {
            const int h = i / 128, e = i % 128;
            const int lo = (ql[64 * h + e % 64] >> (4 * (e / 64))) & 15;
            const int hi = (qh[32 * h + e % 32] >> (2 * (e / 32))) & 3;
            codes[i] = (lo | (hi << 4)) - 32;
        }
        for (int i = 0; i < 16; i++) k[i] = (int8_t)b[192 + i];
        for (int g = 0; g < 8; g++) wd[g] = mg_ggml_f16_at(b + 208);
        return 8;
    }
    case MG_IQ4_XS: {
        uint16_t sh;
        memcpy(&sh, b + 2, 2);
        const float d = mg_ggml_f16_at(b);
        for (int j = 0; j < 8; j++) {
            const int s = ((b[4 + j / 2] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4);
            wd[j] = d * (float)(s - 32);
            for (int l = 0; l < 16; l++) {
                codes[32 * j + l] = MG_IQ4NL_VALUES[b[8 + 16 * j + l] & 15];
                codes[32 * j + 16 + l] = MG_IQ4NL_VALUES[b[8 + 16 * j + l] >> 4];
            }
        }
        return 8;
    }
    default: return 0;
    }
}

void mg_scalar_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1) {
    int64_t e, bytes;
    mg_format_block(w->format, &e, &bytes);
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *qx = xq->q + t * xq->cols;
            const float *dx = xq->d + t * groups, *sx = xq->s + t * groups;
            float acc = 0.0f;
            for (int64_t c0 = 0; c0 < w->cols; c0 += e) {
                int codes[256], k[16], km[16];
                float wd[8], wm[8], wmk[8];
                const int ng = block_codes(w->format, row + (size_t)(c0 / e * bytes), codes, k, km, wd, wm, wmk);
                for (int g = 0; g < ng; g++) {
                    const int64_t G = c0 / 32 + g;
                    int32_t isum = 0, imin = 0;
                    for (int h = 0; h < 2; h++) {
                        int32_t part = 0, xsum = 0;
                        for (int l = 0; l < 16; l++) {
                            part += codes[32 * g + 16 * h + l] * qx[32 * G + 16 * h + l];
                            xsum += qx[32 * G + 16 * h + l];
                        }
                        isum += k[2 * g + h] * part;
                        imin += km[2 * g + h] * xsum;
                    }
                    acc += (wd[g] * dx[G]) * (float)isum - wm[g] * sx[G] - (wmk[g] * dx[G]) * (float)imin;
                }
            }
            y[t * y_stride + r] = acc;
        }
    }
}
