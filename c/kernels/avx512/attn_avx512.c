/* AVX-512 attention block products (core/kernels.h), attn_avx2.c's tiles widened to zmm and to
 * the 32 registers.  Scores: a tile of R query rows x C key rows (4 x 4 while four query rows
 * remain, then 2 x 8, 1 x 8) keeps its dot products in 16 accumulators, loads each key chunk
 * once for R heads and each query chunk once for C keys (8 loads per 16 FMAs at 4 x 4), and
 * reduces the 16 together into one vector whose lane i * C + j is the score of query i and
 * key j.  Values: a tile of R output rows (4, 2, 1) x up to 64 columns stays in
 * registers across the block of rows (16 accumulators + 4 value vectors; 8 loads per 16 FMAs).
 * Per output lane the FMAs run in row order from the loaded output, each rounded once, exactly
 * as a loop of the avx2 axpy: the values are bit for bit those of that loop and of
 * mg_avx2_attn_values (tests/c/test_kernels.c checks it).  Column tails are masked loads, which
 * read nothing past the row. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/exp_poly.h"

#define UNROLL _Pragma("GCC unroll 16")

/* The first n lanes (n >= 16: all). */
INLINE __mmask16 first_lanes(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* Lane k of the result: the sum of v[k]'s 16 lanes. */
INLINE __m512 lane_sums16(const __m512 *v) {
    __m512 x[8], y[4], z[2];
    UNROLL for (int i = 0; i < 8; i++) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] (a, b = v[2i], v[2i+1]) */
        x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    UNROLL for (int i = 0; i < 4; i++) { /* per 128-bit lane: v[4i] .. v[4i+3]'s sums over that lane */
        const __m512d a = _mm512_castps_pd(x[2 * i]), b = _mm512_castps_pd(x[2 * i + 1]);
        y[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    UNROLL for (int i = 0; i < 2; i++) /* 128-bit lanes: y[2i] over lanes 0+1, 2+3; y[2i+1] likewise */
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* Key rows a scores tile takes for R query rows: 16 / R, but 8 for one row (its other 8
 * accumulators stay zero): 16 key rows a cache's 16 KiB apart (MHA, fp32) would share one L1
 * set, more than its ways. */
#define TILE_KEYS(R) ((R) == 1 ? 8 : 16 / (R))

/* Scores of the R query rows q + i * qs against the nk <= TILE_KEYS(R) key rows k + j * ks (rows
 * past nk repeat the last, unstored) into s + i * ss.  Every (query, key) pair has one
 * accumulator, summed in chunk order and reduced by the same tree whatever R: a head's scores do
 * not depend on the heads beside it in the call (core/kernels.h). */
INLINE void scores_tile(const float *q, int64_t qs, const float *k, int64_t ks, int nk, int64_t dim, float scale,
                        float *s, int64_t ss, const int R) {
    const int C = TILE_KEYS(R);
    const float *kr[16];
    UNROLL for (int j = 0; j < C; j++) kr[j] = k + (j < nk ? j : nk - 1) * ks;
    __m512 acc[16];
    UNROLL for (int a = 0; a < 16; a++) acc[a] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dim; d += 16) {
        const __mmask16 m = first_lanes(dim - d); /* zeros past the row add nothing */
        __m512 x[4];
        UNROLL for (int i = 0; i < R; i++) x[i] = _mm512_maskz_loadu_ps(m, q + i * qs + d);
        UNROLL for (int j = 0; j < C; j++) {
            const __m512 kv = _mm512_maskz_loadu_ps(m, kr[j] + d);
            UNROLL for (int i = 0; i < R; i++) acc[i * C + j] = _mm512_fmadd_ps(x[i], kv, acc[i * C + j]);
        }
    }
    const __m512 r = _mm512_mul_ps(lane_sums16(acc), _mm512_set1_ps(scale));
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    UNROLL for (int i = 0; i < R; i++) /* row i's lanes [i * C, i * C + nk) down to lane 0 */
        _mm512_mask_storeu_ps(s + i * ss, first_lanes(nk),
                              _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(i * C)), r));
}

INLINE void scores_rows(const float *q, int64_t qs, const float *k, int64_t ks, int64_t n, int64_t dim, float scale,
                        float *s, int64_t ss, const int R) {
    const int C = TILE_KEYS(R);
    for (int64_t j = 0; j < n; j += C)
        scores_tile(q, qs, k + j * ks, ks, n - j < C ? (int)(n - j) : C, dim, scale, s + j, ss, R);
}

void mg_avx512_attn_scores(const float *q, int64_t q_stride, int m, const float *k, int64_t k_stride, int64_t n,
                           int64_t dim, float scale, float *s, int64_t s_stride) {
    int i = 0;
#define ROWS(R) scores_rows(q + i * q_stride, q_stride, k, k_stride, n, dim, scale, s + i * s_stride, s_stride, R)
    for (; i + 4 <= m; i += 4) ROWS(4);
    if (i + 2 <= m) ROWS(2), i += 2;
    if (i < m) ROWS(1);
#undef ROWS
}

