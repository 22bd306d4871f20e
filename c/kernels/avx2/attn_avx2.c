/* AVX2 attention block products (core/kernels.h).  A kv group's query heads share each key and
 * value row, so a tile of two query rows against four key rows loads each key once for two
 * heads and each query chunk once for four keys (6 loads per 8 FMAs, where a dot per pair needs
 * 2 per FMA), and the eight sums are reduced together; the values keep two output rows x 32
 * columns in registers across the whole block of rows, where an axpy per row loads and stores
 * its output for every value row.  Per output lane the values' FMAs run in row order, exactly
 * as a loop of mg_avx2_axpy does. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

/* Lane i of the result: the sum of v_i's eight lanes. */
static inline __m256 lane_sums8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5, __m256 v6,
                                __m256 v7) {
    const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3)); /* v0..v3: low | high halves */
    const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* Scores of query rows q0, q1 (q1 may repeat q0; s1 NULL then) against key rows k + j * ks,
 * j < nk <= 4 (rows past nk repeat the last, unstored). */
static void scores_tile(const float *q0, const float *q1, const float *k, int64_t ks, int nk, int64_t dim,
                        float scale, float *s0, float *s1) {
    const float *k0 = k, *k1 = k + (nk > 1 ? ks : 0), *k2 = k + (nk > 2 ? 2 * ks : (nk - 1) * ks),
                *k3 = k + (nk > 3 ? 3 * ks : (nk - 1) * ks);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t d = 0;
#define SCORE_STEP(LOAD)                                                      \
    {                                                                         \
        const __m256 x0 = LOAD(q0 + d), x1 = LOAD(q1 + d);                    \
        __m256 kv = LOAD(k0 + d);                                             \
        a0 = _mm256_fmadd_ps(x0, kv, a0), b0 = _mm256_fmadd_ps(x1, kv, b0);   \
        kv = LOAD(k1 + d);                                                    \
        a1 = _mm256_fmadd_ps(x0, kv, a1), b1 = _mm256_fmadd_ps(x1, kv, b1);   \
        kv = LOAD(k2 + d);                                                    \
        a2 = _mm256_fmadd_ps(x0, kv, a2), b2 = _mm256_fmadd_ps(x1, kv, b2);   \
        kv = LOAD(k3 + d);                                                    \
        a3 = _mm256_fmadd_ps(x0, kv, a3), b3 = _mm256_fmadd_ps(x1, kv, b3);   \
    }
    for (; d + 8 <= dim; d += 8) SCORE_STEP(_mm256_loadu_ps)
    if (d < dim) {
        const __m256i m = lane_mask(dim - d);
#define MASKED(p) _mm256_maskload_ps(p, m)
        SCORE_STEP(MASKED)
#undef MASKED
    }
#undef SCORE_STEP
    const __m256 r = _mm256_mul_ps(lane_sums8(a0, a1, a2, a3, b0, b1, b2, b3), _mm256_set1_ps(scale));
    if (nk == 4) {
        _mm_storeu_ps(s0, _mm256_castps256_ps128(r));
        if (s1) _mm_storeu_ps(s1, _mm256_extractf128_ps(r, 1));
        return;
    }
    float out[8];
    _mm256_storeu_ps(out, r);
    for (int j = 0; j < nk; j++) {
        s0[j] = out[j];
        if (s1) s1[j] = out[4 + j];
    }
}

void mg_avx2_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                         int64_t dim, float scale, float *s, int64_t s_stride) {
    for (int i = 0; i < m; i += 2) {
        const int two = i + 1 < m;
        const float *q0 = q + i * q_stride, *q1 = two ? q0 + q_stride : q0;
        float *s0 = s + i * s_stride, *s1 = two ? s0 + s_stride : NULL;
        for (int64_t j = 0; j < n; j += 4)
            scores_tile(q0, q1, k + j * k_stride, k_stride, n - j < 4 ? (int)(n - j) : 4, dim, scale, s0 + j,
                        s1 ? s1 + j : NULL);
    }
}

