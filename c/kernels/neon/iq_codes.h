/* The IQ1 / IQ2 / IQ3 codebook ("grid") formats' codes on NEON, shared by iq_neon.c (fp32 rows,
 * prefill's exact dequantisation) and q8_decode_neon.c (the int8 GEMM's block decoders): every 32
 * elements become two int8x16 of signed codes in element order and the factors of their two
 * 16-element halves (iq_codes; iq_neon.c's header comment gives the plan and why the factors
 * are exact).  Include only from the NEON kernel files. */
#ifndef MG_KERNELS_NEON_IQ_CODES_H
#define MG_KERNELS_NEON_IQ_CODES_H

#include <string.h>
#include "kernels/neon/neon.h"
#include "core/ggml_blocks.h"

/* 0xff in byte e (0..31) of m where bit e % 8 of byte e / 8 of s4 is set: the elements a group's
 * sign bytes negate. */
ALWAYS_INLINE void sign_masks32(uint32_t s4, uint8x16_t m[2]) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    static const uint8_t spread[32] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    const uint8x16_t v = vreinterpretq_u8_u32(vdupq_n_u32(s4)), bits = vld1q_u8(bit);
    m[0] = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(spread)), bits);
    m[1] = vtstq_u8(vqtbl1q_u8(v, vld1q_u8(spread + 16)), bits);
}

/* 32 magnitudes (g0: elements 0..15, g1: 16..31) with the signs of s4 (as sign_masks32). */
ALWAYS_INLINE codes32 signed_codes(uint8x16_t g0, uint8x16_t g1, uint32_t s4) {
    uint8x16_t m[2];
    sign_masks32(s4, m);
    codes32 c = {{vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g0, m[0]), m[0])),
                  vreinterpretq_s8_u8(vsubq_u8(veorq_u8(g1, m[1]), m[1]))}};
    return c;
}

/* The sign bytes of four 7-bit fields (IQ2_XXS / IQ3_XXS: bits 7l.. of aux), byte l for group l. */
ALWAYS_INLINE uint32_t ksigns4(uint32_t aux) {
    return (uint32_t)mg_iq2_ksigns[aux & 127] | (uint32_t)mg_iq2_ksigns[(aux >> 7) & 127] << 8 |
           (uint32_t)mg_iq2_ksigns[(aux >> 14) & 127] << 16 | (uint32_t)mg_iq2_ksigns[(aux >> 21) & 127] << 24;
}

/* Two 8-byte grid entries side by side. */
ALWAYS_INLINE uint8x16_t grid8x2(const uint8_t *a, const uint8_t *b) { return vcombine_u8(vld1_u8(a), vld1_u8(b)); }

/* Four 4-byte grid entries (IQ3) side by side; memcpy keeps the byte tables' type. */
ALWAYS_INLINE uint8x16_t grid4x4(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d) {
    uint32_t w[4];
    memcpy(w, a, 4), memcpy(w + 1, b, 4), memcpy(w + 2, c, 4), memcpy(w + 3, d, 4);
    uint32x4_t v = vdupq_n_u32(w[0]);
    v = vsetq_lane_u32(w[1], v, 1);
    v = vsetq_lane_u32(w[2], v, 2);
    v = vsetq_lane_u32(w[3], v, 3);
    return vreinterpretq_u8_u32(v);
}

/* IQ1: the codes 8g + 1 (delta +1/8) or 8g - 1 (-1/8) of two 8-element groups. */
ALWAYS_INLINE int8x16_t iq1_codes16(const int8_t *g0, const int8_t *g1, int neg0, int neg1) {
    const int8x16_t g = vcombine_s8(vld1_s8(g0), vld1_s8(g1));
    const int8x16_t delta = vcombine_s8(vdup_n_s8(neg0 ? -1 : 1), vdup_n_s8(neg1 ? -1 : 1));
    return vaddq_s8(vshlq_n_s8(g, 3), delta);
}

ALWAYS_INLINE int64_t iq_block_bytes(mg_format f) {
    switch (f) {
    case MG_IQ2_XXS: return 66;
    case MG_IQ2_XS: return 74;
    case MG_IQ2_S: return 82;
    case MG_IQ3_XXS: return 98;
    case MG_IQ3_S: return 110;
    case MG_IQ1_S: return 50;
    default: return 56; /* MG_IQ1_M */
    }
}

/* The block's d (IQ1_M keeps its f16 in the top nibbles of the scale words). */
ALWAYS_INLINE float iq_d(mg_format f, const uint8_t *p) { return f == MG_IQ1_M ? mg_ggml_iq1_m_d(p) : f16_at(p); }

/* Elements 32 ib .. 32 ib + 31 of the block at p (d: iq_d) as codes, and the factors of their two
 * halves in s (equal for the formats with one scale per 32). */
