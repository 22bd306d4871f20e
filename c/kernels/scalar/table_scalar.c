/* The scalar table: the root of every other (c/kernels/tables.h). */
#include "kernels/scalar/scalar.h"

/* The root table: every entry (c/kernels/tables.h). */
int mg_kernels_override_scalar(mg_kernels *k, const mg_cpu_features *f) {
    for (int f = 0; f < MG_FORMAT_COUNT; f++) k->linear[f] = mg_scalar_linear;
    /* int8 activations: the block formats and FP4 (the others keep fp32, linear_q8 NULL) */
    for (int f = 0; f < MG_FORMAT_COUNT; f++)
        if (mg_format_has_q8_path((mg_format)f)) k->linear_q8[f] = mg_scalar_linear_q8;
    k->q8_quantize_row = mg_q8_quantize_row;
    MG_VECTOR_OPS_SET(k, mg_scalar);
    k->attn_scores = mg_scalar_attn_scores, k->attn_values = mg_scalar_attn_values, k->softmax = mg_scalar_softmax;
    return 1;
}
