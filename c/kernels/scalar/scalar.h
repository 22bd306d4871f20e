/* The scalar kernel files (c/kernels/scalar/<family>_scalar.c): reference twins of every SIMD
 * entry and the fallback on CPUs without a SIMD table, written for clarity, not speed;
 * table_scalar.c puts them in the root table. */
#ifndef MG_KERNELS_SCALAR_H
#define MG_KERNELS_SCALAR_H

#include "kernels/tables.h"

/* linear_scalar.c: every format, decode and prefill. */
void mg_scalar_linear(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, int64_t y_stride,
                      int64_t r0, int64_t r1);

/* q8_scalar.c: the ggml block formats and native FP4 (kernels/q8_fp4.h) with int8 activations
 * (core/q8_act.h), any n_tok. */
void mg_scalar_linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1);

/* vector_scalar.c */
MG_VECTOR_OPS_DECLARE(mg_scalar)
/* attn_scalar.c: the attention block products as loops of the scalar dot and axpy; the softmax
 * by expf. */
void mg_scalar_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                           int64_t dim, float scale, float *s, int64_t s_stride);
void mg_scalar_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                           int64_t v_stride, int64_t n, int64_t dim);
void mg_scalar_softmax(float *x, int64_t n, float sink);

#endif