ALWAYS_INLINE codes32 iq_codes(mg_format f, const uint8_t *p, float d, int ib, float s[2]) {
    codes32 c;
    switch (f) {
    case MG_IQ2_XXS: { /* 4 grid indices, then a u32: four 7-bit sign fields and the scale on top */
        const uint8_t *q = p + 2 + 8 * ib;
        uint32_t aux;
        memcpy(&aux, q + 4, 4);
        c = signed_codes(grid8x2(mg_iq2xxs_grid[q[0]], mg_iq2xxs_grid[q[1]]),
                         grid8x2(mg_iq2xxs_grid[q[2]], mg_iq2xxs_grid[q[3]]), ksigns4(aux));
        s[0] = s[1] = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        break;
    }
    case MG_IQ2_XS: { /* 4 u16 codes: 9-bit index, 7 sign bits; a scale nibble per 16 elements */
        uint16_t k[4];
        memcpy(k, p + 2 + 8 * ib, 8);
        const uint32_t s4 = (uint32_t)mg_iq2_ksigns[k[0] >> 9] | (uint32_t)mg_iq2_ksigns[k[1] >> 9] << 8 |
                            (uint32_t)mg_iq2_ksigns[k[2] >> 9] << 16 | (uint32_t)mg_iq2_ksigns[k[3] >> 9] << 24;
        c = signed_codes(grid8x2(mg_iq2xs_grid[k[0] & 511], mg_iq2xs_grid[k[1] & 511]),
                         grid8x2(mg_iq2xs_grid[k[2] & 511], mg_iq2xs_grid[k[3] & 511]), s4);
        const uint8_t sc = p[66 + ib];
        s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
        s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        break;
    }
    case MG_IQ2_S: { /* index: qs byte | 2 bits of qh[ib]; sign bytes stored; scale nibbles */
        const uint8_t *qs = p + 2 + 4 * ib, qh = p[66 + ib], sc = p[74 + ib];
        uint32_t s4;
        memcpy(&s4, p + 34 + 4 * ib, 4);
        c = signed_codes(grid8x2(mg_iq2s_grid[qs[0] | ((qh << 8) & 0x300)], mg_iq2s_grid[qs[1] | ((qh << 6) & 0x300)]),
                         grid8x2(mg_iq2s_grid[qs[2] | ((qh << 4) & 0x300)], mg_iq2s_grid[qs[3] | ((qh << 2) & 0x300)]),
                         s4);
        s[0] = d * (0.5f + (float)(sc & 15)) * 0.25f;
        s[1] = d * (0.5f + (float)(sc >> 4)) * 0.25f;
        break;
    }
    case MG_IQ3_XXS: { /* 8 grid indices of 4 elements; the u32 as IQ2_XXS's, at the block's end */
        const uint8_t *q = p + 2 + 8 * ib;
        uint32_t aux;
        memcpy(&aux, p + 66 + 4 * ib, 4);
        c = signed_codes(grid4x4(mg_iq3xxs_grid[q[0]], mg_iq3xxs_grid[q[1]], mg_iq3xxs_grid[q[2]], mg_iq3xxs_grid[q[3]]),
                         grid4x4(mg_iq3xxs_grid[q[4]], mg_iq3xxs_grid[q[5]], mg_iq3xxs_grid[q[6]], mg_iq3xxs_grid[q[7]]),
                         ksigns4(aux));
        s[0] = s[1] = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        break;
    }
    case MG_IQ3_S: { /* index: qs byte | bit j of qh[ib]; sign bytes stored; a scale nibble per 32 */
        const uint8_t *q = p + 2 + 8 * ib, qh = p[66 + ib];
        uint32_t s4;
        memcpy(&s4, p + 74 + 4 * ib, 4);
#define G3(j) mg_iq3s_grid[q[j] | ((qh << (8 - (j))) & 0x100)]
        c = signed_codes(grid4x4(G3(0), G3(1), G3(2), G3(3)), grid4x4(G3(4), G3(5), G3(6), G3(7)), s4);
#undef G3
        s[0] = s[1] = d * (float)(1 + 2 * ((p[106 + ib / 2] >> (4 * (ib & 1))) & 15));
        break;
    }
    case MG_IQ1_S: { /* 4 index bytes; a u16: 3 high bits per group, scale bits 12..14, delta sign 15 */
        const uint8_t *q = p + 2 + 4 * ib;
        uint16_t qh;
        memcpy(&qh, p + 34 + 2 * ib, 2);
        const int neg = qh >> 15;
        c.v[0] = iq1_codes16(mg_iq1s_grid[q[0] | ((qh << 8) & 0x700)], mg_iq1s_grid[q[1] | ((qh << 5) & 0x700)], neg, neg);
        c.v[1] = iq1_codes16(mg_iq1s_grid[q[2] | ((qh << 2) & 0x700)], mg_iq1s_grid[q[3] | ((qh >> 1) & 0x700)], neg, neg);
        s[0] = s[1] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        break;
    }
    default: { /* MG_IQ1_M: 4 index bytes; a nibble per group (3 high bits, delta sign); 3-bit
                * scales per 16 in the scale words' low 12 bits */
        const uint8_t *q = p + 4 * ib, h0 = p[32 + 2 * ib], h1 = p[33 + 2 * ib];
        uint16_t w;
        memcpy(&w, p + 48 + 2 * (ib / 2), 2);
        c.v[0] = iq1_codes16(mg_iq1s_grid[q[0] | ((h0 << 8) & 0x700)], mg_iq1s_grid[q[1] | ((h0 << 4) & 0x700)], h0 & 0x08,
                             h0 & 0x80);
        c.v[1] = iq1_codes16(mg_iq1s_grid[q[2] | ((h1 << 8) & 0x700)], mg_iq1s_grid[q[3] | ((h1 << 4) & 0x700)], h1 & 0x08,
                             h1 & 0x80);
        const int sh = 6 * (ib & 1);
        s[0] = d * (float)(2 * ((w >> sh) & 7) + 1) * 0.125f;
        s[1] = d * (float)(2 * ((w >> (sh + 3)) & 7) + 1) * 0.125f;
        break;
    }
    }
    return c;
}

#endif
