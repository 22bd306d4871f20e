/* Scalar int8-activation linear for the ggml block formats and native FP4: the twin every SIMD linear_q8 entry
 * is tested against (tests/c/test_ggml_q8.c), written for clarity.
 *
 * The arithmetic every table follows, per group g of 32 columns of a weight row (x quantised
 * by core/q8_act.h: codes qx, scale dx[g], sum sx[g] = dx[g] * sum(qx)):
 *     isum  = sum over the group's two halves h of k[h] * sum_l code_l * qx_l   (exact, int32)
 *     imin  = sum over the halves h of km[h] * sum_l qx_l                        (exact, int32)
 *     y    += (wd[g] * dx[g]) * (float)isum  -  wm[g] * sx[g]  -  (wmk[g] * dx[g]) * (float)imin
 * with, per format, code / k / wd / wm (km = 0 and wmk = 0, so the last term is exactly 0,
 * unless stated):
 *     Q8_0, Q4_0 (q-8), Q5_0 (q-16), IQ4_NL (table), MXFP4 (2*e2m1): k = 1, wd = the block's
 *         scale (MXFP4: 2^(e-128), as ggml_blocks.h), wm = 0;
 *     Q4_1, Q5_1: the unsigned code (0..15, 0..31), k = 1, wd = d, wm = -m (y gains m * sx);
 *     Q4_K, Q5_K: the unsigned code, k = 1, wd = d*sc, wm = dmin*m (both exact);
 *     Q6_K: q-32, k = the int8 scales of the two 16-element halves, wd = d, wm = 0;
 *     Q3_K: q in -4..3, k = the halves' 6-bit scales minus 32, wd = d, wm = 0;
 *     Q2_K: the unsigned code (0..3), k = the halves' scale nibbles, wd = d, wm = 0; its mins
 *         are per 16 columns, finer than sx: km = the halves' min nibbles, wmk = dmin;
 *     IQ4_XS: the table value, k = 1, wd = d*(s-32) (exact), wm = 0;
 *     native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32, kernels/q8_fp4.h): MXFP4's, its codes in
 *         pairs per byte and its scale byte read from w->scale (255: wd NaN);
 *     the grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): the grid byte with
 *         its sign (IQ2: +-8/25/43, IQ3_XXS: +-4..62, IQ3_S: +-1..15), IQ1's entry g (-1/0/1)
 *         and delta +-1/8 as the integer 8g +- 1; k = 2s + 1 for the sub-scale s of each 16
 *         (per-32 scales give both halves the same k); wd = d/8 (IQ2, IQ1), d/4 (IQ3_XXS), d
 *         (IQ3_S), exact: the decoders' d * (0.5 + s) * 0.25, d * (0.5 + s) * 0.5, d * (1 + 2s)
 *         and d * (2s + 1) * (g +- 1/8) are these products; wm = 0.
 * isum and imin are exact (|isum| < 2^24, so (float)isum is too); every table computes the same
 * factors wd*dx, wm*sx and wmk*dx up to the rounding of its own products (the VNNI loops fold a
 * per-16 k into the float factor), and otherwise differs only in the order in which the
 * per-group terms are added:
 * |simd - scalar| <= ~ (groups) * 2^-24 * sum |terms| (tests use a bound of that form). */
#include <string.h>
#include "kernels/scalar/scalar.h"
#include "core/ggml_blocks.h"
#include "kernels/q8_gemm.h"
#include "kernels/q8_fp4.h"

/* The per-block factors of the contract above (k, km per 16 columns; wd, wm, wmk per 32). */
typedef struct {
    int k[16], km[16];
    float wd[8], wm[8], wmk[8];
} block_factors;

/* Q4_1 / Q5_1: Q4_0 / Q5_0's nibbles (and fifth bits) without the offset; the min m enters as
 * wm = -m against x's sum. */
static int codes_q4_1_q5_1(mg_format f, const uint8_t *b, int codes[256], block_factors *bf) {
    const int q5 = f == MG_Q5_1;
    uint32_t qh = 0;
    if (q5) memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + (q5 ? 8 : 4);
    bf->wd[0] = mg_ggml_f16_at(b), bf->wm[0] = -mg_ggml_f16_at(b + 2);
    for (int i = 0; i < 16; i++) {
        codes[i] = (qs[i] & 15) | (int)(((qh >> i) & 1) << 4);
        codes[i + 16] = (qs[i] >> 4) | (int)(((qh >> (i + 16)) & 1) << 4);
    }
    return 1;
}

/* Q2_K / Q3_K: element 128h + 32s + l is bits 2s.. of qs[32h + l] (Q3_K: minus 4 where bit
 * 4h + s of hmask[l] is clear); the factors per 16 are integers, d (and Q2_K's dmin) per block. */
