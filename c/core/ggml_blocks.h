/* Scalar decoding of one block of each ggml block format (docs/reference/gguf.md §2) into floats:
 * the ground truth of every block-format kernel.
 *
 * The values equal gguf-py's gguf.quants.dequantize bit for bit.  That holds whatever order the
 * products are taken in, and with or without FMA contraction, because every value here is one
 * rounding of an exact expression: a d (f16, 11 significant bits) times a sub-scale (<= 8 bits)
 * is exact in fp32, and so is dmin times a min; only the final product with the code (or the
 * final subtraction of dmin*m in Q4_K/Q5_K) rounds.  We still follow gguf-py's order (d*sc
 * first, then *q, then - dmin*m) so the code reads like the reference.  MXFP4's scale can be a
 * denormal (e8m0 bytes 0 and 1): the kernels must not run with flush-to-zero.
 *
 * Blocks start at any byte (GGUF aligns tensors to 32 bytes only, and blocks are 17..210 bytes),
 * so every multi-byte field is read through memcpy. */
#ifndef MG_GGML_BLOCKS_H
#define MG_GGML_BLOCKS_H

#include <stdint.h>
#include <string.h>
#include "formats.h"
#include "iq_grids.h"

/* IQ4_NL / IQ4_XS: the 16 non-linear int8 values a code selects. */
static const int8_t MG_IQ4NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
/* MXFP4: the e2m1 values doubled (so integers), paired with a scale of 2^(e-128). */
static const int8_t MG_MXFP4_VALUES2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float mg_ggml_f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return mg_f16_to_f32(h);
}

/* 2^(e-128) for an e8m0 byte: half the block scale, to go with MG_MXFP4_VALUES2.  Bytes 0 and 1
 * give the denormals 2^-128 and 2^-127; 255 gives 2^127 (gguf-py has no NaN code here). */