/* Columns [0, 16 * C) of the R output rows o + i * os (the last vector's lanes: mask last)
 * += sum over rows j < n of p[i * ps + j] * v_j. */
INLINE void values_tile(float *o, int64_t os, const float *p, int64_t ps, const float *v, int64_t vs, int64_t n,
                        __mmask16 last, const int R, const int C) {
    __mmask16 mask[4];
    UNROLL for (int c = 0; c < C; c++) mask[c] = c + 1 < C ? 0xffff : last;
    __m512 acc[16];
    UNROLL for (int i = 0; i < R; i++)
        UNROLL for (int c = 0; c < C; c++) acc[i * C + c] = _mm512_maskz_loadu_ps(mask[c], o + i * os + 16 * c);
    for (int64_t j = 0; j < n; j++) {
        const float *vr = v + j * vs;
        __m512 x[4];
        UNROLL for (int c = 0; c < C; c++) x[c] = _mm512_maskz_loadu_ps(mask[c], vr + 16 * c);
        UNROLL for (int i = 0; i < R; i++) {
            const __m512 w = _mm512_set1_ps(p[i * ps + j]);
            UNROLL for (int c = 0; c < C; c++) acc[i * C + c] = _mm512_fmadd_ps(w, x[c], acc[i * C + c]);
        }
    }
    UNROLL for (int i = 0; i < R; i++)
        UNROLL for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(o + i * os + 16 * c, mask[c], acc[i * C + c]);
}

/* R output rows, by column chunks of 64 (the last: as many vectors as it needs). */
INLINE void values_rows(float *o, int64_t os, const float *p, int64_t ps, const float *v, int64_t vs, int64_t n,
                        int64_t dim, const int R) {
    for (int64_t d = 0; d < dim; d += 64) {
        const int64_t cols = dim - d < 64 ? dim - d : 64;
        const __mmask16 last = first_lanes(cols - (cols - 1) / 16 * 16);
        switch ((cols + 15) / 16) {
        case 4: values_tile(o + d, os, p, ps, v + d, vs, n, last, R, 4); break;
        case 3: values_tile(o + d, os, p, ps, v + d, vs, n, last, R, 3); break;
        case 2: values_tile(o + d, os, p, ps, v + d, vs, n, last, R, 2); break;
        default: values_tile(o + d, os, p, ps, v + d, vs, n, last, R, 1); break;
        }
    }
}

void mg_avx512_attn_values(float *o, int64_t o_stride, int m, const float *p, int64_t p_stride, const float *v,
                           int64_t v_stride, int64_t n, int64_t dim) {
    int i = 0;
#define ROWS(R) values_rows(o + i * o_stride, o_stride, p + i * p_stride, p_stride, v, v_stride, n, dim, R)
    for (; i + 4 <= m; i += 4) ROWS(4);
    if (i + 2 <= m) ROWS(2), i += 2;
    if (i < m) ROWS(1);
#undef ROWS
}

/* e^x per lane (kernels/exp_poly.h), the avx2 exp8's steps at zmm width: within 2 ulp of expf. */
INLINE __m512 exp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(MG_EXP_HI), _mm512_max_ps(_mm512_set1_ps(MG_EXP_LO), x)); /* NaN stays */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(MG_EXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MG_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(MG_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(MG_EXP_P0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MG_EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MG_EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MG_EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MG_EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(MG_EXP_P5));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    const __m512i k = _mm512_cvtps_epi32(n), k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1),
                  bias = _mm512_set1_epi32(127);
    const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23)),
                 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* mg_avx2_softmax's three passes over the row (in L1) at zmm width, the tail by a mask: with
 * prefills reading the cache once per block of tokens (model/blocks.c), the softmax became a
 * ninth of attention at a 4096-token prompt. */
void mg_avx512_softmax(float *x, int64_t n, float sink) {
    const int64_t nf = n & ~(int64_t)15;
    const __mmask16 tail = first_lanes(n - nf);
    __m512 mv = _mm512_set1_ps(sink);
    /* max(x_j, m): x_j > m ? x_j : m, so that a NaN x_j is skipped as in the scalar loop */
    for (int64_t j = 0; j < nf; j += 16) mv = _mm512_max_ps(_mm512_loadu_ps(x + j), mv);
    if (nf < n) mv = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, x + nf), mv);
    const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
    /* the sink's term in lane 0 (0 without a sink) */
    __m512 sum = _mm512_maskz_mov_ps(1, exp16(_mm512_sub_ps(_mm512_set1_ps(sink), mx)));
    for (int64_t j = 0; j < nf; j += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j), mx));
        _mm512_storeu_ps(x + j, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (nf < n) {
        const __m512 e = _mm512_maskz_mov_ps(tail, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + nf), mx)));
        _mm512_mask_storeu_ps(x + nf, tail, e);
        sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
    for (int64_t j = 0; j < nf; j += 16) _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), inv));
    if (nf < n) _mm512_mask_storeu_ps(x + nf, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, x + nf), inv));
}
#endif
