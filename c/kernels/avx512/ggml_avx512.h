/* What the AVX-512 loops over GGUF blocks share: decode (ggml_avx512.c) and the prefill tiles
 * (prefill_avx512.c) read the same codes the same way, so each format's widening is written
 * once.  Every value is the scalar decoder's (core/ggml_blocks.h) bit for bit.  Include after
 * avx512.h, only from those two files. */
#ifndef MG_KERNELS_AVX512_GGML_H
#define MG_KERNELS_AVX512_GGML_H

#include <string.h>
#include "core/ggml_blocks.h"

INLINE float f16_at(const uint8_t *p) { /* vcvtph2ps: exact, denormals included */
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes at p zero- (sign-) extended to 16 dword lanes. */
INLINE __m512i u8x16(const uint8_t *p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)); }
INLINE __m512i i8x16(const uint8_t *p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)); }

/* The value tables as fp32 (IQ4: the int8 table; MXFP4: twice the e2m1 values, to go with the
 * 2^(e-128) of mg_ggml_e8m0_half; Q4_0: code - 8). */
INLINE __m512 table_f32(const int8_t *v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)v))); }
static const int8_t Q4_0_VALUES[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
/* The codes 0..15 of Q4_1 and Q5_1 (their values: d * code + m). */
static const int8_t U4_VALUES[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* A block of 32's 16 nibble bytes at q (element i the low nibble of byte i, 16 + i its high
 * nibble) as values through tbl: vpermps reads only an index's low 4 bits, so the low nibble
 * needs no mask. */
INLINE void nibble_values(const uint8_t *q, __m512 tbl, __m512 *lo, __m512 *hi) {
    const __m512i v = u8x16(q);
    *lo = _mm512_permutexvar_ps(v, tbl);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
}

/* The values of a block of 32 with a fifth bit per element (Q5_0, Q5_1): the nibbles at q
 * through tbl, plus 16 where bit i of the u32 qh (element i) is set: the bits as mask
 * registers of one masked add per 16 values (exact: tbl holds small integers). */
INLINE void nibble5_values(const uint8_t *q, uint32_t qh, __m512 tbl, __m512 *lo, __m512 *hi) {
    const __m512 k16 = _mm512_set1_ps(16.0f);
    nibble_values(q, tbl, lo, hi);
    *lo = _mm512_mask_add_ps(*lo, (__mmask16)qh, *lo, k16);
    *hi = _mm512_mask_add_ps(*hi, (__mmask16)(qh >> 16), *hi, k16);
}

/* Q5_0's values of the low 4 bits (code - 16; nibble5_values adds the fifth bit's 16). */
static const int8_t Q5_0_VALUES[16] = {-16, -15, -14, -13, -12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1};

/* The value table of a nibble format's codes, as nibble_values and nibble5_values read it. */
INLINE __m512 nibble_table(mg_format f) {
    switch (f) {
    case MG_Q4_0: return table_f32(Q4_0_VALUES);
    case MG_Q5_0: return table_f32(Q5_0_VALUES);
    case MG_Q4_1:
    case MG_Q5_1: return table_f32(U4_VALUES);
    case MG_MXFP4: return table_f32(MG_MXFP4_VALUES2);
    default: return table_f32(MG_IQ4NL_VALUES); /* IQ4_NL, IQ4_XS */
    }
}

/* Q5_K's codes of chunk c: v the chunk's 16 code bytes k (widened), qh the 16 qh bytes k; byte
 * l's low nibble with bit 2c of qh[l] (sub-block 2c), its high nibble with bit 2c + 1 (2c + 1). */
INLINE void q5_k_codes(__m512i v, const uint8_t *qh, int c, __m512i *lo, __m512i *hi) {
    const __m512i m4 = _mm512_set1_epi32(15), m16 = _mm512_set1_epi32(16);
    const __m512i t = _mm512_srli_epi32(u8x16(qh), 2 * c);
    *lo = _mm512_or_si512(_mm512_and_si512(v, m4), _mm512_and_si512(_mm512_slli_epi32(t, 4), m16));
    *hi = _mm512_or_si512(_mm512_srli_epi32(v, 4), _mm512_and_si512(_mm512_slli_epi32(t, 3), m16));
}

#endif
