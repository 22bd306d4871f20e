/* AVX2 block decoders of the int8 GEMM (kernels/q8_gemm.h) for the 32-element formats (Q8_0,
 * Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL, MXFP4) and the K-quants and IQ4_XS; the grid formats are
 * q8_decode_iq_avx2.c's.  Each gives mg_scalar_q8_decode's codes, fac and mn bit for bit.
 *
 * Codes: every 32 of them are one ymm in element order, stored with one unaligned store.  The
 * 16 nibble bytes of a 32-group are broadcast to both 128-bit lanes and the upper lane shifted
 * right by 4, so one mask gives [low nibbles | high nibbles] = elements 0..31 (nibbles32); the
 * 2-bit and 6-bit K-quant codes are 16-bit shifts and masks of one 32-byte load per group of
 * 32 (what a 16-bit shift carries in from the neighbouring byte is masked off).  Offsets (-8,
 * -16, -32, -4) are byte subtractions; IQ4_NL / IQ4_XS / MXFP4 values a vpshufb table.
 *
 * Factors: the K-quants' 8 or 16 per block are vector products of the block's f16 d (vcvtph2ps,
 * exact) and its integer sub-scales widened to i32 and converted: the scalar decoder's wd * k
 * (where its k is 1 and the sub-scale is in wd, times 1 changes nothing).  The 32-element
 * formats have one factor per block: 8 blocks' f16 scales go through one vcvtph2ps (Q4_1 / Q5_1:
 * their d, m pairs loaded 32 bits a block and split by vpshufb; the last < 8 blocks one by
 * one); MXFP4's e8m0 scale is MG_E8M0_HALF's value (exact, denormals too).
 *
 * Every load stays inside its block (a row's last block may end the mapping).  Throughput on
 * one row of 7168 columns (Zen 5, AVX2): ~50 Gweights/s (Q5_0, Q5_1) to ~100 (Q8_0, Q4_K), 17-100x
 * the scalar decoder. */
#include "kernels/tables.h"
#include "kernels/q8_gemm.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/unaligned.h"
#include "core/ggml_blocks.h"

INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE void store32(int8_t *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
INLINE float f16_at(const uint8_t *p) { return _cvtsh_ss((unsigned short)mg_ld16(p)); }
/* 8 integers (the low 8 bytes of v, unsigned or signed) as floats. */
INLINE __m256 u8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }
INLINE __m256 s8_ps(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
INLINE __m256 f16_bcast(const uint8_t *p) { return _mm256_set1_ps(f16_at(p)); }

/* The 16 nibble bytes at q as [low nibbles | high nibbles]: the 32 elements of a group. */
INLINE __m256i nibbles32(const uint8_t *q) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
}

/* Q5_0 / Q5_1: 0xff in byte i where bit i of qh is set (one byte of qh per 8 bytes, then the
 * byte's own bit selected). */
INLINE __m256i qh_mask32(uint32_t qh) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  /* low lane */
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3); /* high lane */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread), bit);
    return _mm256_cmpeq_epi8(b, bit);
}

/* ---- the 32-element formats: one group per block ---------------------------------------- */

INLINE size_t small_bytes(const mg_format f) {
    switch (f) {
    case MG_Q8_0: return 34;
    case MG_Q5_0: return 22;
    case MG_Q4_1: return 20;
    case MG_Q5_1: return 24;
    case MG_MXFP4: return 17;
    default: return 18; /* Q4_0, IQ4_NL */
    }
}

/* The 32 codes of block b (f a constant after inlining). */
INLINE void small_codes(const mg_format f, const uint8_t *b, int8_t *out) {
    const __m128i iq4 = _mm_loadu_si128((const __m128i *)MG_IQ4NL_VALUES);
    const __m128i fp4 = _mm_loadu_si128((const __m128i *)MG_MXFP4_VALUES2);
    __m256i c;
    switch (f) {
    case MG_Q8_0: c = load32(b + 2); break;
    case MG_Q4_0: c = _mm256_sub_epi8(nibbles32(b + 2), _mm256_set1_epi8(8)); break;
    case MG_IQ4_NL: c = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(iq4), nibbles32(b + 2)); break;
    case MG_MXFP4: c = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(fp4), nibbles32(b + 1)); break;
    case MG_Q5_0: /* (u | 16 h) - 16 = u - 16 where the fifth bit h is clear */
        c = _mm256_add_epi8(nibbles32(b + 6), _mm256_andnot_si256(qh_mask32((uint32_t)mg_ld32(b + 2)),
                                                                   _mm256_set1_epi8(-16)));
        break;
    case MG_Q4_1: c = nibbles32(b + 4); break;
    default: /* Q5_1 */
        c = _mm256_or_si256(nibbles32(b + 8),
                            _mm256_and_si256(qh_mask32((uint32_t)mg_ld32(b + 4)), _mm256_set1_epi8(16)));
        break;
    }
    store32(out, c);
}

