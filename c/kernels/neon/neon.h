/* Shared by the NEON kernel files (c/kernels/neon/<family>_neon.c, arm64): helpers and each
 * family's entry points, which table_neon.c puts in the table. */
#ifndef MG_KERNELS_NEON_H
#define MG_KERNELS_NEON_H

#include <arm_neon.h>
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum4(float32x4_t a, float32x4_t b, float32x4_t c, float32x4_t d) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(a, b), vaddq_f32(c, d)));
}

/* linear_neon.c: decode and prefill, one entry per format. */
typedef void mg_neon_linear_fn(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,
                               int64_t y_stride, int64_t r0, int64_t r1);
mg_neon_linear_fn mg_neon_linear_f32, mg_neon_linear_bf16, mg_neon_linear_f16, mg_neon_linear_fp8,
    mg_neon_linear_fp4;

/* ggml_neon.c: the ggml block formats (scale kind none).  decode_ggml: n_tok == 1, rows [r0, r1);
 * ggml_dequant_block: the exact values of one block of format f at p (equal to core/ggml_blocks.h's),
 * for linear_neon.c's prefill tiles; mg_neon_linear_ggml (linear_neon.c) is the table entry. */
void mg_neon_decode_ggml(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1);
void mg_neon_ggml_dequant_block(mg_format f, const uint8_t *p, float *out);
mg_neon_linear_fn mg_neon_linear_ggml;
int mg_neon_ggml_takes(mg_format f); /* the formats the three above implement (others: the parent's entry) */
/* ... and with int8 activations (the linear_q8 entries, any n_tok). */
void mg_neon_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                       int64_t r1);

/* vector_neon.c: the vector ops of mg_kernels. */
MG_VECTOR_OPS_DECLARE(mg_neon)

#endif
