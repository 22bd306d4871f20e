/* A weight matrix as the kernels see it: row-major [rows, cols] (y = W x, rows = outputs),
 * in its on-disk format, pointing straight into mapped or cached file bytes. */
#ifndef MG_MATRIX_H
#define MG_MATRIX_H

#include <stddef.h>
#include <stdint.h>
#include "formats.h"

typedef struct mg_matrix {
    const void *data;   /* row-major values; MG_FP4_E2M1 rows are cols/2 bytes */
    const void *scale;  /* NULL when scale_kind == MG_SCALE_NONE */
    int64_t rows, cols;
    int64_t scale_cols; /* columns of the scale table (its row stride, in elements) */
    mg_format format;
    mg_scale_kind scale_kind;
} mg_matrix;

/* Bytes of one row of values. */
static inline size_t mg_matrix_row_bytes(const mg_matrix *w) {
    switch (w->format) {
    case MG_F32: return (size_t)w->cols * 4;
    case MG_BF16:
    case MG_F16: return (size_t)w->cols * 2;
    case MG_FP8_E4M3: return (size_t)w->cols;
    case MG_FP4_E2M1: return (size_t)w->cols / 2;
    default: {
        int64_t e, b;
        mg_format_block(w->format, &e, &b);
        return e ? (size_t)(w->cols / e * b) : 0;
    }
    }
}

/* Whether w runs through the linear_q8 entries under int8 activations (core/q8_act.h): a
 * block format, or FP4 with its ue8m0 scale per 32 columns (the MXFP4 block with the scale
 * stored apart; the kernels read it at scale + r * scale_cols + c / 32). */
static inline int mg_matrix_has_q8_path(const mg_matrix *w) {
    return mg_format_is_ggml_block(w->format) ||
           (w->format == MG_FP4_E2M1 && w->scale_kind == MG_SCALE_E8M0_G32);
}

/* Bytes of values plus scales: what one full pass over the matrix reads. */
size_t mg_matrix_bytes(const mg_matrix *w);

/* Scale that multiplies element (r, c); 1 when unscaled. Scalar reference path. */
float mg_matrix_scale_at(const mg_matrix *w, int64_t r, int64_t c);

/* Dequantised element (r, c). Scalar reference path, slow: tests and cold paths only. */
float mg_matrix_get(const mg_matrix *w, int64_t r, int64_t c);

/* Dequantise row r into out[cols] (scalar). */
void mg_matrix_row_f32(const mg_matrix *w, int64_t r, float *out);

#endif