static inline float mg_ggml_e8m0_half(uint8_t e) {
    uint32_t u = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* mg_ggml_e8m0_half of every byte, for the SIMD MXFP4 loops: one indexed load per 32 weights
 * instead of the compare, shift and select above, which took ~15 % of the avx512 fp32 MXFP4
 * row loop (perf, DeepSeek-V4 GGUF decode).  Bit for bit the function's values, denormals
 * included (tests/c/test_ggml_blocks.c checks all 256); one 1 KiB copy per translation unit
 * that reads it. */
static const float MG_E8M0_HALF[256] = {
    0x1p-128f, 0x1p-127f, 0x1p-126f, 0x1p-125f, 0x1p-124f, 0x1p-123f, 0x1p-122f, 0x1p-121f,
    0x1p-120f, 0x1p-119f, 0x1p-118f, 0x1p-117f, 0x1p-116f, 0x1p-115f, 0x1p-114f, 0x1p-113f,
    0x1p-112f, 0x1p-111f, 0x1p-110f, 0x1p-109f, 0x1p-108f, 0x1p-107f, 0x1p-106f, 0x1p-105f,
    0x1p-104f, 0x1p-103f, 0x1p-102f, 0x1p-101f, 0x1p-100f, 0x1p-99f, 0x1p-98f, 0x1p-97f,
    0x1p-96f, 0x1p-95f, 0x1p-94f, 0x1p-93f, 0x1p-92f, 0x1p-91f, 0x1p-90f, 0x1p-89f,
    0x1p-88f, 0x1p-87f, 0x1p-86f, 0x1p-85f, 0x1p-84f, 0x1p-83f, 0x1p-82f, 0x1p-81f,
    0x1p-80f, 0x1p-79f, 0x1p-78f, 0x1p-77f, 0x1p-76f, 0x1p-75f, 0x1p-74f, 0x1p-73f,
    0x1p-72f, 0x1p-71f, 0x1p-70f, 0x1p-69f, 0x1p-68f, 0x1p-67f, 0x1p-66f, 0x1p-65f,
    0x1p-64f, 0x1p-63f, 0x1p-62f, 0x1p-61f, 0x1p-60f, 0x1p-59f, 0x1p-58f, 0x1p-57f,
    0x1p-56f, 0x1p-55f, 0x1p-54f, 0x1p-53f, 0x1p-52f, 0x1p-51f, 0x1p-50f, 0x1p-49f,
    0x1p-48f, 0x1p-47f, 0x1p-46f, 0x1p-45f, 0x1p-44f, 0x1p-43f, 0x1p-42f, 0x1p-41f,
    0x1p-40f, 0x1p-39f, 0x1p-38f, 0x1p-37f, 0x1p-36f, 0x1p-35f, 0x1p-34f, 0x1p-33f,
    0x1p-32f, 0x1p-31f, 0x1p-30f, 0x1p-29f, 0x1p-28f, 0x1p-27f, 0x1p-26f, 0x1p-25f,
    0x1p-24f, 0x1p-23f, 0x1p-22f, 0x1p-21f, 0x1p-20f, 0x1p-19f, 0x1p-18f, 0x1p-17f,
    0x1p-16f, 0x1p-15f, 0x1p-14f, 0x1p-13f, 0x1p-12f, 0x1p-11f, 0x1p-10f, 0x1p-9f,
    0x1p-8f, 0x1p-7f, 0x1p-6f, 0x1p-5f, 0x1p-4f, 0x1p-3f, 0x1p-2f, 0x1p-1f,
    0x1p0f, 0x1p1f, 0x1p2f, 0x1p3f, 0x1p4f, 0x1p5f, 0x1p6f, 0x1p7f,
    0x1p8f, 0x1p9f, 0x1p10f, 0x1p11f, 0x1p12f, 0x1p13f, 0x1p14f, 0x1p15f,
    0x1p16f, 0x1p17f, 0x1p18f, 0x1p19f, 0x1p20f, 0x1p21f, 0x1p22f, 0x1p23f,
    0x1p24f, 0x1p25f, 0x1p26f, 0x1p27f, 0x1p28f, 0x1p29f, 0x1p30f, 0x1p31f,
    0x1p32f, 0x1p33f, 0x1p34f, 0x1p35f, 0x1p36f, 0x1p37f, 0x1p38f, 0x1p39f,
    0x1p40f, 0x1p41f, 0x1p42f, 0x1p43f, 0x1p44f, 0x1p45f, 0x1p46f, 0x1p47f,
    0x1p48f, 0x1p49f, 0x1p50f, 0x1p51f, 0x1p52f, 0x1p53f, 0x1p54f, 0x1p55f,
    0x1p56f, 0x1p57f, 0x1p58f, 0x1p59f, 0x1p60f, 0x1p61f, 0x1p62f, 0x1p63f,
    0x1p64f, 0x1p65f, 0x1p66f, 0x1p67f, 0x1p68f, 0x1p69f, 0x1p70f, 0x1p71f,
    0x1p72f, 0x1p73f, 0x1p74f, 0x1p75f, 0x1p76f, 0x1p77f, 0x1p78f, 0x1p79f,
    0x1p80f, 0x1p81f, 0x1p82f, 0x1p83f, 0x1p84f, 0x1p85f, 0x1p86f, 0x1p87f,
    0x1p88f, 0x1p89f, 0x1p90f, 0x1p91f, 0x1p92f, 0x1p93f, 0x1p94f, 0x1p95f,
    0x1p96f, 0x1p97f, 0x1p98f, 0x1p99f, 0x1p100f, 0x1p101f, 0x1p102f, 0x1p103f,
    0x1p104f, 0x1p105f, 0x1p106f, 0x1p107f, 0x1p108f, 0x1p109f, 0x1p110f, 0x1p111f,
    0x1p112f, 0x1p113f, 0x1p114f, 0x1p115f, 0x1p116f, 0x1p117f, 0x1p118f, 0x1p119f,
    0x1p120f, 0x1p121f, 0x1p122f, 0x1p123f, 0x1p124f, 0x1p125f, 0x1p126f, 0x1p127f,
};

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes: j < 4 in
 * the low 6 bits of bytes j (scale) and 4+j (min); j >= 4 from the nibbles of byte 4+j plus the
 * top 2 bits of bytes j-4 and j. */
static inline void mg_ggml_k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30));
        *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30));
    }
}

