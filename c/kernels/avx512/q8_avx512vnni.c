/* AVX-512 VNNI kernels for the ggml block formats with int8 activations (core/q8_act.h; the
 * arithmetic and its scalar twin: kernels/scalar/q8_scalar.c).  vpdpbusd multiplies 64 unsigned
 * bytes by 64 signed bytes and adds each 4 products into 16 i32 lanes in one instruction, where
 * AVX2 needs vpmaddubsw + vpmaddwd on 32: a zmm covers two 32-column groups, lanes 0-7 the first
 * and 8-15 the second, so the per-group factor wd * dx is a vector [f0 x 8 | f1 x 8].
 *  - unsigned weight codes (Q4_K, Q5_K: 0..31; Q6_K: 0..63 before its -32) go straight into the
 *    unsigned operand; Q6_K's offset is subtracted as vpdpbusd(32, x), the same exact integer;
 *  - signed codes (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4, IQ4_XS) take |w| and x negated where w < 0
 *    (AVX-512 has no vpsignb: vpabsb, vpmovb2m and a masked subtract).
 * The sums stay exact (|4 products| < 2^16 per step, |isum| < 2^24), so the results differ from
 * the scalar twin's only in the order of the fp32 additions.  Selected at run time: the avx512
 * table takes these entries on a CPU with AVX512_VNNI (table_avx512.c), else keeps avx2's. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "core/ggml_blocks.h"

INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

static const int8_t Q4_0_VALUES[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/* [a x 8 | b x 8]: the factors of two 32-column groups. */
INLINE __m512 pair(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

/* sum of 4 products of unsigned u and signed x per i32 lane */
INLINE __m512i udot(__m512i u, __m512i x) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x); }
/* both signed: |w| times x negated where w < 0 */
INLINE __m512i sdot(__m512i w, __m512i x) {
    const __m512i nx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), nx);
}
INLINE __m512 fma_i32(__m512 f, __m512i p, __m512 acc) { return _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc); }

/* 16 nibble bytes in Q4_0 order as 32 bytes 0..15 in element order. */
INLINE __m256i nib32(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1),
                            _mm256_set1_epi8(0x0f));
}
INLINE __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }
INLINE __m512i lut64(const int8_t *v) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)v)); }

/* The 32 signed codes of one block of a 32-element format, in element order. */
INLINE __m256i codes32(mg_format f, const uint8_t *p) {
    switch (f) {
    case MG_Q8_0: return _mm256_loadu_si256((const __m256i *)(p + 2));
    case MG_Q5_0: {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        const __m256i hi = _mm256_and_si256(_mm256_movm_epi8(qh), _mm256_set1_epi8(0x10));
        return _mm256_sub_epi8(_mm256_or_si256(nib32(p + 6), hi), _mm256_set1_epi8(16));
    }
    case MG_MXFP4: return nib32(p + 1);  /* indices: looked up by the caller */
    default: return nib32(p + 2);        /* Q4_0, IQ4_NL: indices */
    }
}