/* Output columns [0, 32) of rows o0 (and o1 when TWO) += sum over rows j < n of p[j] * v_j. */
static inline __attribute__((always_inline)) void values_cols32(float *o0, float *o1, const float *p0,
                                                                const float *p1, const float *v, int64_t vs,
                                                                int64_t n, const int TWO) {
    __m256 a0 = _mm256_loadu_ps(o0), a1 = _mm256_loadu_ps(o0 + 8), a2 = _mm256_loadu_ps(o0 + 16),
           a3 = _mm256_loadu_ps(o0 + 24), b0 = a0, b1 = a1, b2 = a2, b3 = a3;
    if (TWO) b0 = _mm256_loadu_ps(o1), b1 = _mm256_loadu_ps(o1 + 8), b2 = _mm256_loadu_ps(o1 + 16),
             b3 = _mm256_loadu_ps(o1 + 24);
    for (int64_t j = 0; j < n; j++) {
        const float *vr = v + j * vs;
        const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8), v2 = _mm256_loadu_ps(vr + 16),
                     v3 = _mm256_loadu_ps(vr + 24), w0 = _mm256_broadcast_ss(p0 + j);
        a0 = _mm256_fmadd_ps(w0, v0, a0), a1 = _mm256_fmadd_ps(w0, v1, a1);
        a2 = _mm256_fmadd_ps(w0, v2, a2), a3 = _mm256_fmadd_ps(w0, v3, a3);
        if (TWO) {
            const __m256 w1 = _mm256_broadcast_ss(p1 + j);
            b0 = _mm256_fmadd_ps(w1, v0, b0), b1 = _mm256_fmadd_ps(w1, v1, b1);
            b2 = _mm256_fmadd_ps(w1, v2, b2), b3 = _mm256_fmadd_ps(w1, v3, b3);
        }
    }
    _mm256_storeu_ps(o0, a0), _mm256_storeu_ps(o0 + 8, a1), _mm256_storeu_ps(o0 + 16, a2), _mm256_storeu_ps(o0 + 24, a3);
    if (TWO)
        _mm256_storeu_ps(o1, b0), _mm256_storeu_ps(o1 + 8, b1), _mm256_storeu_ps(o1 + 16, b2),
            _mm256_storeu_ps(o1 + 24, b3);
}

/* The same for the lanes of mask m of columns [0, 8). */
static inline __attribute__((always_inline)) void values_cols8(float *o0, float *o1, const float *p0,
                                                               const float *p1, const float *v, int64_t vs,
                                                               int64_t n, __m256i m, const int TWO) {
    __m256 a = _mm256_maskload_ps(o0, m), b = TWO ? _mm256_maskload_ps(o1, m) : a;
    for (int64_t j = 0; j < n; j++) {
        const __m256 vr = _mm256_maskload_ps(v + j * vs, m);
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(p0 + j), vr, a);
        if (TWO) b = _mm256_fmadd_ps(_mm256_broadcast_ss(p1 + j), vr, b);
    }
    _mm256_maskstore_ps(o0, m, a);
    if (TWO) _mm256_maskstore_ps(o1, m, b);
}

static inline __attribute__((always_inline)) void values_rows(float *o0, float *o1, const float *p0, const float *p1, const float *v, int64_t vs,
                        int64_t n, int64_t dim, const int TWO) {
    int64_t d = 0;
    for (; d + 32 <= dim; d += 32) values_cols32(o0 + d, o1 + d, p0, p1, v + d, vs, n, TWO);
    for (; d < dim; d += 8) values_cols8(o0 + d, o1 + d, p0, p1, v + d, vs, n, lane_mask(dim - d), TWO);
}

void mg_avx2_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                         int64_t v_stride, int64_t n, int64_t dim) {
    int i = 0;
    for (; i + 2 <= m; i += 2)
        values_rows(o + i * o_stride, o + (i + 1) * o_stride, p + i * p_stride, p + (i + 1) * p_stride, v, v_stride,
                    n, dim, 1);
    if (i < m) values_rows(o + i * o_stride, NULL, p + i * p_stride, NULL, v, v_stride, n, dim, 0);
}
#endif