/* All 8 sub-block scales and mins of a Q4_K / Q5_K block at once (as mg_ggml_k4_scale_min for
 * j = 0..7), for the SIMD kernels: 32-bit shifts move bits across bytes, and the masks keep only
 * each byte's own. */
static inline void mg_ggml_k4_scales_mins(const uint8_t *s, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a, b, c;
    memcpy(&a, s, 4);
    memcpy(&b, s + 4, 4);
    memcpy(&c, s + 8, 4);
    const uint32_t sc_lo = a & 0x3f3f3f3fu, mn_lo = b & 0x3f3f3f3fu;
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    memcpy(sc, &sc_lo, 4), memcpy(sc + 4, &sc_hi, 4);
    memcpy(mn, &mn_lo, 4), memcpy(mn + 4, &mn_hi, 4);
}

/* Where the codes of a block of 32 start (the bytes of Q8_0, the 16 nibble bytes of the others):
 * after the f16 d (MXFP4: the e8m0 byte), Q4_1 / Q5_1's f16 min and Q5_0 / Q5_1's u32 qh. */
static inline size_t mg_ggml_qs_at(mg_format f) {
    switch (f) {
    case MG_MXFP4: return 1;
    case MG_Q4_1: return 4;
    case MG_Q5_0: return 6;
    case MG_Q5_1: return 8;
    default: return 2; /* Q8_0, Q4_0, IQ4_NL */
    }
}

/* Q8_0 (34 bytes): f16 d, int8 q[32]; d * q. */
static inline void mg_ggml_block_q8_0(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int i = 0; i < 32; i++) out[i] = (float)(int8_t)b[2 + i] * d;
}

/* Q4_0 (18 bytes): f16 d, qs[16]; element i < 16 is the low nibble of byte i, i + 16 its high
 * nibble; d * (q - 8). */
static inline void mg_ggml_block_q4_0(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)((b[2 + i] & 15) - 8);
        out[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
    }
}

/* Q5_0 (22 bytes): f16 d, u32 qh (bit i: 5th bit of element i), qs[16] as Q4_0; d * (q - 16). */
static inline void mg_ggml_block_q5_0(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    for (int i = 0; i < 16; i++) {
        const int lo = (b[6 + i] & 15) | (int)(((qh >> i) & 1) << 4);
        const int hi = (b[6 + i] >> 4) | (int)(((qh >> (i + 16)) & 1) << 4);
        out[i] = d * (float)(lo - 16);
        out[i + 16] = d * (float)(hi - 16);
    }
}

/* Q4_K (144 bytes): f16 d, f16 dmin, 12 scale bytes, qs[128].  Four 64-element chunks of 32
 * bytes: element l (< 32) of the chunk is the low nibble of byte l (sub-block 2c), element
 * 32 + l the high nibble (sub-block 2c + 1); (d*sc) * q - dmin*m. */
static inline void mg_ggml_block_q4_k(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b), dmin = mg_ggml_f16_at(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        mg_ggml_k4_scale_min(s, j, &sc, &m);
        const float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) out[32 * j + l] = ds * (float)((q[l] >> shift) & 15) - dm;
    }
}

/* Q5_K (176 bytes): Q4_K with qh[32] before qs: bit j of qh[l] is the 5th bit of element l of
 * sub-block j. */
static inline void mg_ggml_block_q5_k(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b), dmin = mg_ggml_f16_at(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        mg_ggml_k4_scale_min(s, j, &sc, &m);
        const float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++) {
            const int v = ((q[l] >> shift) & 15) | (((qh[l] >> j) & 1) << 4);
            out[32 * j + l] = ds * (float)v - dm;
        }
    }
}