/* Blocks of 32 with one scale, two blocks per zmm. */
INLINE float row_32(mg_format f, const uint8_t *p, int64_t nb, const int8_t *q, const float *dx) {
    const size_t bytes = f == MG_Q8_0 ? 34 : f == MG_Q5_0 ? 22 : f == MG_MXFP4 ? 17 : 18;
    const int lut = f == MG_Q4_0 || f == MG_IQ4_NL || f == MG_MXFP4;
    const __m512i tbl = lut64(f == MG_Q4_0 ? Q4_0_VALUES : f == MG_IQ4_NL ? MG_IQ4NL_VALUES : MG_MXFP4_VALUES2);
    const __m512i spread01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 2 * bytes, q += 64, dx += 2) {
        __m512i w = join(codes32(f, p), codes32(f, p + bytes));
        if (lut) w = _mm512_shuffle_epi8(tbl, w);
        /* both scales converted by one vcvtph2ps, times dx[0..1] by one vmulps, spread to
         * [f0 x 8 | f1 x 8] by one vpermps (the same products wd * dx as the scalar twin) */
        __m128 s2;
        if (f == MG_MXFP4) {
            s2 = _mm_setr_ps(MG_E8M0_HALF[p[0]], MG_E8M0_HALF[p[bytes]], 0.0f, 0.0f);
        } else {
            uint16_t h0, h1;
            memcpy(&h0, p, 2);
            memcpy(&h1, p + bytes, 2);
            s2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
        }
        s2 = _mm_mul_ps(s2, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)dx))); /* dx[0..1]: 4-byte aligned */
        const __m512 fp = _mm512_permutexvar_ps(spread01, _mm512_castps128_ps512(s2));
        const __m512i prod = sdot(w, _mm512_loadu_si512((const void *)q));
        if (i & 2)
            acc1 = fma_i32(fp, prod, acc1);
        else
            acc0 = fma_i32(fp, prod, acc0);
    }
    if (i < nb) { /* the odd last block: the upper half of the codes is zero */
        __m512i w = _mm512_castsi256_si512(codes32(f, p));
        w = _mm512_inserti64x4(w, _mm256_setzero_si256(), 1);
        if (lut) w = _mm512_maskz_shuffle_epi8(0xffffffffull, tbl, w);
        const float s0 = f == MG_MXFP4 ? MG_E8M0_HALF[p[0]] : f16_at(p);
        const __m512i x = _mm512_maskz_loadu_epi8(0xffffffffull, q);
        acc0 = fma_i32(pair(s0 * dx[0], 0.0f), sdot(w, x), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

INLINE __m256 bytes_times(const uint8_t b[8], float v) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b))), _mm256_set1_ps(v));
}

/* Lane indices picking factors a (lanes 0-7) and b (lanes 8-15) of an 8-float vector. */
INLINE __m512i pair_index_n(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

/* Lane indices picking factors 2c (lanes 0-7) and 2c + 1 (lanes 8-15) of an 8-float vector. */
INLINE __m512i pair_index(int c) {
    return _mm512_inserti64x4(_mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 1), 1);
}

/* Q4_K / Q5_K (q5): chunk c's 32 bytes hold sub-block 2c (low nibbles) and 2c + 1 (high): one
 * zmm of unsigned codes in element order against x's 64 bytes of the chunk. */
INLINE float row_k4(const uint8_t *p, int64_t nb, const int8_t *q, const float *dx, const float *sx, int q5) {
    const size_t bytes = q5 ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0f), k16 = _mm512_set1_epi8(0x10);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += bytes, q += 256, dx += 8, sx += 8) {
        uint8_t sc[8], mn[8];
        mg_ggml_k4_scales_mins(p + 4, sc, mn);
        const __m512 f = _mm512_castps256_ps512(_mm256_mul_ps(bytes_times(sc, f16_at(p)), _mm256_loadu_ps(dx)));
        accm = _mm256_fmadd_ps(bytes_times(mn, f16_at(p + 2)), _mm256_loadu_ps(sx), accm);
        const uint8_t *qs = p + (q5 ? 48 : 16);
        const __m512i qh = q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 16))) : _mm512_setzero_si512();
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m512i u = _mm512_and_si512(join(v, _mm256_srli_epi16(v, 4)), m4);
            if (q5) { /* bit 2c of qh[l]: element l of the low half; bit 2c + 1: of the high half */
                const __m512i bit = join(_mm256_set1_epi8((char)(1 << (2 * c))), _mm256_set1_epi8((char)(2 << (2 * c))));
                u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(qh, bit), u, k16); /* u < 16: add is or */
            }
            const __m512i prod = udot(u, _mm512_loadu_si512((const void *)(q + 64 * c)));
            const __m512 fc = _mm512_permutexvar_ps(pair_index(c), f);
            if (c & 1)
                acc1 = fma_i32(fc, prod, acc1);
            else
                acc0 = fma_i32(fc, prod, acc0);
        }
    }
    const __m256 m = accm;
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) -
           (m[0] + m[1] + m[2] + m[3] + m[4] + m[5] + m[6] + m[7]);
}

/* Q4_K with x pre-permuted (permute_x_k4): one 64-byte load holds chunks c and c + 1, whose low
 * nibbles are sub-blocks 2c and 2c + 2 and high nibbles 2c + 1 and 2c + 3, against x's groups
 * in that order: per 128 weights one load, two masks, one shift and two vpdpbusd. */
