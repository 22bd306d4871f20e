/* AVX2 block decoders of the int8 GEMM (kernels/q8_gemm.h) for the IQ grid formats (IQ2_XXS,
 * IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): the scalar twin's codes and factors
 * (kernels/scalar/q8_scalar.c, codes_iq) bit for bit.
 *
 * Codes, per 32-column group: the grid entries loaded by index into one ymm (iq_codes.h's
 * group_codes, the same loads as the int8 rows), then signed here rather than put on x as the
 * rows do: IQ2 / IQ3 magnitudes (<= 62) get the group's 32 sign bits as u ^ m - m (signed_x);
 * IQ1's entries g (-1, 0, 1) become 8g by vpsignb(8, g), plus the delta +-1 (per 32 columns for
 * IQ1_S, per 8 for IQ1_M) as a byte vector of 1 / -1.  One 32-byte store per group.
 * Factors, per block: wd (an f16 times 1/8, 1/4 or 1, exact, as the twin) times k = 2s + 1,
 * with the 8 (per-32 formats) or 2 x 8 (per-16: IQ2_XS, IQ2_S, IQ1_M) sub-scales s shifted out
 * of their fields in 32-bit lanes, converted and multiplied as 8 floats at once: the twin's one
 * product wd * (float)k per factor, so equal to it.
 * Measured slower (Zen 4): IQ2_S / IQ3_S indices for the whole block by vector ops (store, reload)
 * and vpgatherdd for IQ3_S's entries; the scalar index arithmetic overlaps the loads better. */
#include "kernels/tables.h"
#include "kernels/q8_gemm.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/avx2/iq_codes.h"

/* wd * (2s + 1) for 8 sub-scales: s = (words[idx[j]] >> shift[j]) & mask, words as u32 lanes. */
INLINE void store_factors(float *fac, float wd, __m256i words, __m256i idx, __m256i shift, int mask) {
    const __m256i field = _mm256_srlv_epi32(_mm256_permutevar8x32_epi32(words, idx), shift);
    const __m256i s = _mm256_and_si256(field, _mm256_set1_epi32(mask));
    const __m256 k = _mm256_cvtepi32_ps(_mm256_or_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1)));
    _mm256_storeu_ps(fac, _mm256_mul_ps(_mm256_set1_ps(wd), k));
}

/* One block's factors: 8 per-32 ones, or 16 per-16 ones. */
INLINE void block_factors(mg_format f, const uint8_t *b, float *fac) {
    const __m256i id = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), zero = _mm256_setzero_si256();
    switch (f) {
    case MG_IQ2_XXS: /* s: the top nibble of each group's aux */
        store_factors(fac, f16_at(b) * 0.125f, iq2_xxs_aux(b), id, _mm256_set1_epi32(28), 15);
        break;
    case MG_IQ3_XXS:
        store_factors(fac, f16_at(b) * 0.25f, iq_load32(b + 66), id, _mm256_set1_epi32(28), 15);
        break;
    case MG_IQ3_S: /* the 8 nibbles of the u32 at 106, low first */
        store_factors(fac, f16_at(b), _mm256_set1_epi32((int)mg_ld32(b + 106)), zero,
                      _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), 15);
        break;
    case MG_IQ1_S: /* bits 12-14 of the u16 at 34 + 2g */
        store_factors(fac, f16_at(b) * 0.125f, _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))), id,
                      _mm256_set1_epi32(12), 7);
        break;
    case MG_IQ1_M: { /* 16 3-bit fields, 4 in bits 0-11 of each of the 4 u16 at 48 */
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(b + 48)));
        const __m256i shift = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
        const float wd = iq1_m_d(b) * 0.125f;
        store_factors(fac, wd, w, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), shift, 7);
        store_factors(fac + 8, wd, w, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3), shift, 7);
        break;
    }
    default: { /* IQ2_XS, IQ2_S: 16 nibbles in 8 bytes, low nibble first */
        const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + (f == MG_IQ2_S ? 74 : 66))));
        const __m256i shift = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
        const float wd = f16_at(b) * 0.125f;
        store_factors(fac, wd, v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), shift, 15);
        store_factors(fac + 8, wd, v, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7), shift, 15);
        break;
    }
    }
}

/* IQ1's deltas of group g as bytes +1 / -1: IQ1_S one sign (bit 15 of the u16 at 34 + 2g) for
 * the 32; IQ1_M one per 8 columns (bit 3 of each nibble of the u16 at 32 + 2g, low first), moved
 * to bit 15 of the 8 columns' 16-bit lanes by a multiply, then spread over the lane. */
INLINE __m256i iq1_delta(mg_format f, const uint8_t *b, int g) {
    __m256i w;
    if (f == MG_IQ1_S) {
        w = _mm256_set1_epi16((short)mg_ld16(b + 34 + 2 * g));
    } else {
        const __m256i up = _mm256_setr_epi16(4096, 4096, 4096, 4096, 256, 256, 256, 256, 16, 16, 16, 16, 1, 1, 1, 1);
        w = _mm256_mullo_epi16(_mm256_set1_epi16((short)mg_ld16(b + 32 + 2 * g)), up);
    }
    return _mm256_or_si256(_mm256_srai_epi16(w, 15), _mm256_set1_epi8(1));
}

INLINE void decode_iq(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac) {
    int64_t e, bytes; /* e = 256 */
    mg_format_block(f, &e, &bytes);
    const int per = (int)e / mg_q8_gemm_group(f);
    for (int64_t i = 0; i < nb; i++, p += bytes, codes += e, fac += per) {
        uint32_t sg[8] __attribute__((aligned(32))); /* the sign bits of each group, where computed per block */
        iq_block_signs(f, p, sg);
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) {
            uint32_t signs;
            const __m256i u = group_codes(f, p, g, sg, &signs);
            const __m256i c = f == MG_IQ1_S || f == MG_IQ1_M
                                  ? _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), u), iq1_delta(f, p, g))
                                  : signed_x(u, signs);
            _mm256_storeu_si256((__m256i *)(codes + 32 * g), c);
        }
        block_factors(f, p, fac);
    }
}

#define DECODER(NAME, FMT)                                                                                             \
    static void dec_##NAME(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) {          \
        (void)f, (void)mn; /* no mins in the grid formats */                                                          \
        decode_iq(FMT, p, nb, codes, fac);                                                                             \
    }
DECODER(iq2_xxs, MG_IQ2_XXS)
DECODER(iq2_xs, MG_IQ2_XS)
DECODER(iq2_s, MG_IQ2_S)
DECODER(iq3_xxs, MG_IQ3_XXS)
DECODER(iq3_s, MG_IQ3_S)
DECODER(iq1_s, MG_IQ1_S)
DECODER(iq1_m, MG_IQ1_M)

mg_q8_decode_fn *mg_avx2_q8_decoder_iq(mg_format f) {
    switch (f) {
    case MG_IQ2_XXS: return dec_iq2_xxs;
    case MG_IQ2_XS: return dec_iq2_xs;
    case MG_IQ2_S: return dec_iq2_s;
    case MG_IQ3_XXS: return dec_iq3_xxs;
    case MG_IQ3_S: return dec_iq3_s;
    case MG_IQ1_S: return dec_iq1_s;
    case MG_IQ1_M: return dec_iq1_m;
    default: return NULL;
    }
}
#else
mg_q8_decode_fn *mg_avx2_q8_decoder_iq(mg_format f) {
    (void)f;
    return NULL;
}
#endif
