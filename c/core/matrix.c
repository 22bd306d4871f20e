/* Scalar reference accessors for mg_matrix: the definition of what each stored format and
 * scale convention means.  Reads go through memcpy because tensor data inside a mapped
 * shard need not be aligned to its element size. */
#include "core/matrix.h"
#include "core/ggml_blocks.h"

#include <string.h>

const char *mg_format_name(mg_format f) {
    switch (f) {
    case MG_F32: return "f32";
    case MG_BF16: return "bf16";
    case MG_F16: return "f16";
    case MG_FP8_E4M3: return "fp8_e4m3";
    case MG_FP4_E2M1: return "fp4_e2m1";
    case MG_Q8_0: return "q8_0";
    case MG_Q4_0: return "q4_0";
    case MG_Q5_0: return "q5_0";
    case MG_Q4_K: return "q4_k";
    case MG_Q5_K: return "q5_k";
    case MG_Q6_K: return "q6_k";
    case MG_MXFP4: return "mxfp4";
    case MG_IQ4_NL: return "iq4_nl";
    case MG_IQ4_XS: return "iq4_xs";
    case MG_Q4_1: return "q4_1";
    case MG_Q5_1: return "q5_1";
    case MG_Q2_K: return "q2_k";
    case MG_Q3_K: return "q3_k";
    case MG_IQ2_XXS: return "iq2_xxs";
    case MG_IQ2_XS: return "iq2_xs";
    case MG_IQ2_S: return "iq2_s";
    case MG_IQ3_XXS: return "iq3_xxs";
    case MG_IQ3_S: return "iq3_s";
    case MG_IQ1_S: return "iq1_s";
    case MG_IQ1_M: return "iq1_m";
    default: return "unknown";
    }
}

static size_t scale_rows(const mg_matrix *w) {
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128:
    case MG_SCALE_E8M0_BLOCK128: return (size_t)((w->rows + 127) / 128);
    case MG_SCALE_E8M0_G32:
    case MG_SCALE_F32_ROW: return (size_t)w->rows;
    default: return 0;
    }
}

size_t mg_matrix_bytes(const mg_matrix *w) {
    size_t values = (size_t)w->rows * mg_matrix_row_bytes(w);
    size_t elem = w->scale_kind == MG_SCALE_F32_BLOCK128 || w->scale_kind == MG_SCALE_F32_ROW ? 4 : 1;
    return values + scale_rows(w) * (size_t)w->scale_cols * elem;
}

float mg_matrix_scale_at(const mg_matrix *w, int64_t r, int64_t c) {
    const uint8_t *s = w->scale;
    switch (w->scale_kind) {
    case MG_SCALE_F32_BLOCK128: {
        float v;
        memcpy(&v, s + ((size_t)(r / 128) * (size_t)w->scale_cols + (size_t)(c / 128)) * 4, 4);
        return v;
    }
    case MG_SCALE_E8M0_BLOCK128:
        return mg_e8m0_to_f32(s[(size_t)(r / 128) * (size_t)w->scale_cols + (size_t)(c / 128)]);
    case MG_SCALE_E8M0_G32:
        return mg_e8m0_to_f32(s[(size_t)r * (size_t)w->scale_cols + (size_t)(c / 32)]);
    case MG_SCALE_F32_ROW: {
        float v;
        memcpy(&v, s + (size_t)r * (size_t)w->scale_cols * 4, 4);
        return v;
    }
    default: return 1.0f;
    }
}

float mg_matrix_get(const mg_matrix *w, int64_t r, int64_t c) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    float v;
    if (mg_format_is_ggml_block(w->format)) { /* decode the whole block holding c */
        int64_t e, bytes;
        float block[256];
        mg_format_block(w->format, &e, &bytes);
        mg_ggml_block_f32(w->format, row + (size_t)(c / e * bytes), block);
        return block[c % e]; /* self-scaled: scale_kind is MG_SCALE_NONE */
    }
    switch (w->format) {
    case MG_F32: memcpy(&v, row + (size_t)c * 4, 4); break;
    case MG_BF16: {
        uint16_t h;
        memcpy(&h, row + (size_t)c * 2, 2);
        v = mg_bf16_to_f32(h);
        break;
    }
    case MG_F16: {
        uint16_t h;
        memcpy(&h, row + (size_t)c * 2, 2);
        v = mg_f16_to_f32(h);
        break;
    }
    case MG_FP8_E4M3: v = mg_fp8_e4m3_to_f32(row[c]); break;
    case MG_FP4_E2M1: {
        uint8_t b = row[c / 2];
        v = mg_fp4_e2m1_to_f32((c & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 15));
        break;
    }
    default: return NAN;
    }
    return w->scale_kind == MG_SCALE_NONE ? v : v * mg_matrix_scale_at(w, r, c);
}

void mg_matrix_row_f32(const mg_matrix *w, int64_t r, float *out) {
    if (mg_format_is_ggml_block(w->format)) { /* block by block, not element by element */
        mg_ggml_row_f32(w->format, (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w), 0, w->cols, out);
        return;
    }
    for (int64_t c = 0; c < w->cols; c++) out[c] = mg_matrix_get(w, r, c);
}