static float row_q4_k_xp(const uint8_t *p, int64_t nb, const int8_t *xp, const float *dx, const float *sx) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i pick[4] = {pair_index_n(0, 2), pair_index_n(1, 3), pair_index_n(4, 6), pair_index_n(5, 7)};
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 144, xp += 256, dx += 8, sx += 8) {
        uint8_t sc[8], mn[8];
        mg_ggml_k4_scales_mins(p + 4, sc, mn);
        const __m512 f = _mm512_castps256_ps512(_mm256_mul_ps(bytes_times(sc, f16_at(p)), _mm256_loadu_ps(dx)));
        accm = _mm256_fmadd_ps(bytes_times(mn, f16_at(p + 2)), _mm256_loadu_ps(sx), accm);
        for (int c = 0; c < 4; c += 2) {
            const __m512i v = _mm512_loadu_si512((const void *)(p + 16 + 32 * c));
            const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            acc0 = fma_i32(_mm512_permutexvar_ps(pick[c], f), udot(lo, _mm512_loadu_si512((const void *)(xp + 64 * c))), acc0);
            acc1 = fma_i32(_mm512_permutexvar_ps(pick[c + 1], f), udot(hi, _mm512_loadu_si512((const void *)(xp + 64 * c + 64))),
                           acc1);
        }
    }
    const __m256 m = accm;
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) -
           (m[0] + m[1] + m[2] + m[3] + m[4] + m[5] + m[6] + m[7]);
}

/* x's 32-column groups of each 256 in the order row_q4_k_xp reads them: 0 2 1 3 4 6 5 7. */
static void permute_x_k4(const int8_t *q, int64_t cols, int8_t *xp) {
    static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int64_t b = 0; b < cols; b += 256)
        for (int g = 0; g < 8; g++) memcpy(xp + b + 32 * g, q + b + 32 * order[g], 32);
}

/* Q6_K: per half h, ql[64h .. 64h + 64) is one zmm whose low nibbles are elements 0..63 of the
 * half and high nibbles 64..127; qh[32h .. 32h + 32) gives the top 2 bits, element e's at shift
 * 2 * (e / 32).  Codes u = lo | hi << 4 (0..63); the value u - 32 is applied as
 * udot(u, x) - udot(32, x).  Scales per 16 elements = per 4 lanes: the factor vector of chunk
 * k (elements 64k .. 64k + 64 of the block) is d * dx[g] * sc[j] spread by one vpermps. */
static float row_q6_k(const uint8_t *p, int64_t nb, const int8_t *q, const float *dx) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x03), k32 = _mm512_set1_epi8(32);
    /* 16-bit shift counts of chunk c' in a half: elements 0..31 take 4c', 32..63 take 4c' + 2 */
    const __m512i cnt0 = join(_mm256_set1_epi16(0), _mm256_set1_epi16(2));
    const __m512i cnt1 = join(_mm256_set1_epi16(4), _mm256_set1_epi16(6));
    /* factor lanes: chunk k's lane l covers elements 64k + 4l .. + 4: scale 4k + l / 4 */
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 210, q += 256, dx += 8) {
        /* the 16 factors d * sc[j] * dx[j / 2] */
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 192))));
        const __m512 dx16 = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                                  _mm512_castps256_ps512(_mm256_loadu_ps(dx)));
        const __m512 f = _mm512_mul_ps(_mm512_mul_ps(sc, _mm512_set1_ps(f16_at(p + 208))), dx16);
        for (int h = 0; h < 2; h++) {
            const __m512i ql = _mm512_loadu_si512((const void *)(p + 64 * h));
            const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h)));
            for (int c = 0; c < 2; c++) {
                const __m512i lo = c ? _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4) : _mm512_and_si512(ql, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(qh, c ? cnt1 : cnt0), m3);
                const __m512i u = _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
                const __m512i x = _mm512_loadu_si512((const void *)(q + 128 * h + 64 * c));
                const __m512i prod = _mm512_sub_epi32(udot(u, x), udot(k32, x));
                const int k = 2 * h + c;
                const __m512 fk = _mm512_permutexvar_ps(_mm512_add_epi32(spread, _mm512_set1_epi32(4 * k)), f);
                if (c)
                    acc1 = fma_i32(fk, prod, acc1);
                else
                    acc0 = fma_i32(fk, prod, acc0);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* IQ4_XS: sub-blocks j, j + 1 (16 nibble bytes each) per zmm through the value table. */
