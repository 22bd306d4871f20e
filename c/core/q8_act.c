/* Quantisation of activation rows to int8 blocks of 32 (layout and rounding: q8_act.h).  The
 * plain C row here is the reference; every table's q8_quantize_row gives its very bits, so all
 * tables see the same codes and the SIMD int8 kernels differ from the scalar twin only in the
 * order of their float sums. */
#include <math.h>
#include "core/q8_act.h"

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t mg_q8_act_bytes(int64_t n_tok, int64_t cols) {
    const size_t n = (size_t)n_tok * (size_t)cols;
    return align64(n) + 2 * align64(n / MG_Q8_BLOCK * sizeof(float));
}

void mg_q8_quantize_row(const float *x, int64_t cols, int8_t *q, float *d, float *s) {
    for (int64_t b = 0; b < cols / MG_Q8_BLOCK; b++) {
        const float *xb = x + b * MG_Q8_BLOCK;
        int8_t *qb = q + b * MG_Q8_BLOCK;
        float amax = 0.0f;
        for (int i = 0; i < MG_Q8_BLOCK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        /* A NaN element makes amax ignore it (fmaxf), so look for it explicitly. */
        int finite = 1;
        for (int i = 0; i < MG_Q8_BLOCK; i++) finite &= isfinite(xb[i]) != 0;
        if (!finite) {
            for (int i = 0; i < MG_Q8_BLOCK; i++) qb[i] = 0;
            d[b] = s[b] = NAN;
            continue;
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < MG_Q8_BLOCK; i++) {
            long v = lrintf(xb[i] * inv); /* ties to even; |x * inv| <= 127 up to one rounding */
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            qb[i] = (int8_t)v;
            sum += (int)v;
        }
        d[b] = amax / 127.0f;
        s[b] = d[b] * (float)sum;
    }
}

void mg_q8_quantize(const float *x, int64_t x_stride, int64_t n_tok, int64_t cols, void *mem, mg_q8_act *out,
                    mg_q8_row_fn *row) {
    if (!row) row = mg_q8_quantize_row;
    const size_t n = (size_t)n_tok * (size_t)cols, nb = n / MG_Q8_BLOCK;
    int8_t *q = mem;
    float *d = (float *)((char *)mem + align64(n));
    float *s = (float *)((char *)d + align64(nb * sizeof(float)));
    for (int64_t t = 0; t < n_tok; t++)
        row(x + t * x_stride, cols, q + t * cols, d + t * (cols / MG_Q8_BLOCK),
                           s + t * (cols / MG_Q8_BLOCK));
    out->q = q, out->d = d, out->s = s, out->cols = cols;
}
