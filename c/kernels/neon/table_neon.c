/* The neon table (parent: scalar, see c/kernels/tables.h): every entry is overridden.  A new op
 * family is a <family>_neon.c file whose entry points neon.h declares and whose entries are set
 * here. */
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

int mg_kernels_override_neon(mg_kernels *k, const mg_cpu_features *f) {
    MG_LINEAR_SET(k, mg_neon_linear);
    /* int8 activations: the rows (ggml_neon.c), which loop over the tokens; on a CPU with the
     * dot-product extension an entry with an int8 GEMM for several tokens (q8_gemm_neondot.c), so
     * that prefill takes the int8 path too (linear_q8_gemm).  Without it the GEMM would multiply
     * by widening, 4 instructions per 16 products, no better than the fp32 tiles: prefill keeps
     * those (as on an x86 CPU without VNNI).  With the int8 matrix multiply as well, the GEMM on
     * smmla (q8_gemm_neoni8mm.c), which does twice the products per instruction. */
    const mg_linear_q8_fn i8mm = f->neoni8mm ? mg_neoni8mm_linear_q8() : NULL;
    const mg_linear_q8_fn dot = i8mm ? i8mm : f->neondot ? mg_neondot_linear_q8() : NULL;
    for (int fmt = 0; fmt < MG_FORMAT_COUNT; fmt++) { /* ggml_neon.c; a format it lacks keeps the parent's */
        if (mg_neon_ggml_takes((mg_format)fmt)) k->linear[fmt] = mg_neon_linear_ggml;
        /* the block formats and native FP4 (DeepSeek-V4's experts; the GEMM's FP4 decoder is the
         * scalar one, kernels/q8_gemm_driver.h) */
        if (mg_format_has_q8_path((mg_format)fmt)) k->linear_q8[fmt] = dot ? dot : mg_neon_linear_q8;
    }
    k->linear_q8_gemm = dot != NULL;
    MG_VECTOR_OPS_SET(k, mg_neon);
    /* attention: block products and a polynomial softmax (attn_neon.c) */
    k->attn_scores = mg_neon_attn_scores, k->attn_values = mg_neon_attn_values, k->softmax = mg_neon_softmax;
    return 1;
}
#else
int mg_kernels_override_neon(mg_kernels *k, const mg_cpu_features *f) { return 0; }
#endif