static int codes_q2_k_q3_k(mg_format f, const uint8_t *b, int codes[256], block_factors *bf) {
    const int q3 = f == MG_Q3_K;
    const uint8_t *qs = b + (q3 ? 32 : 16);
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, s = (i / 32) % 4, l = i % 32;
        codes[i] = (qs[32 * h + l] >> (2 * s)) & 3;
        if (q3 && !((b[l] >> (4 * h + s)) & 1)) codes[i] -= 4;
    }
    for (int i = 0; i < 16; i++) {
        bf->k[i] = q3 ? mg_ggml_q3_k_scale(b + 96, i) : b[i] & 15;
        bf->km[i] = q3 ? 0 : b[i] >> 4;
    }
    for (int g = 0; g < 8; g++) {
        bf->wd[g] = mg_ggml_f16_at(b + (q3 ? 108 : 80));
        bf->wmk[g] = q3 ? 0.0f : mg_ggml_f16_at(b + 82);
    }
    return 8;
}

/* The grid formats: codes = the signed grid entries (IQ1: 8g +- 1), k[j] = 2s + 1 per 16, one wd
 * per block (ggml_blocks.h's decoders read the same fields; the comments there give the
 * layouts). */
static void sign8(int *c, const uint8_t *g, uint8_t signs) {
    for (int j = 0; j < 8; j++) c[j] = (signs >> j) & 1 ? -(int)g[j] : (int)g[j];
}

static int codes_iq(mg_format f, const uint8_t *b, int codes[256], block_factors *bf) {
    int s16[16]; /* the sub-scale s of each 16 columns */
    float wd;
    switch (f) {
    case MG_IQ2_XXS:
    case MG_IQ3_XXS: {
        const int iq3 = f == MG_IQ3_XXS;
        wd = mg_ggml_f16_at(b) * (iq3 ? 0.25f : 0.125f);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t aux;
            memcpy(&aux, b + (iq3 ? 66 + 4 * ib : 2 + 8 * ib + 4), 4);
            s16[2 * ib] = s16[2 * ib + 1] = (int)(aux >> 28);
            for (int l = 0; l < 4; l++) {
                const uint8_t signs = mg_iq2_ksigns[(aux >> (7 * l)) & 127];
                uint8_t g[8];
                if (iq3) {
                    memcpy(g, mg_iq3xxs_grid[b[2 + 8 * ib + 2 * l]], 4);
                    memcpy(g + 4, mg_iq3xxs_grid[b[2 + 8 * ib + 2 * l + 1]], 4);
                } else {
                    memcpy(g, mg_iq2xxs_grid[b[2 + 8 * ib + l]], 8);
                }
                sign8(codes + 32 * ib + 8 * l, g, signs);
            }
        }
        break;
    }
    case MG_IQ2_XS:
    case MG_IQ2_S: {
        const int s2 = f == MG_IQ2_S;
        const uint8_t *sc = b + (s2 ? 74 : 66);
        wd = mg_ggml_f16_at(b) * 0.125f;
        for (int k = 0; k < 32; k++) {
            if (s2) {
                const int idx = b[2 + k] | (((b[66 + k / 4] >> (2 * (k % 4))) & 3) << 8);
                sign8(codes + 8 * k, mg_iq2s_grid[idx], b[34 + k]);
            } else {
                uint16_t code;
                memcpy(&code, b + 2 + 2 * k, 2);
                sign8(codes + 8 * k, mg_iq2xs_grid[code & 511], mg_iq2_ksigns[code >> 9]);
            }
        }
        for (int j = 0; j < 16; j++) s16[j] = (sc[j / 2] >> (4 * (j & 1))) & 15;
        break;
    }
    case MG_IQ3_S: {
        wd = mg_ggml_f16_at(b);
        for (int k = 0; k < 64; k++) {
            const uint8_t *g = mg_iq3s_grid[b[2 + k] | (((b[66 + k / 8] >> (k % 8)) & 1) << 8)];
            for (int j = 0; j < 4; j++) {
                const int e = 4 * k + j;
                codes[e] = (b[74 + e / 8] >> (e % 8)) & 1 ? -(int)g[j] : (int)g[j];
            }
        }
        for (int j = 0; j < 16; j++) s16[j] = (b[106 + j / 4] >> (4 * ((j / 2) & 1))) & 15;
        break;
    }
    case MG_IQ1_S:
    case MG_IQ1_M: {
        const int m = f == MG_IQ1_M;
        uint16_t w[8];
        memcpy(w, b + (m ? 48 : 34), m ? 8 : 16);
        wd = (m ? mg_ggml_iq1_m_d(b) : mg_ggml_f16_at(b)) * 0.125f;
        for (int k = 0; k < 32; k++) {
            int idx, neg;
            if (m) {
                const int nib = (b[32 + k / 2] >> (4 * (k % 2))) & 15;
                idx = b[k] | ((nib & 7) << 8), neg = nib >> 3;
            } else {
                const uint16_t qh = w[k / 4];
                idx = b[2 + k] | (((qh >> (3 * (k % 4))) & 7) << 8), neg = qh >> 15;
            }
            for (int j = 0; j < 8; j++) codes[8 * k + j] = 8 * mg_iq1s_grid[idx][j] + (neg ? -1 : 1);
        }
        for (int j = 0; j < 16; j++) s16[j] = m ? (w[j / 4] >> (3 * (j % 4))) & 7 : (w[j / 2] >> 12) & 7;
        break;
    }
    default: return 0;
    }
    for (int j = 0; j < 16; j++) bf->k[j] = 2 * s16[j] + 1;
    for (int g = 0; g < 8; g++) bf->wd[g] = wd;
    return 8;
}

