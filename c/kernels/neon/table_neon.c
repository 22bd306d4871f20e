/* The neon table (parent: scalar, see c/kernels/tables.h): every entry is overridden.  A new op
 * family is a <family>_neon.c file whose entry points neon.h declares and whose entries are set
 * here. */
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"

int mg_kernels_override_neon(mg_kernels *k, const mg_cpu_features *f) {
    MG_LINEAR_SET(k, mg_neon_linear);
    for (int f = MG_Q8_0; f < MG_FORMAT_COUNT; f++) { /* ggml_neon.c; a format it lacks keeps the parent's */
        if (mg_neon_ggml_takes((mg_format)f)) k->linear[f] = mg_neon_linear_ggml;
        if (mg_format_has_q8_path((mg_format)f)) k->linear_q8[f] = mg_neon_linear_q8;
    }
    MG_VECTOR_OPS_SET(k, mg_neon);
    /* attention: the scalar loops would replace NEON's dot and axpy; NULL lets the caller loop
     * over those (core/kernels.h) */
    k->attn_scores = NULL, k->attn_values = NULL;
    return 1;
}
#else
int mg_kernels_override_neon(mg_kernels *k, const mg_cpu_features *f) { return 0; }
#endif