static float row_iq4_xs(const uint8_t *p, int64_t nb, const int8_t *q, const float *dx) {
    const __m512i tbl = lut64(MG_IQ4NL_VALUES);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 136, q += 256, dx += 8) {
        uint16_t sh;
        uint32_t sl;
        memcpy(&sh, p + 2, 2);
        memcpy(&sl, p + 4, 4);
        float f[8];
        const float d = f16_at(p);
        for (int j = 0; j < 8; j++)
            f[j] = d * (float)((int)(((sl >> (4 * j)) & 15) | (((uint32_t)sh >> (2 * j)) & 3) << 4) - 32) * dx[j];
        for (int j = 0; j < 8; j += 2) {
            const __m512i w = _mm512_shuffle_epi8(tbl, join(nib32(p + 8 + 16 * j), nib32(p + 24 + 16 * j)));
            const __m512i prod = sdot(w, _mm512_loadu_si512((const void *)(q + 32 * j)));
            if (j & 2)
                acc1 = fma_i32(pair(f[j], f[j + 1]), prod, acc1);
            else
                acc0 = fma_i32(pair(f[j], f[j + 1]), prod, acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* MXFP4 with x pre-permuted (permute_x_mxfp4), R (1..4) rows per pass.  A block pair's 32 nibble
 * bytes (two 16-byte loads) become one zmm of indices [lo0 | lo1 | hi0 | hi1] (block 0's elements
 * 0-15, block 1's 0-15, block 0's 16-31, block 1's 16-31) by a broadcast, one masked 16-bit shift
 * and one mask, against x in that order; |w| comes from a table of magnitudes and the sign from
 * the index's bit 3 (e2m1's sign bit), so no vpabsb / vpmovb2m, and the scales from MG_E8M0_HALF:
 * about 16 vector operations per 64 weights and row, where row_32 spends about 21 plus two scalar
 * scale decodings.  Each x load serves R rows, and every row's stream is prefetched a
 * row group ahead (rows_ahead): one row streamed alone reached 0.3-0.7 of the read bandwidth
 * (DeepSeek-V4 GGUF experts, 1 thread).  Factor lanes: [f0 x 4 | f1 x 4 | f0 x 4 | f1 x 4]. */
INLINE void rows_mxfp4_xp(const int R, const uint8_t *const *p, const int8_t *xp, const float *dx, int64_t nb,
                          size_t ahead, float *out) {
    static const int8_t MAG[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12};
    const __m512i mag = lut64(MAG), m4 = _mm512_set1_epi8(0x0f), k8 = _mm512_set1_epi8(8);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    __m512 a0[4], a1[4];
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, xp += 64, dx += 2) {
        const __m512i x = _mm512_load_si512((const void *)xp);
        const __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)dx)); /* dx[0..1] */
        for (int j = 0; j < R; j++) {
            const uint8_t *b = p[j] + 17 * i;
            _mm_prefetch((const char *)b + ahead, MG_AVX512_PREFETCH_HINT);
            const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + 1))),
                                                      _mm_loadu_si128((const __m128i *)(b + 18)), 1);
            const __m512i both = _mm512_broadcast_i64x4(v);
            const __m512i idx = _mm512_and_si512(_mm512_mask_srli_epi16(both, 0xffff0000u, both, 4), m4);
            const __m512i nx = _mm512_mask_sub_epi8(x, _mm512_test_epi8_mask(idx, k8), _mm512_setzero_si512(), x);
            const __m512i prod = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_shuffle_epi8(mag, idx), nx);
            const __m128 s2 = _mm_mul_ps(_mm_setr_ps(MG_E8M0_HALF[b[0]], MG_E8M0_HALF[b[17]], 0.0f, 0.0f), d2);
            const __m512 fp = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s2));
            if (i & 2)
                a1[j] = fma_i32(fp, prod, a1[j]);
            else
                a0[j] = fma_i32(fp, prod, a0[j]);
        }
    }
    for (int j = 0; j < R; j++) { /* an odd last block: x there is in element order (permute_x_mxfp4) */
        const float tail = i < nb ? row_32(MG_MXFP4, p[j] + 17 * i, 1, xp, dx) : 0.0f;
        out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j])) + tail;
    }
}