/* 8 f16 at p, p + bytes, ... p + 7 bytes as floats. */
INLINE __m256 f16x8(const uint8_t *p, size_t bytes) {
    return _mm256_cvtph_ps(_mm_setr_epi16((short)mg_ld16(p), (short)mg_ld16(p + bytes), (short)mg_ld16(p + 2 * bytes),
                                          (short)mg_ld16(p + 3 * bytes), (short)mg_ld16(p + 4 * bytes),
                                          (short)mg_ld16(p + 5 * bytes), (short)mg_ld16(p + 6 * bytes),
                                          (short)mg_ld16(p + 7 * bytes)));
}

/* Q4_1 / Q5_1: the f16 pairs (d, m) at p, p + bytes, ... p + 7 bytes, loaded 32 bits a block,
 * as d (the low 64 bits of each 4-block half, after one vpshufb) and m (the high 64). */
INLINE void f16_pairs8(const uint8_t *p, size_t bytes, __m256 *d, __m256 *m) {
    const __m128i split = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const uint8_t *q = p + 4 * bytes;
    const __m128i a = _mm_shuffle_epi8(_mm_setr_epi32((int)mg_ld32(p), (int)mg_ld32(p + bytes),
                                                      (int)mg_ld32(p + 2 * bytes), (int)mg_ld32(p + 3 * bytes)), split);
    const __m128i b = _mm_shuffle_epi8(_mm_setr_epi32((int)mg_ld32(q), (int)mg_ld32(q + bytes),
                                                      (int)mg_ld32(q + 2 * bytes), (int)mg_ld32(q + 3 * bytes)), split);
    *d = _mm256_cvtph_ps(_mm_unpacklo_epi64(a, b)), *m = _mm256_cvtph_ps(_mm_unpackhi_epi64(a, b));
}

/* nb blocks of a 32-element format: codes per block, factors per 8 blocks (Q4_1 / Q5_1: mn =
 * -m, the sign flipped as the scalar negation does, -0 for +0 too). */
INLINE void small_blocks(const mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) {
    const size_t bytes = small_bytes(f);
    const int mins = f == MG_Q4_1 || f == MG_Q5_1;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= nb; i += 8, p += 8 * bytes) {
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) small_codes(f, p + k * bytes, codes + 32 * (i + k));
        if (f == MG_MXFP4) {
            for (int k = 0; k < 8; k++) fac[i + k] = MG_E8M0_HALF[p[k * bytes]];
        } else if (mins) {
            __m256 d, m;
            f16_pairs8(p, bytes, &d, &m);
            _mm256_storeu_ps(fac + i, d), _mm256_storeu_ps(mn + i, _mm256_xor_ps(m, sign));
        } else {
            _mm256_storeu_ps(fac + i, f16x8(p, bytes));
        }
    }
    for (; i < nb; i++, p += bytes) {
        small_codes(f, p, codes + 32 * i);
        fac[i] = f == MG_MXFP4 ? MG_E8M0_HALF[p[0]] : f16_at(p);
        if (mins) mn[i] = -f16_at(p + 2);
    }
}

/* ---- the 256-element formats: one block per iteration ----------------------------------- */

/* Q4_K / Q5_K: chunk c of 32 code bytes holds group 2c in its low nibbles and 2c + 1 in its
 * high nibbles; Q5_K's fifth bit of group j is bit j of qh[l], moved to bit 4 by one 16-bit
 * shift.  fac = d * sc_j, mn = dmin * m_j. */
INLINE void block_k4(const int q5, const uint8_t *b, int8_t *codes, float *fac, float *mn) {
    const __m256i m4 = _mm256_set1_epi8(15), bit4 = _mm256_set1_epi8(16);
    const uint8_t *qs = b + (q5 ? 48 : 16);
    const __m256i qh = q5 ? load32(b + 16) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i v = load32(qs + 32 * c);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (q5) {
            const int j = 2 * c; /* bits j, j + 1 to bit 4 */
            const __m256i hl = j < 4 ? _mm256_slli_epi16(qh, 4 - j) : _mm256_srli_epi16(qh, j - 4);
            const __m256i hh = j + 1 < 4 ? _mm256_slli_epi16(qh, 3 - j) : _mm256_srli_epi16(qh, j - 3);
            lo = _mm256_or_si256(lo, _mm256_and_si256(hl, bit4)), hi = _mm256_or_si256(hi, _mm256_and_si256(hh, bit4));
        }
        store32(codes + 64 * c, lo), store32(codes + 64 * c + 32, hi);
    }
    uint8_t sc[8], m[8];
    mg_ggml_k4_scales_mins(b + 4, sc, m);
    _mm256_storeu_ps(fac, _mm256_mul_ps(f16_bcast(b), u8_ps(_mm_loadl_epi64((const __m128i *)sc))));
    _mm256_storeu_ps(mn, _mm256_mul_ps(f16_bcast(b + 2), u8_ps(_mm_loadl_epi64((const __m128i *)m))));
}