/* Q6_K (210 bytes): ql[128], qh[64], int8 scales[16], f16 d last.  Two halves of 128 elements
 * (ql + 64h, qh + 32h); element e of a half: low 4 bits from ql[e % 64] (low nibble for e < 64,
 * high above), top 2 bits from qh[e % 32] >> (2 * (e / 32)); (d*scale[e/16]) * (q - 32). */
static inline void mg_ggml_block_q6_k(const uint8_t *b, float *out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = mg_ggml_f16_at(b + 208);
    for (int h = 0; h < 2; h++) {
        for (int e = 0; e < 128; e++) {
            const int lo = (ql[64 * h + e % 64] >> (4 * (e / 64))) & 15;
            const int hi = (qh[32 * h + e % 32] >> (2 * (e / 32))) & 3;
            const int i = 128 * h + e;
            out[i] = (d * (float)sc[i / 16]) * (float)((lo | (hi << 4)) - 32);
        }
    }
}

/* MXFP4 in GGUF's layout (17 bytes): e8m0 e, qs[16] in Q4_0's nibble order;
 * 2^(e-128) * (2 * e2m1 value). */
static inline void mg_ggml_block_mxfp4(const uint8_t *b, float *out) {
    const float d = mg_ggml_e8m0_half(b[0]);
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)MG_MXFP4_VALUES2[b[1 + i] & 15];
        out[i + 16] = d * (float)MG_MXFP4_VALUES2[b[1 + i] >> 4];
    }
}

/* IQ4_NL (18 bytes): f16 d, qs[16] in Q4_0's nibble order; d * table[q]. */
static inline void mg_ggml_block_iq4_nl(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)MG_IQ4NL_VALUES[b[2 + i] & 15];
        out[i + 16] = d * (float)MG_IQ4NL_VALUES[b[2 + i] >> 4];
    }
}

/* IQ4_XS (136 bytes): f16 d, u16 scales_h, scales_l[4], qs[128].  Eight sub-blocks of 32, each
 * 16 bytes of qs in Q4_0's nibble order, with the 6-bit scale (nibble j%2 of scales_l[j/2]) |
 * (bits 2j..2j+1 of scales_h) << 4, minus 32; (d * scale) * table[q]. */
static inline void mg_ggml_block_iq4_xs(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int j = 0; j < 8; j++) {
        const int s = ((sl[j / 2] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4);
        const float dl = d * (float)(s - 32);
        const uint8_t *q = qs + 16 * j;
        for (int l = 0; l < 16; l++) {
            out[32 * j + l] = dl * (float)MG_IQ4NL_VALUES[q[l] & 15];
            out[32 * j + 16 + l] = dl * (float)MG_IQ4NL_VALUES[q[l] >> 4];
        }
    }
}

/* Q4_1 (20 bytes): f16 d, f16 m, qs[16] as Q4_0; d * q + m (d * q is exact: one rounding). */
static inline void mg_ggml_block_q4_1(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b), m = mg_ggml_f16_at(b + 2);
    for (int i = 0; i < 16; i++) {
        out[i] = d * (float)(b[4 + i] & 15) + m;
        out[i + 16] = d * (float)(b[4 + i] >> 4) + m;
    }
}

/* Q5_1 (24 bytes): f16 d, f16 m, u32 qh, qs[16] as Q5_0; d * q + m. */
static inline void mg_ggml_block_q5_1(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b), m = mg_ggml_f16_at(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    for (int i = 0; i < 16; i++) {
        const int lo = (b[8 + i] & 15) | (int)(((qh >> i) & 1) << 4);
        const int hi = (b[8 + i] >> 4) | (int)(((qh >> (i + 16)) & 1) << 4);
        out[i] = d * (float)lo + m;
        out[i + 16] = d * (float)hi + m;
    }
}

/* Q2_K (84 bytes): scales[16] (low nibble: scale, high: min of sub-block i of 16 elements),
 * qs[64], f16 d, f16 dmin.  Element 128h + 32s + l (h < 2, s < 4, l < 32) is bits 2s..2s+1 of
 * qs[32h + l]; (d*sc) * q - dmin*m (both products exact, one rounding). */
