/* Scalar linear (every format, decode and prefill): the twin every SIMD linear entry is tested
 * against, and the fallback on CPUs without a SIMD table.  Written for clarity, not speed. */
#include <math.h>
#include <string.h>
#include "kernels/scalar/scalar.h"
#include "core/ggml_blocks.h"

/* The scale of row r for MG_SCALE_F32_ROW (1 otherwise).  Row scales are applied once to the
 * row's dot product, not to each weight: every table does the same, so they agree up to fp32
 * summation order. */
static float row_scale(const mg_matrix *w, int64_t r) {
    if (w->scale_kind != MG_SCALE_F32_ROW) return 1.0f;
    float s;
    memcpy(&s, (const uint8_t *)w->scale + (size_t)r * (size_t)w->scale_cols * 4, 4);
    return s;
}

/* Dequantise one row of w into out[cols] (exact: every format here is exact in fp32), without
 * its row scale (see row_scale). */
static void dequant_row(const mg_matrix *w, int64_t r, float *out) {
    const int64_t cols = w->cols;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    switch (w->format) {
    case MG_F32:
        for (int64_t c = 0; c < cols; c++) out[c] = ((const float *)row)[c];
        break;
    case MG_BF16:
        for (int64_t c = 0; c < cols; c++) out[c] = mg_bf16_to_f32(((const uint16_t *)row)[c]);
        break;
    case MG_F16:
        for (int64_t c = 0; c < cols; c++) out[c] = mg_f16_to_f32(((const uint16_t *)row)[c]);
        break;
    case MG_FP8_E4M3:
        for (int64_t c = 0; c < cols; c++) out[c] = mg_fp8_e4m3_to_f32(row[c]);
        break;
    case MG_FP4_E2M1:
        for (int64_t c = 0; c < cols; c += 2) {
            out[c] = mg_fp4_e2m1_to_f32(row[c / 2] & 0xf);
            if (c + 1 < cols) out[c + 1] = mg_fp4_e2m1_to_f32(row[c / 2] >> 4);
        }
        break;
    default: /* the ggml block formats: self-scaled blocks, scale_kind NONE (core/ggml_blocks.h) */
        mg_ggml_row_f32(w->format, row, 0, cols, out);
        break;
    }
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128: {
        const float *s = (const float *)w->scale + (r / 128) * w->scale_cols;
        for (int64_t c = 0; c < cols; c++) out[c] *= s[c / 128];
        break;
    }
    case MG_SCALE_E8M0_BLOCK128: {
        const uint8_t *s = (const uint8_t *)w->scale + (r / 128) * w->scale_cols;
        for (int64_t c = 0; c < cols; c++) out[c] *= mg_e8m0_to_f32(s[c / 128]);
        break;
    }
    case MG_SCALE_E8M0_G32: {
        const uint8_t *s = (const uint8_t *)w->scale + r * w->scale_cols;
        for (int64_t c = 0; c < cols; c++) out[c] *= mg_e8m0_to_f32(s[c / 32]);
        break;
    }
    default:
        break;
    }
}

void mg_scalar_linear(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok,
                          float *y, int64_t y_stride, int64_t r0, int64_t r1) {
    float row[4096];
    /* Wide rows read elements through mg_matrix_get, which would apply a row scale per weight:
     * give it the matrix without one, and scale the sums like the narrow path does. */
    mg_matrix unscaled = *w;
    if (w->scale_kind == MG_SCALE_F32_ROW) {
        unscaled.scale_kind = MG_SCALE_NONE;
        unscaled.scale = NULL;
    }
    for (int64_t r = r0; r < r1; r++) {
        const float rs = row_scale(w, r);
        /* Rows wider than the stack buffer are handled in column chunks of whole 128 blocks. */
        float acc_tok[64];
        for (int64_t t0 = 0; t0 < n_tok; t0 += 64) {
            int64_t nt = n_tok - t0 < 64 ? n_tok - t0 : 64;
            for (int64_t t = 0; t < nt; t++) acc_tok[t] = 0.0f;
            if (mg_format_is_ggml_block(w->format)) {
                /* Block rows of any width: decode 4096 columns (whole blocks) at a time. */
                const uint8_t *wr = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
                for (int64_t c0 = 0; c0 < w->cols; c0 += 4096) {
                    const int64_t kc = w->cols - c0 < 4096 ? w->cols - c0 : 4096;
                    mg_ggml_row_f32(w->format, wr, c0, kc, row);
                    for (int64_t t = 0; t < nt; t++) {
                        const float *xt = x + (t0 + t) * x_stride + c0;
                        float acc = acc_tok[t];
                        for (int64_t c = 0; c < kc; c++) acc += row[c] * xt[c];
                        acc_tok[t] = acc;
                    }
                }
            } else if (w->cols <= 4096) {
                dequant_row(w, r, row);
                for (int64_t t = 0; t < nt; t++) {
                    const float *xt = x + (t0 + t) * x_stride;
                    float acc = 0.0f;
                    for (int64_t c = 0; c < w->cols; c++) acc += row[c] * xt[c];
                    acc_tok[t] = acc;
                }
            } else {
                for (int64_t t = 0; t < nt; t++) {
                    const float *xt = x + (t0 + t) * x_stride;
                    float acc = 0.0f;
                    for (int64_t c = 0; c < w->cols; c++) acc += mg_matrix_get(&unscaled, r, c) * xt[c];
                    acc_tok[t] = acc;
                }
            }
            for (int64_t t = 0; t < nt; t++) y[(t0 + t) * y_stride + r] = acc_tok[t] * rs;
        }
    }
}
