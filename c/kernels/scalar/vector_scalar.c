/* Scalar vector ops: the reference twins of every table's dot, axpy, scale, rmsnorm, swiglu and
 * read_sum. */
#include <math.h>
#include "kernels/scalar/scalar.h"

float mg_scalar_dot(const float *a, const float *b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

void mg_scalar_axpy(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

void mg_scalar_scale(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

void mg_scalar_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * (w ? w[i] : 1.0f);
}

void mg_scalar_swiglu(float *out, const float *gate, const float *up, int64_t n, float limit) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i];
        if (limit > 0.0f) {
            g = g > limit ? limit : g;
            u = u > limit ? limit : (u < -limit ? -limit : u);
        }
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

float mg_scalar_read_sum(const float *p, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) acc += p[i];
    return acc;
}
