/* NEON kernels (arm64) for the IQ1 / IQ2 / IQ3 codebook ("grid") formats, twins of the scalar
 * decoders in core/ggml_blocks.h, called from ggml_neon.c's decode and prefill dispatch.
 *
 * Every 16 elements become one int8x16 of signed codes in element order and one fp32 factor, as
 * for the other block formats (neon.h), so decode reuses dot16 and prefill emit16:
 *  - grid entries are gathered by index, 8 bytes (IQ2, IQ1) or 4 bytes (IQ3) per load;
 *  - IQ2 / IQ3 signs: 8 sign bits per 8 elements (IQ2_XXS / IQ2_XS / IQ3_XXS expand 7 stored bits
 *    through mg_iq2_ksigns; IQ2_S / IQ3_S store the bytes) are spread to one byte per element
 *    (vqtbl1q_u8), tested against {1, 2, 4 .. 128} (vtstq_u8) into 0xff masks m, and applied as
 *    (g ^ m) - m, the two's complement negation where m is set (magnitudes are < 64, so int8);
 *  - IQ1: value = dl * (g + delta) with g in {-1, 0, 1} and delta = +-1/8, which is
 *    (dl / 8) * (8g +- 1): the codes 8g +- 1 (-9 .. 9) are int8 and dl / 8 is exact, so the
 *    delta needs no sums of x.
 * Factors: d * (0.5 + s) / 4 (IQ2_*), d * (0.5 + s) / 2 (IQ3_XXS), d * (1 + 2s) (IQ3_S),
 * d * (2s + 1) / 8 (IQ1_*), per 32 elements, per 16 for IQ2_XS / IQ2_S / IQ1_M.
 *
 * Prefill exactness: the scalar value is (d * factor) * g * sign, or dl * (g + delta); the factor
 * is the same exact fp32 number here (same expression; the extra / 8 of IQ1 is a power of two on
 * a number >= 2^-24), the real product factor * code equals the scalar one, and one rounding of
 * the same real number (negation commutes with round-to-nearest) gives the same float. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include "kernels/neon/neon.h"
#include "core/ggml_blocks.h"
#include "kernels/neon/iq_codes.h" /* the codes, shared with q8_decode_neon.c */

/* ---- decode: a row's dot with fp32 x, two accumulators (one per 16-element half) ---------- */

ALWAYS_INLINE float iq_row_dot(mg_format f, const uint8_t *p, int64_t nb, const float *x) {
    const int64_t bytes = iq_block_bytes(f);
    float32x4_t acc0 = vdupq_n_f32(0.0f), acc1 = acc0;
    for (int64_t i = 0; i < nb; i++, p += bytes, x += 256) {
        const float d = iq_d(f, p);
        for (int ib = 0; ib < 8; ib++) {
            float s[2];
            const codes32 c = iq_codes(f, p, d, ib, s);
            acc0 = vfmaq_n_f32(acc0, dot16(c.v[0], x + 32 * ib), s[0]);
            acc1 = vfmaq_n_f32(acc1, dot16(c.v[1], x + 32 * ib + 16), s[1]);
        }
    }
    return vaddvq_f32(vaddq_f32(acc0, acc1));
}

#define IQ_ROW_DOT_FOR(NAME, FMT) \
    float NAME(const uint8_t *p, int64_t nb, const float *x, const float *xs) { return iq_row_dot(FMT, p, nb, x); }
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq2_xxs, MG_IQ2_XXS)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq2_xs, MG_IQ2_XS)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq2_s, MG_IQ2_S)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq3_xxs, MG_IQ3_XXS)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq3_s, MG_IQ3_S)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq1_s, MG_IQ1_S)
IQ_ROW_DOT_FOR(mg_neon_row_dot_iq1_m, MG_IQ1_M)
#undef IQ_ROW_DOT_FOR

/* ---- prefill: the exact values of one block ------------------------------------------------ */

ALWAYS_INLINE void iq_dequant(mg_format f, const uint8_t *p, float *out) {
    const float d = iq_d(f, p);
    for (int ib = 0; ib < 8; ib++) {
        float s[2];
        const codes32 c = iq_codes(f, p, d, ib, s);
        emit16(c.v[0], s[0], NULL, out + 32 * ib);
        emit16(c.v[1], s[1], NULL, out + 32 * ib + 16);
    }
}

int mg_neon_iq_dequant_block(mg_format f, const uint8_t *p, float *out) {
    switch (f) {
    case MG_IQ2_XXS: iq_dequant(MG_IQ2_XXS, p, out); return 1;
    case MG_IQ2_XS: iq_dequant(MG_IQ2_XS, p, out); return 1;
    case MG_IQ2_S: iq_dequant(MG_IQ2_S, p, out); return 1;
    case MG_IQ3_XXS: iq_dequant(MG_IQ3_XXS, p, out); return 1;
    case MG_IQ3_S: iq_dequant(MG_IQ3_S, p, out); return 1;
    case MG_IQ1_S: iq_dequant(MG_IQ1_S, p, out); return 1;
    case MG_IQ1_M: iq_dequant(MG_IQ1_M, p, out); return 1;
    default: return 0;
    }
}
#endif
