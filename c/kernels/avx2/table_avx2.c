/* The avx2 table (parent: scalar, see c/kernels/tables.h): every entry is overridden, and this
 * file says which op family serves which case.  A new op family is a <family>_avx2.c file whose
 * entry points avx2.h declares and whose entries are set here. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

/* Decode: the multi-row loops where they take the matrix and x, else one row at a time. */
#define DECODE_WITH_ROWS(NAME, ROWS, ONE_ROW)                                                  \
    static void NAME(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {  \
        if (!ROWS(w, x, y, r0, r1)) ONE_ROW(w, x, y, r0, r1);                                 \
    }
DECODE_WITH_ROWS(decode_bf16, mg_avx2_decode_rows_bf16, mg_avx2_decode_bf16)
DECODE_WITH_ROWS(decode_fp8, mg_avx2_decode_rows_fp8, mg_avx2_decode_fp8)
DECODE_WITH_ROWS(decode_fp8_f16, mg_avx2_decode_rows_fp8_f16, mg_avx2_decode_fp8)
DECODE_WITH_ROWS(decode_fp4, mg_avx2_decode_rows_fp4, mg_avx2_decode_fp4)

/* One linear entry per format: decode for one token, prefill for more. */
#define LINEAR_FN(NAME, DECODE, PREFILL)                                                            \
    static void NAME(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, \
                     int64_t y_stride, int64_t r0, int64_t r1) {                                   \
        if (n_tok == 1) {                                                                           \
            DECODE(w, x, y, r0, r1);                                                                \
        } else if (n_tok > 1) {                                                                     \
            PREFILL(w, x, x_stride, n_tok, y, y_stride, r0, r1);                                    \
        }                                                                                           \
    }
LINEAR_FN(linear_f32, mg_avx2_decode_f32, mg_avx2_prefill_f32)
LINEAR_FN(linear_bf16, decode_bf16, mg_avx2_prefill_bf16)
LINEAR_FN(linear_f16, mg_avx2_decode_f16, mg_avx2_prefill_f16)
LINEAR_FN(linear_fp8, decode_fp8, mg_avx2_prefill_fp8)
LINEAR_FN(linear_fp8_f16, decode_fp8_f16, mg_avx2_prefill_fp8)
LINEAR_FN(linear_fp4, decode_fp4, mg_avx2_prefill_fp4)
LINEAR_FN(linear_ggml, mg_avx2_decode_ggml, mg_avx2_prefill_ggml) /* ggml_avx2.c + prefill tiles */

int mg_kernels_override_avx2(mg_kernels *k, const mg_cpu_features *f) {
    MG_LINEAR_SET(k, linear);
    if (f->denormal_assists) k->linear[MG_FP8_E4M3] = linear_fp8_f16; /* see decode_rows_avx2.c, step_fp8_f16 */
    /* int8 activations: an entry with an int8 GEMM for several tokens, so that prefill takes the
     * int8 path too (linear_q8_gemm), and the rows (q8_avx2.c) for fewer: on a CPU with AVX-VNNI
     * vpdpbusd's (q8_gemm_avxvnni.c, the rows built with it), else vpmaddubsw's
     * (q8_gemm_avx2.c).  The avx512 table inherits the entry, and replaces it with its own where
     * the CPU has AVX512_VNNI. */
    const mg_linear_q8_fn q8 = f->avxvnni ? mg_avxvnni_linear_q8(f->prefetch_l2) : mg_avx2_linear_q8_gemm(f->prefetch_l2);
    for (int fmt = MG_Q8_0; fmt < MG_FORMAT_COUNT; fmt++) /* a format ggml_avx2.c lacks keeps the parent's */
        if (mg_avx2_ggml_takes((mg_format)fmt)) k->linear[fmt] = linear_ggml;
    for (int fmt = 0; fmt < MG_FORMAT_COUNT; fmt++) /* the block formats and FP4 (q8_fp4_avx2.c) */
        if (mg_format_has_q8_path((mg_format)fmt)) k->linear_q8[fmt] = q8;
    k->q8_quantize_row = mg_avx2_q8_quantize_row; /* q8_act_avx2.c */
    k->linear_q8_gemm = 1;
    MG_VECTOR_OPS_SET(k, mg_avx2);
    k->attn_scores = mg_avx2_attn_scores, k->attn_values = mg_avx2_attn_values; /* attn_avx2.c */
    k->softmax = mg_avx2_softmax;
    return 1;
}
#else
int mg_kernels_override_avx2(mg_kernels *k, const mg_cpu_features *f) { return 0; }
#endif
