/* Activations quantised to int8 (the opt-in "int8" activation path, docs/KERNELS.md): each row
 * of x is quantised once per linear call, then every block-format weight row is dotted with it
 * in integers, as llama.cpp does, so that decode streams weights instead of converting codes.
 *
 * One layout serves every block format: blocks of 32 with an fp32 scale (Q8_0-like).  Why 32
 * and fp32 for the K-quants too, where llama.cpp uses Q8_K (256 elements, one scale):
 *  - every weight format's sub-blocks are 32 (Q6_K: 2 x 16) elements, so one x scale per weight
 *    sub-block costs one float multiply per 32 weights, which the kernels pay anyway for the
 *    weight sub-block scale (they fold both into one factor);
 *  - a scale per 32 follows the activation outliers of MoE models far better than one per 256
 *    (an outlier only coarsens its own 32 neighbours): less error at no bandwidth cost;
 *  - fp32 rather than f16 scales: activations are a few KB per token, so the 2 bytes saved are
 *    worthless, and f16 would add a rounding and overflow above 65504.
 * The K-quant mins need sum(x) per 32: s[] holds d * (sum of the 32 codes), i.e. the sum of the
 * quantised x, so mins and codes see the same x.
 *
 * Quantisation (mg_q8_quantize_row): d = amax / 127 (0 for an all-zero block, which then has
 * codes 0), code = x * (127 / amax) rounded to nearest with ties to even (lrintf in the
 * default rounding mode), which stays within [-127, 127]: no -128, so the kernels' sign trick
 * (|w| * sign(x, w)) and maddubs pairs never saturate.  NaN or inf in x give NaN scales, so the
 * outputs are NaN as on the fp32 path. */
#ifndef MG_Q8_ACT_H
#define MG_Q8_ACT_H

#include <stddef.h>
#include <stdint.h>

enum { MG_Q8_BLOCK = 32 };

/* n_tok quantised rows of cols (a multiple of 32) elements: row t's codes at q + t * cols, its
 * scales at d + t * cols / 32 and its per-32 sums at s + t * cols / 32. */
typedef struct mg_q8_act {
    const int8_t *q;
    const float *d;
    const float *s;
    int64_t cols;
} mg_q8_act;

/* Bytes of n_tok quantised rows of cols elements (the codes first, 64-byte aligned parts). */
size_t mg_q8_act_bytes(int64_t n_tok, int64_t cols);

/* One row: q[cols], d[cols / 32], s[cols / 32].  mg_q8_quantize_row is the plain C one; the
 * kernel tables' q8_quantize_row entries (core/kernels.h) give the same bits faster. */
typedef void mg_q8_row_fn(const float *x, int64_t cols, int8_t *q, float *d, float *s);
mg_q8_row_fn mg_q8_quantize_row;

/* Quantises n_tok rows of x (x_stride floats apart, cols a multiple of 32) into mem (at least
 * mg_q8_act_bytes, 64-byte aligned) with row (NULL: mg_q8_quantize_row) and describes them in
 * *out. */
void mg_q8_quantize(const float *x, int64_t x_stride, int64_t n_tok, int64_t cols, void *mem, mg_q8_act *out,
                    mg_q8_row_fn *row);

#endif
