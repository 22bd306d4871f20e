/* The ggml block formats' codes on NEON, shared by ggml_neon.c (fp32 and int8 rows, prefill's
 * exact dequantisation) and q8_decode_neon.c (the int8 GEMM's block decoders): every 32 elements
 * become two int8x16 of signed codes in element order (codes32, neon.h), and the scales of a
 * block its per-sub-block factors, as the scalar decoders in core/ggml_blocks.h compute them.
 * Include only from the NEON kernel files (after kernels/neon/neon.h). */
#ifndef MG_KERNELS_NEON_GGML_CODES_H
#define MG_KERNELS_NEON_GGML_CODES_H

#include "kernels/neon/neon.h"
#include "core/ggml_blocks.h"

static const int8_t Q4_0_VALUES[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/* Q4_0-ordered nibbles (element i: low nibble of byte i, element 16 + i its high nibble) through
 * a 16-entry value table. */
ALWAYS_INLINE codes32 nib_lut(const uint8_t *p, const int8_t *table) {
    const uint8x16_t b = vld1q_u8(p), t = vreinterpretq_u8_s8(vld1q_s8(table));
    codes32 c = {{vreinterpretq_s8_u8(vqtbl1q_u8(t, vandq_u8(b, vdupq_n_u8(15)))),
                  vreinterpretq_s8_u8(vqtbl1q_u8(t, vshrq_n_u8(b, 4)))}};
    return c;
}

/* Q5_0's 32 fifth bits as 0x10 bytes, 16 elements per vector. */
ALWAYS_INLINE uint8x16_t q5_0_bits(uint32_t qh, int half) {
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x8_t b0 = vdup_n_u8((uint8_t)(qh >> (16 * half))), b1 = vdup_n_u8((uint8_t)(qh >> (16 * half + 8)));
    const uint8x16_t m = vtstq_u8(vcombine_u8(b0, b1), vld1q_u8(bit));
    return vandq_u8(m, vdupq_n_u8(0x10));
}

/* Q4_1: the unsigned nibbles (0..15) of qs[16] in Q4_0's element order; the min is added apart. */
ALWAYS_INLINE codes32 nib_u(const uint8_t *qs) {
    const uint8x16_t b = vld1q_u8(qs);
    codes32 c = {{vreinterpretq_s8_u8(vandq_u8(b, vdupq_n_u8(15))), vreinterpretq_s8_u8(vshrq_n_u8(b, 4))}};
    return c;
}

/* Q5_0 / Q5_1: the unsigned 5-bit codes (0..31) from the u32 qh at qhp and qs[16]. */
ALWAYS_INLINE codes32 codes_q5_u(const uint8_t *qhp, const uint8_t *qs) {
    uint32_t qh;
    memcpy(&qh, qhp, 4);
    const uint8x16_t b = vld1q_u8(qs);
    const uint8x16_t lo = vorrq_u8(vandq_u8(b, vdupq_n_u8(15)), q5_0_bits(qh, 0));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(b, 4), q5_0_bits(qh, 1));
    codes32 c = {{vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi)}};
    return c;
}

ALWAYS_INLINE codes32 codes_q5_0(const uint8_t *p) {
    codes32 c = codes_q5_u(p + 2, p + 6);
    for (int h = 0; h < 2; h++) c.v[h] = vsubq_s8(c.v[h], vdupq_n_s8(16));
    return c;
}

ALWAYS_INLINE codes32 codes_q8_0(const uint8_t *p) {
    codes32 c = {{vld1q_s8((const int8_t *)p + 2), vld1q_s8((const int8_t *)p + 18)}};
    return c;
}

/* Q4_K / Q5_K: the 32 codes of sub-block j: nibble j & 1 of qs[32 * (j / 2) ..], plus (q5) bit j
 * of qh[0..32) as 16. */
ALWAYS_INLINE codes32 codes_k4(const uint8_t *qs, const uint8_t *qh, int j) {
    codes32 c;
    for (int h = 0; h < 2; h++) {
        const uint8x16_t b = vld1q_u8(qs + 32 * (j / 2) + 16 * h);
        uint8x16_t q = (j & 1) ? vshrq_n_u8(b, 4) : vandq_u8(b, vdupq_n_u8(15));
        if (qh) q = vorrq_u8(q, vandq_u8(vtstq_u8(vld1q_u8(qh + 16 * h), vdupq_n_u8((uint8_t)(1u << j))), vdupq_n_u8(0x10)));
        c.v[h] = vreinterpretq_s8_u8(q);
    }
    return c;
}

