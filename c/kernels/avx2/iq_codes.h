/* The IQ grid formats' codes for the int8-activation rows (AVX2: q8_iq_avx2.c, AVX-512 VNNI:
 * avx512/q8_iq_avx512vnni.c; the arithmetic: kernels/scalar/q8_scalar.c): per 32-column group
 * the grid entries as one ymm of bytes, loaded by index (unsigned magnitudes; IQ1: the signed
 * -1 / 0 / 1), and the group's 32 sign bits; the sign bytes of IQ2_XXS / IQ2_XS / IQ3_XXS per
 * block in one vector.  Layouts: core/ggml_blocks.h.  Needs AVX2 and F16C. */
#ifndef MG_KERNELS_AVX2_IQ_CODES_H
#define MG_KERNELS_AVX2_IQ_CODES_H

#include <immintrin.h>
#include <string.h>
#include "core/ggml_blocks.h"
#include "kernels/unaligned.h"

#ifndef INLINE
#define INLINE static inline __attribute__((always_inline))
#endif

INLINE __m256i iq_load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE float f16_at(const uint8_t *p) { return _cvtsh_ss((unsigned short)mg_ld16(p)); } /* vcvtph2ps: exact, denormals too */

/* x with the signs of the 32 weights of a group applied: bit e of bits set negates element e. */
INLINE __m256i signed_x(__m256i x, uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                            3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), bit), bit);
    return _mm256_sub_epi8(_mm256_xor_si256(x, m), m);
}

/* IQ1_M's d (mg_ggml_iq1_m_d) through vcvtph2ps. */
INLINE float iq1_m_d(const uint8_t *b) {
    const uint64_t w = mg_ld64(b + 48);
    return _cvtsh_ss((uint16_t)(((w >> 12) & 0x000f) | ((w >> 24) & 0x00f0) | ((w >> 36) & 0x0f00) | ((w >> 48) & 0xf000)));
}

/* mg_iq2_ksigns of the 7-bit values in the low bits of each byte (or of each 16-bit lane): the
 * value with bit 7 set where its count of set bits is odd.  The shifts of the parity fold
 * carry bits in from the neighbouring byte, but bit 0 of each byte only ever sees its own. */
INLINE __m256i even_parity8(__m256i v) {
    __m256i p = _mm256_xor_si256(v, _mm256_srli_epi32(v, 1));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 4));
    return _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi8(1)), 7));
}

/* The sign bytes of 8 groups (IQ2_XXS, IQ3_XXS: 4 7-bit fields at bits 7l of each u32 lane):
 * byte l of lane g is mg_iq2_ksigns[field l]. */
INLINE __m256i ksigns_aux(__m256i aux) {
    const __m256i v = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7f)), _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7f00))),
        _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7f0000)),
                        _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7f000000))));
    return even_parity8(v);
}

