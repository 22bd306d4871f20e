/* The avx512 table (parent: avx2, see c/kernels/tables.h): the linear entries' decode and
 * prefill, read_sum, the attention block products and the softmax are overridden; the other vector ops stay
 * the parent's (they are not bandwidth bound at these sizes).  A new op family is a
 * <family>_avx512.c file whose entry points avx512.h declares and whose entries are set here. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"

/* Decode where decode_avx512.c takes the matrix and x, prefill through prefill_avx512.c's
 * tiles; every other case (other shapes, scale kinds and x) is the parent table's entry. */
#define LINEAR_FN(NAME, FMT, DECODE)                                                                \
    static void NAME(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y, \
                     int64_t y_stride, int64_t r0, int64_t r1) {                                   \
        if (n_tok == 1 && DECODE(w, x, y, r0, r1)) return;                                          \
        if (n_tok > 1) {                                                                            \
            mg_avx512_prefill(w, x, x_stride, n_tok, y, y_stride, r0, r1);                          \
            return;                                                                                 \
        }                                                                                           \
        mg_kernels_avx512()->parent->linear[FMT](w, x, x_stride, n_tok, y, y_stride, r0, r1);       \
    }
LINEAR_FN(linear_f32, MG_F32, mg_avx512_decode_f32)
LINEAR_FN(linear_bf16, MG_BF16, mg_avx512_decode_bf16)
LINEAR_FN(linear_f16, MG_F16, mg_avx512_decode_f16)
LINEAR_FN(linear_fp8, MG_FP8_E4M3, mg_avx512_decode_fp8)
LINEAR_FN(linear_fp8_f16, MG_FP8_E4M3, mg_avx512_decode_fp8_f16)
LINEAR_FN(linear_fp4, MG_FP4_E2M1, mg_avx512_decode_fp4)
/* The ggml block formats: one entry per format (the parent's entry is per format too). */
#define LINEAR_GGML(NAME, FMT) LINEAR_FN(NAME, FMT, mg_avx512_decode_ggml)
LINEAR_GGML(linear_q8_0, MG_Q8_0)
LINEAR_GGML(linear_q4_0, MG_Q4_0)
LINEAR_GGML(linear_q5_0, MG_Q5_0)
LINEAR_GGML(linear_q4_k, MG_Q4_K)
LINEAR_GGML(linear_q5_k, MG_Q5_K)
LINEAR_GGML(linear_q6_k, MG_Q6_K)
LINEAR_GGML(linear_mxfp4, MG_MXFP4)
LINEAR_GGML(linear_iq4_nl, MG_IQ4_NL)
LINEAR_GGML(linear_iq4_xs, MG_IQ4_XS)
/* Prefill through the 512-bit micro-kernels on the avx2 dequantised tiles (mg_avx2_prefill_tile),
 * 1.5-2x the avx2 GEMM's; decode by ggml_avx512.c's rows. */
LINEAR_GGML(linear_q2_k, MG_Q2_K)
LINEAR_GGML(linear_q3_k, MG_Q3_K)
LINEAR_GGML(linear_q4_1, MG_Q4_1)
LINEAR_GGML(linear_q5_1, MG_Q5_1)
/* The grid formats: decoded by the parent (mg_avx512_decode_ggml declines them: iq_avx2.c's
 * loops), prefill as above (tiles: its exact dequantisation). */
LINEAR_GGML(linear_iq2_xxs, MG_IQ2_XXS)
LINEAR_GGML(linear_iq2_xs, MG_IQ2_XS)
LINEAR_GGML(linear_iq2_s, MG_IQ2_S)
LINEAR_GGML(linear_iq3_xxs, MG_IQ3_XXS)
LINEAR_GGML(linear_iq3_s, MG_IQ3_S)
LINEAR_GGML(linear_iq1_s, MG_IQ1_S)
LINEAR_GGML(linear_iq1_m, MG_IQ1_M)

/* The other vector ops stay the parent's (avx2): they are not bandwidth bound at these sizes. */
int mg_kernels_override_avx512(mg_kernels *k, const mg_cpu_features *f) {
    MG_LINEAR_SET(k, linear);
    if (f->denormal_assists) k->linear[MG_FP8_E4M3] = linear_fp8_f16; /* see decode_rows_avx512.c, rows_fp8_folded */
    k->linear[MG_Q8_0] = linear_q8_0, k->linear[MG_Q4_0] = linear_q4_0, k->linear[MG_Q5_0] = linear_q5_0;
    k->linear[MG_Q4_K] = linear_q4_k, k->linear[MG_Q5_K] = linear_q5_k, k->linear[MG_Q6_K] = linear_q6_k;
    k->linear[MG_MXFP4] = linear_mxfp4, k->linear[MG_IQ4_NL] = linear_iq4_nl, k->linear[MG_IQ4_XS] = linear_iq4_xs;
    k->linear[MG_Q4_1] = linear_q4_1, k->linear[MG_Q5_1] = linear_q5_1;
    k->linear[MG_Q2_K] = linear_q2_k, k->linear[MG_Q3_K] = linear_q3_k;
    k->linear[MG_IQ2_XXS] = linear_iq2_xxs, k->linear[MG_IQ2_XS] = linear_iq2_xs, k->linear[MG_IQ2_S] = linear_iq2_s;
    k->linear[MG_IQ3_XXS] = linear_iq3_xxs, k->linear[MG_IQ3_S] = linear_iq3_s;
    k->linear[MG_IQ1_S] = linear_iq1_s, k->linear[MG_IQ1_M] = linear_iq1_m;
    k->read_sum = mg_avx512_read_sum;
    k->attn_scores = mg_avx512_attn_scores, k->attn_values = mg_avx512_attn_values; /* attn_avx512.c */
    k->softmax = mg_avx512_softmax;
    /* int8 activations: vpdpbusd kernels (q8_avx512vnni.c) when the CPU has AVX512_VNNI: the
     * one table entry chosen by a feature beyond the table's own (a separate table would sit
     * between avx512 and avx512bf16 and make the bf16 table require VNNI); without it the avx2
     * table's int8 entries and linear_q8_gemm stay: on a CPU with AVX-VNNI but not AVX512_VNNI
     * (possible, if unusual) its ymm GEMM (q8_gemm_avxvnni.c), else its rows. */
    const mg_linear_q8_fn vnni = mg_avx512vnni_linear_q8(f->prefetch_l2);
    if (vnni && f->avx512vnni) {
        for (int fmt = 0; fmt < MG_FORMAT_COUNT; fmt++)
            if (mg_format_has_q8_path((mg_format)fmt)) k->linear_q8[fmt] = vnni;
        k->linear_q8_gemm = 1; /* several tokens: q8_gemm_avx512vnni.c */
    }
    return 1;
}
#else
int mg_kernels_override_avx512(mg_kernels *k, const mg_cpu_features *f) { return 0; }
#endif