/* x's 16-column quarters of each 64 in the order rows_mxfp4_xp reads them: 0 2 1 3 (an odd
 * last 32 stays in element order). */
static void permute_x_mxfp4(const int8_t *q, int64_t cols, int8_t *xp) {
    static const int order[4] = {0, 2, 1, 3};
    int64_t b = 0;
    for (; b + 64 <= cols; b += 64)
        for (int g = 0; g < 4; g++) memcpy(xp + b + 16 * g, q + b + 16 * order[g], 16);
    memcpy(xp + b, q + b, (size_t)(cols - b));
}

/* Widest row whose permuted x fits the stack (wider Q4_K rows take row_k4). */
enum { XP_MAX = 16384 };

static void linear_q8(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                      int64_t r1) {
    const mg_format f = w->format;
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32, nb = w->cols / e;
    if (f == MG_Q4_K && w->cols <= XP_MAX) { /* x permuted once per token, shared by the rows */
        int8_t xp[XP_MAX] __attribute__((aligned(64)));
        for (int64_t t = 0; t < n_tok; t++) {
            permute_x_k4(xq->q + t * xq->cols, w->cols, xp);
            for (int64_t r = r0; r < r1; r++)
                y[t * y_stride + r] = row_q4_k_xp((const uint8_t *)w->data + (size_t)r * rb, nb, xp,
                                                  xq->d + t * groups, xq->s + t * groups);
        }
        return;
    }
    if (f == MG_MXFP4 && w->cols <= XP_MAX) { /* x permuted once per token, up to four rows per pass */
        int8_t xp[XP_MAX] __attribute__((aligned(64)));
        for (int64_t t = 0; t < n_tok; t++) {
            permute_x_mxfp4(xq->q + t * xq->cols, w->cols, xp);
            for (int64_t r = r0; r < r1; r += 4) {
                const int64_t n = r1 - r < 4 ? r1 - r : 4;
                const uint8_t *ps[4];
                float parts[4];
                for (int64_t j = 0; j < n; j++) ps[j] = (const uint8_t *)w->data + (size_t)(r + j) * rb;
                MG_ROWS_CALL(n, rb, parts, rows_mxfp4_xp, ps, xp, xq->d + t * groups, nb);
                for (int64_t j = 0; j < n; j++) y[t * y_stride + r + j] = parts[j];
            }
        }
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb;
        for (int64_t t = 0; t < n_tok; t++) {
            const int8_t *q = xq->q + t * xq->cols;
            const float *dx = xq->d + t * groups, *sx = xq->s + t * groups;
            float v;
            switch (f) {
            case MG_Q4_K: v = row_k4(p, nb, q, dx, sx, 0); break;
            case MG_Q5_K: v = row_k4(p, nb, q, dx, sx, 1); break;
            case MG_Q6_K: v = row_q6_k(p, nb, q, dx); break;
            case MG_IQ4_XS: v = row_iq4_xs(p, nb, q, dx); break;
            case MG_Q8_0: v = row_32(MG_Q8_0, p, nb, q, dx); break;
            case MG_Q4_0: v = row_32(MG_Q4_0, p, nb, q, dx); break;
            case MG_Q5_0: v = row_32(MG_Q5_0, p, nb, q, dx); break;
            case MG_IQ4_NL: v = row_32(MG_IQ4_NL, p, nb, q, dx); break;
            default: v = row_32(MG_MXFP4, p, nb, q, dx); break;
            }
            y[t * y_stride + r] = v;
        }
    }
}

mg_linear_q8_fn mg_avx512vnni_linear_q8(void) { return linear_q8; }
#else
mg_linear_q8_fn mg_avx512vnni_linear_q8(void) { return NULL; }
#endif