static inline void mg_ggml_block_q2_k(const uint8_t *b, float *out) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = mg_ggml_f16_at(b + 80), dmin = mg_ggml_f16_at(b + 82);
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, s = (i / 32) % 4, l = i % 32;
        const int q = (qs[32 * h + l] >> (2 * s)) & 3;
        const float dl = d * (float)(sc[i / 16] & 15), ml = dmin * (float)(sc[i / 16] >> 4);
        out[i] = dl * (float)q - ml;
    }
}

/* Q3_K: the 6-bit scale of sub-block i (0..15) from its 12 packed bytes: the low 4 bits are
 * nibble i / 8 of byte i % 8, the top 2 bits are bits 2(i / 4).. of byte 8 + i % 4; minus 32. */
static inline int mg_ggml_q3_k_scale(const uint8_t *s, int i) {
    const int lo = (s[i % 8] >> (4 * (i / 8))) & 15, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Q3_K (110 bytes): hmask[32], qs[64], scales[12], f16 d.  Element 128h + 32s + l has the low
 * 2 bits of Q2_K's element there and the high bit (h * 4 + s of hmask[l]); a clear high bit
 * subtracts 4, so q is in -4..3; (d * scale) * q, exact. */
static inline void mg_ggml_block_q3_k(const uint8_t *b, float *out) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    const float d = mg_ggml_f16_at(b + 108);
    for (int i = 0; i < 256; i++) {
        const int h = i / 128, s = (i / 32) % 4, l = i % 32;
        const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - (((hm[l] >> (4 * h + s)) & 1) ? 0 : 4);
        out[i] = (d * (float)mg_ggml_q3_k_scale(sc, i / 16)) * (float)q;
    }
}

/* ---- the IQ1 / IQ2 / IQ3 grid formats (256 elements; codebooks in core/iq_grids.h) ----------
 * Each group of 8 (IQ2, IQ1) or 4 (IQ3) elements is one codebook entry; a sign bit per element
 * flips it.  Value = (d * sub-scale factor) * entry, the factor exact in fp32 (an f16 d times
 * at most 5 bits, then times 1/4 or 1/2), so one rounding, as in gguf-py. */

/* The 8 signs of IQ2_XXS / IQ2_XS / IQ3_XXS group: 7 stored bits -> an even-parity byte. */
static inline float mg_iq_sign(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }

/* IQ2_XXS (66 bytes): f16 d, then per 32 elements 8 bytes: 4 grid indices, and a u32 whose 4
 * 7-bit fields (bits 7l..) pick the signs of group l and whose top 4 bits are the scale s;
 * factor d * (0.5 + s) * 0.25. */
static inline void mg_ggml_block_iq2_xxs(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *q = b + 2 + 8 * ib;
        uint32_t aux;
        memcpy(&aux, q + 4, 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            const uint8_t *g = mg_iq2xxs_grid[q[l]], signs = mg_iq2_ksigns[(aux >> (7 * l)) & 127];
            for (int j = 0; j < 8; j++) out[32 * ib + 8 * l + j] = db * (float)g[j] * mg_iq_sign(signs, j);
        }
    }
}

/* IQ2_XS (74 bytes): f16 d, 32 u16 codes (9-bit grid index, 7 sign-pattern bits), 8 scale bytes
 * (low nibble: the first 16 elements of the 32, high: the second). */
static inline void mg_ggml_block_iq2_xs(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int k = 0; k < 32; k++) {
        uint16_t code;
        memcpy(&code, b + 2 + 2 * k, 2);
        const int s = (b[66 + k / 4] >> (4 * ((k / 2) & 1))) & 15;
        const float db = d * (0.5f + (float)s) * 0.25f;
        const uint8_t *g = mg_iq2xs_grid[code & 511], signs = mg_iq2_ksigns[code >> 9];
        for (int j = 0; j < 8; j++) out[8 * k + j] = db * (float)g[j] * mg_iq_sign(signs, j);
    }
}

