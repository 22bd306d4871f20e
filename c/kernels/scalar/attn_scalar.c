/* The attention block products (core/kernels.h) as loops of the scalar dot and axpy: the twins
 * of the SIMD ones, which tile the same sums in registers; and the softmax between them. */
#include <math.h>
#include "kernels/scalar/scalar.h"

void mg_scalar_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                           int64_t dim, float scale, float *s, int64_t s_stride) {
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) s[i * s_stride + j] = scale * mg_scalar_dot(q + i * q_stride, k + j * k_stride, dim);
}

void mg_scalar_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                           int64_t v_stride, int64_t n, int64_t dim) {
    for (int i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) mg_scalar_axpy(o + i * o_stride, p[i * p_stride + j], v + j * v_stride, dim);
}

void mg_scalar_softmax(float *x, int64_t n, float sink) {
    float mx = sink;
    for (int64_t j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    float sum = expf(sink - mx); /* 0 without a sink */
    for (int64_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++) x[j] *= inv;
}
