/* The dispatch table: every hot kernel, once per instruction set.  The scalar table is the
 * reference twin of every SIMD entry; tests compare them on odd sizes.  Each SIMD table is its
 * parent's with the entries that instruction set implements overridden (c/kernels/tables.h). */
#ifndef MG_KERNELS_H
#define MG_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "matrix.h"
#include "q8_act.h"

/* Y[t, r] = sum_c W[r, c] * X[t, c]  for tokens t in [0, n_tok) and rows r in [r0, r1).
 * X rows are x_stride floats apart, Y rows y_stride floats apart.  n_tok == 1 is decode
 * (matrix x vector); n_tok > 1 is prefill, where each weight row is decoded once and
 * used for all tokens.  Accumulation is fp32; quantised weights are dequantised exactly. */
typedef void (*mg_linear_fn)(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok,
                             float *y, int64_t y_stride, int64_t r0, int64_t r1);

/* The int8-activation twin of mg_linear_fn for the ggml block formats (the opt-in path of
 * core/q8_act.h): Y[t, r] = sum_c W[r, c] * Xq[t, c] for tokens t in [0, n_tok), rows [r0, r1),
 * Xq the rows as quantised once by the caller (mg_linear*), dotted in integers per 32 columns
 * with the float factors (weight scale x activation scale) applied once per 32. */
typedef void (*mg_linear_q8_fn)(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y,
                                int64_t y_stride, int64_t r0, int64_t r1);

typedef struct mg_kernels {
    const char *name; /* "scalar", "avx2", "avx512", "avx512bf16", "neon" */
    /* The table this one was built from (NULL: scalar, the root).  An entry that declines a
     * case passes it to the same entry of its own table's parent. */
    const struct mg_kernels *parent;
    mg_linear_fn linear[MG_FORMAT_COUNT];
    /* int8 activations: set for the ggml block formats (MG_Q8_0 ...), NULL for the others,
     * which keep fp32 activations whatever the compute environment asks (c/core/linear.h). */
    mg_linear_q8_fn linear_q8[MG_FORMAT_COUNT];
    /* Nonzero when the linear_q8 entries multiply many tokens at once (an int8 GEMM: every x86
     * table, the neon one with the dot product), so that prefill takes them too; 0: they loop
     * over the tokens of each row, and only decode (one token) takes them (core/linear.c). */
    int linear_q8_gemm;
    /* The opt-in fast activations (act_int8) for the formats without linear_q8 entries: prefill
     * (n_tok > 1) with x rounded to bf16 on weights exact in bf16 (kernels/avx512bf16/
     * prefill_avx512bf16.c); NULL: fp32 tiles.  An entry passes the matrices it does not take
     * (their weights not exact in bf16) to the fp32 entry. */
    mg_linear_fn linear_bf16x[MG_FORMAT_COUNT];
    /* int8 activations: one row quantised (core/q8_act.h), bit for bit mg_q8_quantize_row. */
    mg_q8_row_fn *q8_quantize_row;
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a * x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
    /* out = x / sqrt(mean(x^2) + eps) * w   (w == NULL: unweighted); out may alias x */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* out = silu(gate) * up; limit > 0 first clamps gate to <= limit and up to [-limit, limit] */
    void (*swiglu)(float *out, const float *gate, const float *up, int64_t n, float limit);
    /* Sum of all bytes read as floats: touches every cache line; the bandwidth yardstick. */
    float (*read_sum)(const float *p, int64_t n);
    /* Attention's two products over a block of n key / value rows, for m query rows at once (the
     * heads of one kv group share every key and value row they load):
     *   attn_scores: s[i * s_stride + j] = scale * dot(q_i, k_j)          i < m, j < n
     *   attn_values: o_i += sum over j = 0 .. n-1 of p[i * p_stride + j] * v_j   (j ascending)
     * q_i = q + i * q_stride, k_j = k + j * k_stride, o_i, v_j likewise; dim floats each.  Row i's
     * results are bit for bit those of a call with that row alone (attention cuts a group's heads
     * into slices by thread count, and must not change with it).  NULL in a table whose dot and
     * axpy serve (the caller then loops over those). */
    void (*attn_scores)(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                        int64_t dim, float scale, float *s, int64_t s_stride);
    void (*attn_values)(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                        int64_t v_stride, int64_t n, int64_t dim);
    /* Between them, in place: x_j = e^(x_j - mx) / (e^(sink - mx) + sum_j e^(x_j - mx)), mx the
     * largest of the x_j and sink (-INFINITY: no sink).  The scalar entry takes expf; the SIMD
     * ones a polynomial within 2 ulp of it, and sum in their own order. */
    void (*softmax)(float *x, int64_t n, float sink);
} mg_kernels;

/* The tables (built once, on first use from any thread); NULL when the build does not contain
 * that instruction set or this CPU does not run it (c/kernels/tables.h). */
const mg_kernels *mg_kernels_scalar(void);
const mg_kernels *mg_kernels_avx2(void);       /* x86-64 */
const mg_kernels *mg_kernels_avx512(void);     /* x86-64 */
const mg_kernels *mg_kernels_avx512bf16(void); /* x86-64, compiler with -mavx512bf16 */
const mg_kernels *mg_kernels_neon(void);       /* arm64 */

#endif