/* Q6_K: group g of half h has the low 4 bits in the low (g < 2) or high nibbles of ql's 32 bytes
 * 64h + 32(g & 1), the top 2 in bits 2g, 2g + 1 of qh's 32 bytes 32h, moved to bits 4-5 by one
 * 16-bit shift (q6_k_codes.h's q6_k_group with a shift and a mask fewer); fac = d * the int8
 * scale of each 16. */
INLINE void block_q6_k(const uint8_t *b, int8_t *codes, float *fac) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30), k32 = _mm256_set1_epi8(32);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i l0 = load32(b + 64 * h), l1 = load32(b + 64 * h + 32), H = load32(b + 128 + 32 * h);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i l = g & 1 ? l1 : l0;
            const __m256i lo = _mm256_and_si256(g < 2 ? l : _mm256_srli_epi16(l, 4), m4);
            const __m256i hs = g < 2 ? _mm256_slli_epi16(H, 4 - 2 * g) : g == 2 ? H : _mm256_srli_epi16(H, 2);
            store32(codes + 128 * h + 32 * g, _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_and_si256(hs, m30)), k32));
        }
    }
    const __m256 d = f16_bcast(b + 208);
    const __m128i s = _mm_loadu_si128((const __m128i *)(b + 192));
    _mm256_storeu_ps(fac, _mm256_mul_ps(d, s8_ps(s)));
    _mm256_storeu_ps(fac + 8, _mm256_mul_ps(d, s8_ps(_mm_srli_si128(s, 8))));
}

/* Q2_K / Q3_K: group 4h + s is bits 2s.. of the 32 code bytes of half h; Q3_K's high bit (bit
 * 4h + s of hmask[l]) moved to bit 2 by one 16-bit shift, the code q - 4 where it is clear. */
INLINE void block_k23(const int q3, const uint8_t *b, int8_t *codes, float *fac, float *mn) {
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    const uint8_t *qs = b + (q3 ? 32 : 16);
    const __m256i hm = q3 ? load32(b) : _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i v = load32(qs + 32 * h);
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++) {
            __m256i c = _mm256_and_si256(s ? _mm256_srli_epi16(v, 2 * s) : v, m3);
            if (q3) {
                const int g = 4 * h + s;
                const __m256i hb = g < 2 ? _mm256_slli_epi16(hm, 2 - g) : g > 2 ? _mm256_srli_epi16(hm, g - 2) : hm;
                c = _mm256_sub_epi8(c, _mm256_andnot_si256(hb, m4));
            }
            store32(codes + 32 * (4 * h + s), c);
        }
    }
    if (q3) { /* fac = d * the 16 scales k */
        /* mg_ggml_q3_k_scale: the low nibbles of scales 0-7 then 8-15 are bytes 0-7's low then
         * high nibbles; the top 2 bits of scale 4j + c are bits 2j.. of byte 8 + c, i.e. byte c
         * of dword lane j of those 4 bytes shifted right by 2j.  Reads the 12 bytes only. */
        const __m128i a = _mm_loadl_epi64((const __m128i *)(b + 96));
        const __m128i lo = _mm_and_si128(_mm_unpacklo_epi64(a, _mm_srli_epi16(a, 4)), _mm_set1_epi8(15));
        const __m128i top = _mm_srlv_epi32(_mm_set1_epi32((int)mg_ld32(b + 104)), _mm_setr_epi32(0, 2, 4, 6));
        const __m128i hi = _mm_and_si128(top, _mm_set1_epi8(3));
        const __m128i k = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
        const __m256 d = f16_bcast(b + 108);
        _mm256_storeu_ps(fac, _mm256_mul_ps(d, s8_ps(k)));
        _mm256_storeu_ps(fac + 8, _mm256_mul_ps(d, s8_ps(_mm_srli_si128(k, 8))));
    } else { /* fac = d * the scale nibbles k, mn = dmin * the min nibbles km */
        const __m128i sc = _mm_loadu_si128((const __m128i *)b), m = _mm_set1_epi8(15);
        const __m128i k = _mm_and_si128(sc, m);
        const __m128i km = _mm_and_si128(_mm_srli_epi16(sc, 4), m);
        const __m256 d = f16_bcast(b + 80), dmin = f16_bcast(b + 82);
        _mm256_storeu_ps(fac, _mm256_mul_ps(d, u8_ps(k)));
        _mm256_storeu_ps(fac + 8, _mm256_mul_ps(d, u8_ps(_mm_srli_si128(k, 8))));
        _mm256_storeu_ps(mn, _mm256_mul_ps(dmin, u8_ps(km)));
        _mm256_storeu_ps(mn + 8, _mm256_mul_ps(dmin, u8_ps(_mm_srli_si128(km, 8))));
    }
}