/* IQ2_XXS: the u32 aux of each group (at 6 + 8g) in group order. */
INLINE __m256i iq2_xxs_aux(const uint8_t *b) {
    const __m256i v0 = iq_load32(b + 2), v1 = iq_load32(b + 34); /* groups 0-3, 4-7: aux in the odd dwords */
    const __m256i a = _mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(v0), _mm256_castsi256_ps(v1), 0xdd));
    return _mm256_permutevar8x32_epi32(a, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

/* IQ2_XS: the sign bytes of the 32 codes (mg_iq2_ksigns[code >> 9]), in code order. */
INLINE __m256i iq2_xs_signs(const uint8_t *b) {
    const __m256i s0 = even_parity8(_mm256_srli_epi16(iq_load32(b + 2), 9)), s1 = even_parity8(_mm256_srli_epi16(iq_load32(b + 34), 9));
    return _mm256_permute4x64_epi64(_mm256_packus_epi16(s0, s1), 0xd8);
}

/* The sign bytes of a block's eight groups, for the formats that compute them per block (IQ2_XXS,
 * IQ3_XXS from their aux words, IQ2_XS from its codes) into sg; the other formats leave sg as it
 * is (group_codes reads theirs per group). */
INLINE void iq_block_signs(mg_format f, const uint8_t *b, uint32_t sg[8]) {
    if (f == MG_IQ2_XXS || f == MG_IQ3_XXS)
        _mm256_store_si256((__m256i *)sg, ksigns_aux(f == MG_IQ2_XXS ? iq2_xxs_aux(b) : iq_load32(b + 66)));
    if (f == MG_IQ2_XS) _mm256_store_si256((__m256i *)sg, iq2_xs_signs(b));
}

/* Four 8-byte grid entries, element order. */
INLINE __m256i grid8x4(const void *a, const void *b, const void *c, const void *d) {
    return _mm256_set_epi64x((long long)mg_ld64(d), (long long)mg_ld64(c), (long long)mg_ld64(b), (long long)mg_ld64(a));
}
/* Eight 4-byte grid entries (IQ3), element order. */
INLINE __m256i grid4x8(const uint8_t (*grid)[4], const int *i) {
    return _mm256_set_epi32((int)mg_ld32(grid[i[7]]), (int)mg_ld32(grid[i[6]]), (int)mg_ld32(grid[i[5]]), (int)mg_ld32(grid[i[4]]),
                            (int)mg_ld32(grid[i[3]]), (int)mg_ld32(grid[i[2]]), (int)mg_ld32(grid[i[1]]), (int)mg_ld32(grid[i[0]]));
}

/* Group g of one block b of format f: the unsigned grid bytes (IQ1: the signed entries) and the
 * 32 sign bits (IQ1: 0; IQ2_XXS, IQ2_XS, IQ3_XXS: from sg, the block's sign bytes as ksigns_aux
 * / iq2_xs_signs give them). */
INLINE __m256i group_codes(mg_format f, const uint8_t *b, int g, const uint32_t *sg, uint32_t *signs) {
    switch (f) {
    case MG_IQ2_XXS: {
        const uint8_t *q = b + 2 + 8 * g;
        *signs = sg[g];
        return grid8x4(mg_iq2xxs_grid[q[0]], mg_iq2xxs_grid[q[1]], mg_iq2xxs_grid[q[2]], mg_iq2xxs_grid[q[3]]);
    }
    case MG_IQ2_XS: {
        uint16_t c[4];
        memcpy(c, b + 2 + 8 * g, 8);
        *signs = sg[g];
        return grid8x4(mg_iq2xs_grid[c[0] & 511], mg_iq2xs_grid[c[1] & 511], mg_iq2xs_grid[c[2] & 511],
                       mg_iq2xs_grid[c[3] & 511]);
    }
    case MG_IQ2_S: {
        const uint8_t *qs = b + 2 + 4 * g;
        const unsigned qh = b[66 + g];
        *signs = mg_ld32(b + 34 + 4 * g);
        return grid8x4(mg_iq2s_grid[qs[0] | (qh & 3) << 8], mg_iq2s_grid[qs[1] | (qh & 12) << 6],
                       mg_iq2s_grid[qs[2] | (qh & 48) << 4], mg_iq2s_grid[qs[3] | (qh & 192) << 2]);
    }
    case MG_IQ3_XXS: {
        const uint8_t *qs = b + 2 + 8 * g;
        *signs = sg[g];
        const int i[8] = {qs[0], qs[1], qs[2], qs[3], qs[4], qs[5], qs[6], qs[7]};
        return grid4x8(mg_iq3xxs_grid, i);
    }
    case MG_IQ3_S: {
        const uint8_t *qs = b + 2 + 8 * g;
        const unsigned qh = b[66 + g];
        *signs = mg_ld32(b + 74 + 4 * g);
        int i[8];
        for (int l = 0; l < 8; l++) i[l] = qs[l] | ((qh << (8 - l)) & 256);
        return grid4x8(mg_iq3s_grid, i);
    }
    case MG_IQ1_S: {
        const uint8_t *qs = b + 2 + 4 * g;
        const unsigned qh = mg_ld16(b + 34 + 2 * g);
        *signs = 0;
        return grid8x4(mg_iq1s_grid[qs[0] | (qh & 7) << 8], mg_iq1s_grid[qs[1] | (qh & 56) << 5],
                       mg_iq1s_grid[qs[2] | (qh & 448) << 2], mg_iq1s_grid[qs[3] | (qh & 3584) >> 1]);
    }
    default: { /* IQ1_M */
        const uint8_t *qs = b + 4 * g;
        const unsigned qh = mg_ld16(b + 32 + 2 * g);
        *signs = 0;
        return grid8x4(mg_iq1s_grid[qs[0] | (qh & 7) << 8], mg_iq1s_grid[qs[1] | (qh & 0x70) << 4],
                       mg_iq1s_grid[qs[2] | (qh & 0x700)], mg_iq1s_grid[qs[3] | (qh & 0x7000) >> 4]);
    }
    }
}

#endif