/* IQ2_S (82 bytes): f16 d, qs[32] (low 8 bits of each group's 10-bit grid index), signs[32] (one
 * byte per group, bit j flips element j), qh[8] (2 high index bits per group), scales[8] (a
 * nibble per 16 elements, as IQ2_XS). */
static inline void mg_ggml_block_iq2_s(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *sc = b + 74;
    for (int k = 0; k < 32; k++) {
        const int idx = qs[k] | (((qh[k / 4] >> (2 * (k % 4))) & 3) << 8);
        const int s = (sc[k / 4] >> (4 * ((k / 2) & 1))) & 15;
        const float db = d * (0.5f + (float)s) * 0.25f;
        const uint8_t *g = mg_iq2s_grid[idx];
        for (int j = 0; j < 8; j++) out[8 * k + j] = db * (float)g[j] * mg_iq_sign(signs[k], j);
    }
}

/* IQ3_XXS (98 bytes): f16 d, qs[64] (one grid index per 4 elements), then per 32 elements a u32:
 * 4 7-bit sign fields (group l of 8 elements) and the scale s in the top 4 bits; factor
 * d * (0.5 + s) * 0.5. */
static inline void mg_ggml_block_iq3_xxs(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    const uint8_t *qs = b + 2;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        memcpy(&aux, b + 66 + 4 * ib, 4);
        const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        for (int l = 0; l < 4; l++) {
            const uint8_t signs = mg_iq2_ksigns[(aux >> (7 * l)) & 127];
            const uint8_t *g0 = mg_iq3xxs_grid[qs[8 * ib + 2 * l]], *g1 = mg_iq3xxs_grid[qs[8 * ib + 2 * l + 1]];
            float *o = out + 32 * ib + 8 * l;
            for (int j = 0; j < 4; j++) {
                o[j] = db * (float)g0[j] * mg_iq_sign(signs, j);
                o[j + 4] = db * (float)g1[j] * mg_iq_sign(signs, j + 4);
            }
        }
    }
}

/* IQ3_S (110 bytes): f16 d, qs[64] (low 8 bits of a 9-bit grid index per 4 elements), qh[8]
 * (the 9th bits, bit k % 8 of qh[k / 8]), signs[32] (bit j of byte m flips element 8m + j),
 * scales[4] (a nibble per 32 elements); factor d * (1 + 2s). */
static inline void mg_ggml_block_iq3_s(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *sc = b + 106;
    for (int k = 0; k < 64; k++) {
        const int idx = qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8);
        const int s = (sc[k / 16] >> (4 * ((k / 8) & 1))) & 15;
        const float db = d * (float)(1 + 2 * s);
        const uint8_t *g = mg_iq3s_grid[idx];
        for (int j = 0; j < 4; j++) {
            const int e = 4 * k + j;
            out[e] = db * (float)g[j] * mg_iq_sign(signs[e / 8], e % 8);
        }
    }
}

/* IQ1_S / IQ1_M: +-1/8, the shift of a group's -1 / 0 / +1 entries. */
#define MG_IQ1_DELTA 0.125f

/* IQ1_S (50 bytes): f16 d, qs[32] (low 8 bits of an 11-bit grid index per 8 elements), then per
 * 32 elements a u16: 3 high index bits per group (bits 3l..), a 3-bit scale s (bits 12..14) and
 * the delta's sign (bit 15); value (d * (2s + 1)) * (entry +- 1/8). */
static inline void mg_ggml_block_iq1_s(const uint8_t *b, float *out) {
    const float d = mg_ggml_f16_at(b);
    for (int ib = 0; ib < 8; ib++) {
        uint16_t qh;
        memcpy(&qh, b + 34 + 2 * ib, 2);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = qh & 0x8000 ? -MG_IQ1_DELTA : MG_IQ1_DELTA;
        for (int l = 0; l < 4; l++) {
            const int8_t *g = mg_iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; j++) out[32 * ib + 8 * l + j] = dl * ((float)g[j] + delta);
        }
    }
}