/* Q6_K: group g (0..3) of half h: 32 codes minus 32. */
ALWAYS_INLINE codes32 codes_q6_k(const uint8_t *b, int h, int g) {
    codes32 c;
    for (int k = 0; k < 2; k++) {
        const uint8x16_t l = vld1q_u8(b + 64 * h + 32 * (g & 1) + 16 * k);
        const uint8x16_t hb = vld1q_u8(b + 128 + 32 * h + 16 * k);
        const uint8x16_t lo = (g & 2) ? vshrq_n_u8(l, 4) : vandq_u8(l, vdupq_n_u8(15));
        const uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3));
        c.v[k] = vreinterpretq_s8_u8(vsubq_u8(vorrq_u8(lo, vshlq_n_u8(hi, 4)), vdupq_n_u8(32)));
    }
    return c;
}

/* Q2_K / Q3_K: the low 2 bits of half k (16 elements) of group g (0..7) of a block, whose
 * element 32g + l is bits 2(g % 4).. of qs[32(g / 4) + l]. */
ALWAYS_INLINE uint8x16_t bits2(const uint8_t *qs, int g, int k) {
    const uint8x16_t b = vld1q_u8(qs + 32 * (g / 4) + 16 * k);
    return vandq_u8(vshlq_u8(b, vdupq_n_s8((int8_t)(-2 * (g % 4)))), vdupq_n_u8(3));
}

ALWAYS_INLINE codes32 codes_q2_k(const uint8_t *p, int g) {
    codes32 c = {{vreinterpretq_s8_u8(bits2(p + 16, g, 0)), vreinterpretq_s8_u8(bits2(p + 16, g, 1))}};
    return c;
}

/* Q3_K: group g's codes -4..3: the 2 low bits minus 4 where bit g of hmask[l] is clear. */
ALWAYS_INLINE codes32 codes_q3_k(const uint8_t *p, int g) {
    codes32 c;
    for (int k = 0; k < 2; k++) {
        const uint8x16_t set = vtstq_u8(vld1q_u8(p + 16 * k), vdupq_n_u8((uint8_t)(1u << g)));
        c.v[k] = vreinterpretq_s8_u8(vsubq_u8(bits2(p + 32, g, k), vbicq_u8(vdupq_n_u8(4), set)));
    }
    return c;
}

ALWAYS_INLINE void k4_scales(const uint8_t *s, float d, float dmin, float ds[8], float dm[8]) {
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        mg_ggml_k4_scale_min(s, j, &sc, &m);
        ds[j] = d * (float)sc;
        dm[j] = dmin * (float)m;
    }
}

/* Q2_K: the 16 sub-block scales d*sc and mins dmin*m (both exact). */
ALWAYS_INLINE void q2_k_scales(const uint8_t *p, float ds[16], float dm[16]) {
    const float d = f16_at(p + 80), dmin = f16_at(p + 82);
    for (int i = 0; i < 16; i++) ds[i] = d * (float)(p[i] & 15), dm[i] = dmin * (float)(p[i] >> 4);
}

/* Q3_K: the 16 signed 6-bit scales (the scalar unpacking: 16 per 256 weights). */
ALWAYS_INLINE void q3_k_scales(const uint8_t *p, int k[16]) {
    for (int i = 0; i < 16; i++) k[i] = mg_ggml_q3_k_scale(p + 96, i);
}

ALWAYS_INLINE void iq4_xs_scales(const uint8_t *b, float d, float dl[8]) {
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    for (int j = 0; j < 8; j++) {
        const int s = ((b[4 + j / 2] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4);
        dl[j] = d * (float)(s - 32);
    }
}

/* The formats whose 32-element block has one scale, as X(format, block bytes, the scale and the
 * codes of the block at p): the case lists of the fp32 decode (ggml_neon.c) and of the int8 rows
 * (q8_rows_neon.h). */
#define MG_NEON_FORMATS32(X)                                                  \
    X(MG_Q8_0, 34, f16_at(p), codes_q8_0(p))                                  \
    X(MG_Q4_0, 18, f16_at(p), nib_lut(p + 2, Q4_0_VALUES))                    \
    X(MG_Q5_0, 22, f16_at(p), codes_q5_0(p))                                  \
    X(MG_IQ4_NL, 18, f16_at(p), nib_lut(p + 2, MG_IQ4NL_VALUES))              \
    X(MG_MXFP4, 17, MG_E8M0_HALF[p[0]], nib_lut(p + 1, MG_MXFP4_VALUES2))

#endif
