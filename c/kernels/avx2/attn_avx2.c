/* AVX2 attention block products (core/kernels.h).  A kv group's query heads share each key and
 * value row, so a tile of two query rows against four key rows loads each key once for two
 * heads and each query chunk once for four keys (6 loads per 8 FMAs, where a dot per pair needs
 * 2 per FMA), and the eight sums are reduced together; the values keep two output rows x 32
 * columns in registers across the whole block of rows, where an axpy per row loads and stores
 * its output for every value row.  Per output lane the values' FMAs run in row order, exactly
 * as a loop of mg_avx2_axpy does.  The softmax between them takes e^x from a polynomial
 * (kernels/exp_poly.h), eight lanes at a time: expf calls cost as much as the zmm products. */
#include <math.h>
#include "kernels/exp_poly.h"
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

/* e^x per lane (kernels/exp_poly.h), within 2 ulp of expf. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(MG_EXP_HI), _mm256_max_ps(_mm256_set1_ps(MG_EXP_LO), x)); /* NaN stays */
    const __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(MG_EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MG_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(MG_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(MG_EXP_P0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MG_EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MG_EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MG_EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MG_EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(MG_EXP_P5));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const __m256i k = _mm256_cvtps_epi32(n), k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1),
                  bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23)),
                 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* Three passes over the row (in L1): the max, e^(x_j - max) stored and summed per lane, the
 * scaling by 1 / sum.  attn_avx512.c has the same at zmm width. */
void mg_avx2_softmax(float *x, int64_t n, float sink) {
    const int64_t nf = n & ~(int64_t)7;
    const __m256i tail = lane_mask(n - nf);
    const __m256 tailf = _mm256_castsi256_ps(tail);
    const __m256 none = _mm256_set1_ps(-INFINITY);
    __m256 mv = _mm256_set1_ps(sink);
    /* max(x_j, m): x_j > m ? x_j : m, so that a NaN x_j is skipped as in the scalar loop */
    for (int64_t j = 0; j < nf; j += 8) mv = _mm256_max_ps(_mm256_loadu_ps(x + j), mv);
    if (nf < n) mv = _mm256_max_ps(_mm256_blendv_ps(none, _mm256_maskload_ps(x + nf, tail), tailf), mv);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const __m256 mx = _mm256_broadcastss_ps(m4);
    /* the sink's term in lane 0 (0 without a sink) */
    __m256 sum = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_set1_ps(sink), mx)), _mm256_castsi256_ps(lane_mask(1)));
    for (int64_t j = 0; j < nf; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mx));
        _mm256_storeu_ps(x + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (nf < n) {
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + nf, tail), mx)), tailf);
        _mm256_maskstore_ps(x + nf, tail, e);
        sum = _mm256_add_ps(sum, e);
    }
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    const __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(s4));
    for (int64_t j = 0; j < nf; j += 8) _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), inv));
    if (nf < n) _mm256_maskstore_ps(x + nf, tail, _mm256_mul_ps(_mm256_maskload_ps(x + nf, tail), inv));
}
#endif
