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

/* ---- the ggml block formats' shared pieces (ggml_neon.c, iq_neon.c): every block becomes signed
 * int8 codes in element order and a factor per 16 or 32 elements; decode dots the codes with x
 * (widened to fp32), prefill multiplies them by the factor (exact: see ggml_neon.c). */

ALWAYS_INLINE float f16_at(const uint8_t *p) {
    float16_t h;
    memcpy(&h, p, 2);
    return (float)h; /* fcvt: exact */
}

/* 32 signed codes in element order: v[0] elements 0..15, v[1] 16..31. */
typedef struct {
    int8x16_t v[2];
} codes32;

/* 16 signed codes as 4 fp32 vectors. */
ALWAYS_INLINE void widen16(int8x16_t q, float32x4_t f[4]) {
    const int16x8_t a = vmovl_s8(vget_low_s8(q)), b = vmovl_high_s8(q);
    f[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(a)));
    f[1] = vcvtq_f32_s32(vmovl_high_s16(a));
    f[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(b)));
    f[3] = vcvtq_f32_s32(vmovl_high_s16(b));
}

/* sum_l q[l] * x[l] over 16 elements, as 4 partial sums. */
ALWAYS_INLINE float32x4_t dot16(int8x16_t q, const float *x) {
    float32x4_t f[4];
    widen16(q, f);
    const float32x4_t a = vfmaq_f32(vmulq_f32(f[0], vld1q_f32(x)), f[1], vld1q_f32(x + 4));
    const float32x4_t b = vfmaq_f32(vmulq_f32(f[2], vld1q_f32(x + 8)), f[3], vld1q_f32(x + 12));
    return vaddq_f32(a, b);
}

ALWAYS_INLINE float32x4_t dot32(codes32 c, const float *x) { return vaddq_f32(dot16(c.v[0], x), dot16(c.v[1], x + 16)); }

/* out[0..16) = q * s, or q * s + *add in one FMA (exact product: one rounding, as the scalar
 * ds * q - dm and d * q + m) when add is given (the negated min of the K-quants). */
ALWAYS_INLINE void emit16(int8x16_t q, float s, const float *add, float *out) {
    float32x4_t f[4];
    widen16(q, f);
    for (int k = 0; k < 4; k++) vst1q_f32(out + 4 * k, add ? vfmaq_n_f32(vdupq_n_f32(*add), f[k], s) : vmulq_n_f32(f[k], s));
}

ALWAYS_INLINE void emit32(codes32 c, float s, const float *add, float *out) {
    emit16(c.v[0], s, add, out);
    emit16(c.v[1], s, add, out + 16);
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
/* iq_neon.c: the IQ1 / IQ2 / IQ3 codebook formats (IQ2_XXS ... IQ1_M), which ggml_neon.c's three
 * entries above dispatch to: a row's dot with fp32 x over nb blocks (the xs argument, ggml_neon.c's
 * sums of x, is unused), and the exact values of one block (mg_neon_iq_dequant_block returns 0,
 * writing nothing, for any other format). */
typedef float mg_neon_row_dot_fn(const uint8_t *p, int64_t nb, const float *x, const float *xs);
mg_neon_row_dot_fn mg_neon_row_dot_iq2_xxs, mg_neon_row_dot_iq2_xs, mg_neon_row_dot_iq2_s, mg_neon_row_dot_iq3_xxs,
    mg_neon_row_dot_iq3_s, mg_neon_row_dot_iq1_s, mg_neon_row_dot_iq1_m;
int mg_neon_iq_dequant_block(mg_format f, const uint8_t *p, float *out);
/* ... and with int8 activations (the linear_q8 entries, any n_tok). */
void mg_neon_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                       int64_t r1);

/* q8_gemm_neondot.c (compiled with the dot-product extension as well): the int8 GEMM on sdot, and
 * the entry the neon table takes on a CPU with the extension (the GEMM from a few tokens, below
 * that the rows of q8_rows_neon.h built there with sdot); NULL in a build without +dotprod. */
void mg_neondot_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                        int64_t r0, int64_t r1);
mg_linear_q8_fn mg_neondot_linear_q8(void);
/* q8_gemm_neoni8mm.c (compiled with the int8 matrix multiply and the dot product): the int8 GEMM
 * on smmla and its entry (the rows of q8_rows_neon.h, with sdot, for one token); NULL in a build
 * without +i8mm. */
void mg_neoni8mm_gemm_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1);
mg_linear_q8_fn mg_neoni8mm_linear_q8(void);

/* vector_neon.c: the vector ops of mg_kernels. */
MG_VECTOR_OPS_DECLARE(mg_neon)

/* attn_neon.c: the attention block products (core/kernels.h), the values bit for bit a loop of
 * mg_neon_axpy, and the softmax between them. */
void mg_neon_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                         int64_t dim, float scale, float *s, int64_t s_stride);
void mg_neon_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                         int64_t v_stride, int64_t n, int64_t dim);
void mg_neon_softmax(float *x, int64_t n, float sink);

#endif
