/* AVX2 quantisation of activation rows to int8 blocks of 32 (core/q8_act.h): bit for bit the
 * scalar mg_q8_quantize_row, which it replaces in the avx2 tables and their children.  It runs
 * once per linear call on every token's input, which in an int8 prefill is a few hundred
 * million elements: the scalar loop (an fmaxf call per element) took a fifth of an IQ2_XXS
 * prefill.  The same operations in the same order give the same bits: the block's maximum is
 * exact, 127 / amax and amax / 127 are the scalar's divisions, x * inv the same product, and
 * vcvtps2dq rounds to nearest even as lrintf does in the default rounding mode. */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

INLINE int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

void mg_avx2_q8_quantize_row(const float *x, int64_t cols, int8_t *q, float *d, float *s) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i exp_mask = _mm256_set1_epi32(0x7f800000), lim = _mm256_set1_epi32(127);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' lane interleave */
    for (int64_t b = 0; b < cols / MG_Q8_BLOCK; b++) {
        const float *xb = x + b * MG_Q8_BLOCK;
        __m256 v[4], a[4];
        __m256i inf_or_nan = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(xb + 8 * k), a[k] = _mm256_and_ps(v[k], abs_mask);
            const __m256i e = _mm256_and_si256(_mm256_castps_si256(v[k]), exp_mask);
            inf_or_nan = _mm256_or_si256(inf_or_nan, _mm256_cmpeq_epi32(e, exp_mask));
        }
        if (!_mm256_testz_si256(inf_or_nan, inf_or_nan)) { /* as the scalar: codes 0, NaN scale and sum */
            _mm256_storeu_si256((__m256i *)(q + b * MG_Q8_BLOCK), _mm256_setzero_si256());
            d[b] = s[b] = NAN;
            continue;
        }
        const float amax = hmax8(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i c[4], sum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            c[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv));
            c[k] = _mm256_max_epi32(_mm256_min_epi32(c[k], lim), _mm256_sub_epi32(_mm256_setzero_si256(), lim));
            sum = _mm256_add_epi32(sum, c[k]);
        }
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(q + b * MG_Q8_BLOCK), _mm256_permutevar8x32_epi32(bytes, order));
        d[b] = amax / 127.0f;
        s[b] = d[b] * (float)hsum8i(sum);
    }
}
#endif