/* One block's integer codes (element order) and factors; returns the number of 32-groups (1 or
 * 8). */
static int block_codes(mg_format f, const uint8_t *b, int codes[256], block_factors *bf) {
    int *k = bf->k;
    float *wd = bf->wd, *wm = bf->wm;
    for (int i = 0; i < 16; i++) k[i] = 1, bf->km[i] = 0;
    for (int g = 0; g < 8; g++) wm[g] = 0.0f, bf->wmk[g] = 0.0f;
    switch (f) {
    case MG_Q4_1:
    case MG_Q5_1: return codes_q4_1_q5_1(f, b, codes, bf);
    case MG_Q2_K:
    case MG_Q3_K: return codes_q2_k_q3_k(f, b, codes, bf);
    case MG_IQ2_XXS:
    case MG_IQ2_XS:
    case MG_IQ2_S:
    case MG_IQ3_XXS:
    case MG_IQ3_S:
    case MG_IQ1_S:
    case MG_IQ1_M: return codes_iq(f, b, codes, bf);
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

/* Native FP4's 32 codes of one group (16 bytes at b, kernels/q8_fp4.h) in element order. */
static void fp4_group_codes(const uint8_t *b, int codes[32]) {
    for (int i = 0; i < 16; i++) {
        codes[2 * i] = MG_MXFP4_VALUES2[b[i] & 15];
        codes[2 * i + 1] = MG_MXFP4_VALUES2[b[i] >> 4];
    }
}

/* Native FP4: the MXFP4 arithmetic with k = 1 and no mins, per group of 32 columns. */
static void linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                          int64_t r0, int64_t r1) {
    const int64_t groups = w->cols / 32;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * (size_t)(w->cols / 2);
        const uint8_t *s = (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *qx = xq->q + t * xq->cols;
            const float *dx = xq->d + t * groups;
            float acc = 0.0f;
            for (int64_t g = 0; g < groups; g++) {
                int codes[32];
                fp4_group_codes(row + 16 * g, codes);
                int32_t isum = 0;
                for (int l = 0; l < 32; l++) isum += codes[l] * qx[32 * g + l];
                acc += (mg_q8_fp4_wd(s[g]) * dx[g]) * (float)isum;
            }
            y[t * y_stride + r] = acc;
        }
    }
}

void mg_scalar_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1) {
    if (w->format == MG_FP4_E2M1) { /* only with ue8m0 scales per 32 (mg_matrix_has_q8_path) */
        linear_q8_fp4(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
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
                int codes[256];
                block_factors bf;
                const int ng = block_codes(w->format, row + (size_t)(c0 / e * bytes), codes, &bf);
                for (int g = 0; g < ng; g++) {
                    const int64_t G = c0 / 32 + g;
                    int32_t isum = 0, imin = 0;
                    for (int h = 0; h < 2; h++) {
                        int32_t part = 0, xsum = 0;
                        for (int l = 0; l < 16; l++) {
                            part += codes[32 * g + 16 * h + l] * qx[32 * G + 16 * h + l];
                            xsum += qx[32 * G + 16 * h + l];
                        }
                        isum += bf.k[2 * g + h] * part;
                        imin += bf.km[2 * g + h] * xsum;
                    }
                    acc += (bf.wd[g] * dx[G]) * (float)isum - bf.wm[g] * sx[G] - (bf.wmk[g] * dx[G]) * (float)imin;
                }
            }
            y[t * y_stride + r] = acc;
        }
    }
}

void mg_scalar_q8_decode(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) {
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const int G = mg_q8_gemm_group(f), per = (int)(e / G), mins = mg_q8_gemm_has_mins(f);
    for (int64_t i = 0; i < nb; i++) {
        int c[256];
        block_factors bf;
        block_codes(f, p + i * bytes, c, &bf);
        for (int l = 0; l < e; l++) codes[i * e + l] = (int8_t)c[l];
        for (int g = 0; g < per; g++) {
            /* the group's 32 (G = 32: k is the same in both halves) or 16 columns */
            const int h = G == 32 ? 2 * g : g, g32 = G == 32 ? g : g / 2;
            fac[i * per + g] = bf.wd[g32] * (float)bf.k[h];
            if (mins) mn[i * per + g] = G == 32 ? bf.wm[g32] : bf.wmk[g32] * (float)bf.km[h];
        }
    }
}

void mg_scalar_q8_decode_fp4(const uint8_t *p, const uint8_t *s, int64_t ng, int8_t *codes, float *fac) {
    for (int64_t g = 0; g < ng; g++) {
        int c[32];
        fp4_group_codes(p + 16 * g, c);
        for (int l = 0; l < 32; l++) codes[32 * g + l] = (int8_t)c[l];
        fac[g] = mg_q8_fp4_wd(s[g]);
    }
}