/* IQ4_XS: sub-block j's 16 nibble bytes are its 32 codes through the IQ4_NL table; fac_j =
 * d * (s_j - 32), s_j = nibble j of scales_l | bits 2j, 2j + 1 of scales_h << 4, all 8 in one
 * vector by per-lane shift counts. */
INLINE void block_iq4_xs(const uint8_t *b, int8_t *codes, float *fac) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MG_IQ4NL_VALUES));
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) store32(codes + 32 * j, _mm256_shuffle_epi8(tbl, nibbles32(b + 8 + 16 * j)));
    const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i sl = _mm256_srlv_epi32(_mm256_set1_epi32((int)mg_ld32(b + 4)), _mm256_slli_epi32(j, 2));
    const __m256i sh = _mm256_srlv_epi32(_mm256_set1_epi32((int)mg_ld16(b + 2)), _mm256_slli_epi32(j, 1));
    const __m256i s = _mm256_or_si256(_mm256_and_si256(sl, _mm256_set1_epi32(15)),
                                      _mm256_slli_epi32(_mm256_and_si256(sh, _mm256_set1_epi32(3)), 4));
    _mm256_storeu_ps(fac, _mm256_mul_ps(f16_bcast(b), _mm256_cvtepi32_ps(_mm256_sub_epi32(s, _mm256_set1_epi32(32)))));
}

/* ---- the decoders (mg_q8_decode_fn): f fixed per function, so each inlines its own path --- */

#define SMALL(NAME, F)                                                                                     \
    static void dec_##NAME(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) { \
        small_blocks(F, p, nb, codes, fac, mn);                                                            \
    }
SMALL(q8_0, MG_Q8_0)
SMALL(q4_0, MG_Q4_0)
SMALL(q5_0, MG_Q5_0)
SMALL(q4_1, MG_Q4_1)
SMALL(q5_1, MG_Q5_1)
SMALL(iq4_nl, MG_IQ4_NL)
SMALL(mxfp4, MG_MXFP4)

/* BYTES and PER factors per block; CALL decodes block i (b = its bytes, c = its codes, fa = its
 * factors; its mins mn + PER * i, named only by the formats that have them). */
#define LARGE(NAME, BYTES, PER, CALL)                                                                      \
    static void dec_##NAME(mg_format f, const uint8_t *p, int64_t nb, int8_t *codes, float *fac, float *mn) { \
        for (int64_t i = 0; i < nb; i++) {                                                                 \
            const uint8_t *b = p + i * BYTES;                                                              \
            int8_t *c = codes + 256 * i;                                                                   \
            float *fa = fac + PER * i;                                                                     \
            CALL;                                                                                          \
        }                                                                                                  \
    }
LARGE(q4_k, 144, 8, block_k4(0, b, c, fa, mn + 8 * i))
LARGE(q5_k, 176, 8, block_k4(1, b, c, fa, mn + 8 * i))
LARGE(q6_k, 210, 16, block_q6_k(b, c, fa))
LARGE(q3_k, 110, 16, block_k23(1, b, c, fa, NULL))
LARGE(q2_k, 84, 16, block_k23(0, b, c, fa, mn + 16 * i))
LARGE(iq4_xs, 136, 8, block_iq4_xs(b, c, fa))

mg_q8_decode_fn *mg_avx2_q8_decoder_k(mg_format f) {
    switch (f) {
    case MG_Q8_0: return dec_q8_0;
    case MG_Q4_0: return dec_q4_0;
    case MG_Q5_0: return dec_q5_0;
    case MG_Q4_1: return dec_q4_1;
    case MG_Q5_1: return dec_q5_1;
    case MG_IQ4_NL: return dec_iq4_nl;
    case MG_MXFP4: return dec_mxfp4;
    case MG_IQ4_XS: return dec_iq4_xs;
    case MG_Q4_K: return dec_q4_k;
    case MG_Q5_K: return dec_q5_k;
    case MG_Q6_K: return dec_q6_k;
    case MG_Q3_K: return dec_q3_k;
    case MG_Q2_K: return dec_q2_k;
    default: return NULL; /* the grid formats: mg_avx2_q8_decoder_iq */
    }
}
#else
mg_q8_decode_fn *mg_avx2_q8_decoder_k(mg_format f) { return NULL; }
#endif