/* IQ1_M's f16 d: the top nibbles of its four u16 scale words, first word lowest. */
static inline float mg_ggml_iq1_m_d(const uint8_t *b) {
    uint16_t w[4];
    memcpy(w, b + 48, 8);
    const uint16_t h = (uint16_t)((w[0] >> 12) | ((w[1] >> 8) & 0x00f0) | ((w[2] >> 4) & 0x0f00) | (w[3] & 0xf000));
    return mg_f16_to_f32(h);
}

/* IQ1_M (56 bytes): qs[32] (low 8 bits of the grid index per 8 elements), qh[16] (a nibble per
 * group: 3 high index bits and the delta's sign in bit 3), 4 u16 words holding a 3-bit scale s
 * per 16 elements (bits 3i.. of word i / 4... see mg_ggml_iq1_m_d for the d in their top
 * nibbles); value (d * (2s + 1)) * (entry +- 1/8). */
static inline void mg_ggml_block_iq1_m(const uint8_t *b, float *out) {
    const float d = mg_ggml_iq1_m_d(b);
    uint16_t w[4];
    memcpy(w, b + 48, 8);
    for (int k = 0; k < 32; k++) {
        const int nib = (b[32 + k / 2] >> (4 * (k % 2))) & 15, s = (w[k / 8] >> (3 * ((k / 2) % 4))) & 7;
        const float dl = d * (float)(2 * s + 1);
        const float delta = nib & 8 ? -MG_IQ1_DELTA : MG_IQ1_DELTA;
        const int8_t *g = mg_iq1s_grid[b[k] | ((nib & 7) << 8)];
        for (int j = 0; j < 8; j++) out[8 * k + j] = dl * ((float)g[j] + delta);
    }
}

/* Decodes the block at b of format f (mg_format_is_ggml_block) into out[block elements];
 * returns 0, writing nothing, for any other format. */
static inline int mg_ggml_block_f32(mg_format f, const uint8_t *b, float *out) {
    switch (f) {
    case MG_Q8_0: mg_ggml_block_q8_0(b, out); return 1;
    case MG_Q4_0: mg_ggml_block_q4_0(b, out); return 1;
    case MG_Q5_0: mg_ggml_block_q5_0(b, out); return 1;
    case MG_Q4_K: mg_ggml_block_q4_k(b, out); return 1;
    case MG_Q5_K: mg_ggml_block_q5_k(b, out); return 1;
    case MG_Q6_K: mg_ggml_block_q6_k(b, out); return 1;
    case MG_MXFP4: mg_ggml_block_mxfp4(b, out); return 1;
    case MG_IQ4_NL: mg_ggml_block_iq4_nl(b, out); return 1;
    case MG_IQ4_XS: mg_ggml_block_iq4_xs(b, out); return 1;
    case MG_Q4_1: mg_ggml_block_q4_1(b, out); return 1;
    case MG_Q5_1: mg_ggml_block_q5_1(b, out); return 1;
    case MG_Q2_K: mg_ggml_block_q2_k(b, out); return 1;
    case MG_Q3_K: mg_ggml_block_q3_k(b, out); return 1;
    case MG_IQ2_XXS: mg_ggml_block_iq2_xxs(b, out); return 1;
    case MG_IQ2_XS: mg_ggml_block_iq2_xs(b, out); return 1;
    case MG_IQ2_S: mg_ggml_block_iq2_s(b, out); return 1;
    case MG_IQ3_XXS: mg_ggml_block_iq3_xxs(b, out); return 1;
    case MG_IQ3_S: mg_ggml_block_iq3_s(b, out); return 1;
    case MG_IQ1_S: mg_ggml_block_iq1_s(b, out); return 1;
    case MG_IQ1_M: mg_ggml_block_iq1_m(b, out); return 1;
    default: return 0;
    }
}

/* Decodes elements [c0, c0 + n) of a row of blocks (c0 and n multiples of the block size). */
static inline void mg_ggml_row_f32(mg_format f, const uint8_t *row, int64_t c0, int64_t n, float *out) {
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    for (int64_t c = 0; c < n; c += e) mg_ggml_block_f32(f, row + (size_t)((c0 + c) / e * bytes), out + c);
}

#endif
