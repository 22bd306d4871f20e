/* Binding checkpoint tensors to kernel-ready descriptors, in their stored formats.
 *
 * Scale siblings follow each family's convention:
 *   HF fine-grained FP8 (GLM, Qwen):  "<x>.weight" F8_E4M3 + "<x>.weight_scale_inv" F32 [ceil(r/128), ceil(c/128)]
 *   DeepSeek-V4 FP8:                   "<x>.weight" F8_E4M3 + "<x>.scale" F8_E8M0 [ceil(r/128), ceil(c/128)]
 *   DeepSeek-V4 FP4 experts:           "<x>.weight" I8/U8 [r, c/2] + "<x>.scale" F8_E8M0 [r, c/32]
 * Unscaled F32, BF16 and F16 tensors bind directly. */
#ifndef MG_WEIGHTS_H
#define MG_WEIGHTS_H

#include "core/matrix.h"
#include "io/safetensors.h"

/* Describes tensor `name` as a [rows, cols] matrix; checks dtype, shape and scale shape. */
int mg_bind_matrix(const mg_checkpoint *ck, const char *name, int64_t rows, int64_t cols,
                   mg_matrix *out, mg_error *err);

/* A small vector (norm weight, bias, sink) as a new malloc'd fp32 array of n values, from
 * F32, BF16 or F16.  NULL with err set on a missing tensor or wrong size. */
float *mg_bind_vector(const mg_checkpoint *ck, const char *name, int64_t n, mg_error *err);

/* Same, but for a tensor of any shape whose element count is n (e.g. [1, n] or [a, b]), also in
 * a ggml block format (decoded exactly): llama-quantize quantises such 2-D tensors. */
float *mg_bind_array(const mg_checkpoint *ck, const char *name, int64_t n, mg_error *err);

#endif
