/* Small scalar ops that are not worth SIMD: RoPE, top-k, sigmoid. */
#ifndef MG_OPS_H
#define MG_OPS_H

#include <stdint.h>

/* inv_freq[j] = theta^(-2j/rot_dim) for j < rot_dim/2, computed in fp32 as transformers does. */
void mg_rope_inv_freq(float *inv_freq, int rot_dim, double theta);

/* cos[j] = cos(pos * inv_freq[j]), sin likewise, j < half; angle computed in fp32. */
void mg_rope_cos_sin(float *cos_out, float *sin_out, const float *inv_freq, int half, int64_t pos);

/* Rotates dims [rot_off, rot_off + 2*half) of each of n_heads vectors (head_stride floats apart).
 * neox (interleaved == 0): pairs (j, j + half); interleaved: pairs (2j, 2j + 1).
 * inverse != 0 rotates by -angle. */
void mg_rope_apply(float *x, int n_heads, int head_stride, int rot_off, int half,
                   const float *cos_v, const float *sin_v, int interleaved, int inverse);

float mg_sigmoid(float x);

/* Indices of the k largest values, largest first; ties keep the lower index first. */
void mg_topk(const float *x, int n, int k, int *idx);

#endif
