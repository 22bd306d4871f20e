/* Q6_K's 6-bit codes of half a block as bytes, shared by the AVX2 dequantiser (ggml_avx2.c) and
 * the prefill tiles (prefill_avx2.c), which must decode them the same way.  Include after
 * kernels/avx2/avx2.h (INLINE, immintrin). */
#ifndef MG_KERNELS_AVX2_Q6_K_CODES_H
#define MG_KERNELS_AVX2_Q6_K_CODES_H

/* Group g (0..3) of half h of the Q6_K block at b as 32 signed codes (-32..31, the 6-bit code
 * minus 32): elements 128h + 32g .. + 31, the low 4 bits from ql (groups 0, 1 low nibbles, 2, 3
 * high nibbles), the high 2 from bits 2g, 2g + 1 of qh. */
INLINE __m256i q6_k_codes(const uint8_t *b, int h, int g) { /* the codes unsigned (0..63) */
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x03);
    const __m256i L = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32 * (g & 1)));
    const __m256i H = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
    const __m256i lo = _mm256_and_si256(g < 2 ? L : _mm256_srli_epi16(L, 4), m4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(H, 2 * g), m3);
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
}
INLINE __m256i q6_k_group(const uint8_t *b, int h, int g) { return _mm256_sub_epi8(q6_k_codes(b, h, g), _mm256_set1_epi8(32)); }

/* The 4 groups of half h. */
INLINE void q6_k_half(const uint8_t *b, int h, __m256i q[4]) {
    for (int g = 0; g < 4; g++) q[g] = q6_k_group(b, h, g);
}

#endif
