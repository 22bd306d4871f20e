/* AVX2 kernels for the ggml block formats (GGUF weights: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, IQ4_NL, IQ4_XS; layouts in c/core/ggml_blocks.h, the scalar twin;
 * the grid formats IQ2_XXS ... IQ1_M are iq_avx2.c's, reached through the same dispatch).  Activations stay
 * fp32: codes are widened to fp32 in registers and multiplied with x; x is never quantised.
 *
 * Decode (n_tok == 1), one row at a time, each row streamed once.  The codes (the integers a
 * block's scale multiplies: q - 8, q - 32, the IQ4 table's values, twice the e2m1 values ...)
 * are widened to fp32 and dotted with x, 8 per FMA, and the sum of each 32 (Q6_K: 16) is
 * multiplied by its sub-block's scale once, instead of scaling every weight.  The mins (Q4_1,
 * Q5_1 and the K-quants) do not touch the codes at all: sum_l (ds*q_l - dm) x_l =
 * ds * (q . x) - dm * sum(x), and the sums of x per 32 columns (per 16 for Q2_K and Q3_K) are
 * computed once per call and shared by every row.  Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS leave their
 * codes in place instead (lane order, below): no widening shuffle at all.
 *
 * Dequantisation (mg_avx2_ggml_dequant_block, for prefill's tiles): exact values, equal bit for
 * bit to the scalar decoder: every value is one rounding of an exact product (ggml_blocks.h), and
 * Q4_K/Q5_K's ds*q - dm is one FMA (ds*q is exact, so the FMA rounds the same as mul then sub). */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "core/ggml_blocks.h"
#include "kernels/avx2/q6_k_codes.h"

INLINE float f16_at(const uint8_t *p) { /* vcvtph2ps: exact, denormals included */
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

INLINE __m256i loadu256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* 16 bytes of Q4_0-ordered nibbles (element i low nibble of byte i, element 16 + i its high
 * nibble) as 32 bytes 0..15 in element order. */
INLINE __m256i nibbles16(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* vpshufb tables (both 128-bit lanes) from a 16-entry int8 value table. */
INLINE __m256i lut16(const int8_t *v) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)v));
}
static const int8_t Q4_0_VALUES[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/* The 32 bits of Q5_0's qh as 32 bytes: 0x10 where the element's fifth bit is set. */
INLINE __m256i q5_0_high(const uint8_t *p) {
    uint32_t qh;
    memcpy(&qh, p, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                               _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2,
                                                                2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* 0x10 in the bytes of qh[32] whose bit j is set: Q5_K's fifth bits of sub-block j. */
INLINE __m256i q5_k_high(__m256i qh, int j) {
    const __m256i bit = _mm256_set1_epi8((char)(1 << j));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10));
}

/* The 64 unsigned codes of chunk c (sub-blocks 2c and 2c + 1) of a Q4_K / Q5_K block, as bytes
 * in element order: low nibbles of qs[32 c ..] (lo) and high nibbles (hi), with Q5_K's fifth
 * bits from qh (32 bytes at p + 16) when q5. */
INLINE void k4_codes(const uint8_t *qs, __m256i qh, int c, int q5, __m256i *lo, __m256i *hi) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), v = loadu256(qs + 32 * c);
    *lo = _mm256_and_si256(v, m4);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (q5) {
        *lo = _mm256_or_si256(*lo, q5_k_high(qh, 2 * c));
        *hi = _mm256_or_si256(*hi, q5_k_high(qh, 2 * c + 1));
    }
}

/* The 8 signed int8 codes of lane group k (0..3) of q as fp32. */
INLINE __m256 codes8(__m256i q, int k) {
    const __m128i h = k < 2 ? _mm256_castsi256_si128(q) : _mm256_extracti128_si256(q, 1);
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32((k & 1) ? _mm_unpackhi_epi64(h, h) : h));
}

/* sum_l q[l] * x[l] over 32 elements, as 8 partial sums. */
INLINE __m256 dot32(__m256i q, const float *x) {
    __m256 a = _mm256_mul_ps(codes8(q, 0), _mm256_loadu_ps(x));
    __m256 b = _mm256_mul_ps(codes8(q, 2), _mm256_loadu_ps(x + 16));
    a = _mm256_fmadd_ps(codes8(q, 1), _mm256_loadu_ps(x + 8), a);
    b = _mm256_fmadd_ps(codes8(q, 3), _mm256_loadu_ps(x + 24), b);
    return _mm256_add_ps(a, b);
}

/* 8 unsigned bytes times v, as fp32 (exact: v is an f16 value, the bytes 6-bit). */
INLINE __m256 bytes_times(const uint8_t b[8], float v) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)b))),
                         _mm256_set1_ps(v));
}

/* IQ4_XS: the 8 sub-block scales d * (s - 32), s of sub-block j being bits 4j..4j+3 of the u32
 * scales_l under bits 2j, 2j + 1 of the u16 scales_h: lane j shifted by vpsrlvd, where a scalar
 * loop assembled each one (2 operations per 8 scales instead of about 40). */
INLINE __m256 iq4_xs_scales(const uint8_t *b, float d) {
    uint32_t sl, sh;
    memcpy(&sl, b + 4, 4);
    memcpy(&sh, b + 2, 4); /* scales_h in the low half (the rest is shifted out or masked) */
    const __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                  hi = _mm256_srlv_epi32(_mm256_set1_epi32((int)sh), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    const __m256i s = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)), _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(s, _mm256_set1_epi32(32))), _mm256_set1_ps(d));
}

/* ---- decode: one row's dot product with x over nb blocks --------------------------------- */

/* 8 bytes at p zero-extended to 8 dword lanes (vpmovzxbd from memory: one load-shuffle). */
INLINE __m256i bytes8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }

/* Two ways to widen codes, each used where it measured faster (Zen 4, one core):
 *  - from memory, one byte per dword lane (vpmovzxbd / vpmovsxbd with a memory operand), both
 *    nibbles of the byte then taken by a mask and a shift: no other shuffle.  Q8_0, Q4_0, Q4_1,
 *    Q4_K, Q5_K and Q2_K (Q4_K 16 -> 21 Gweights/s, Q4_0 14 -> 17 against the way below).
 *  - a register of 32 int8 codes in element order (codes by vpshufb tables, high bits by byte
 *    masks), split by dot32.  IQ4_NL, IQ4_XS, MXFP4, Q5_0, Q5_1, Q6_K and Q3_K: the dword way
 *    needed vpermps tables or more shifts per lane there, and was 10-30 % slower. */

/* Q8_0: the int8 codes sign-extended straight from memory. */
INLINE __m256 dot_q8_0(const uint8_t *p, const float *x) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int k = 0; k < 4; k += 2) {
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * k)))),
                            _mm256_loadu_ps(x + 8 * k), a);
        b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 10 + 8 * k)))),
                            _mm256_loadu_ps(x + 8 * k + 8), b);
    }
    return _mm256_add_ps(a, b);
}

/* Q4_0 and Q4_1: 16 bytes of nibbles at qs (element i: low nibble of byte i, element 16 + i:
 * its high nibble), each byte widened once to a dword lane and both nibbles taken from it; value
 * code - off (Q4_0: 8; Q4_1: 0, its min is added from the sums of x).  (The table formats and
 * Q5_0, whose codes need byte shuffles or high bits, measured faster through a register of 32
 * int8 codes and dot32.) */
INLINE __m256 dot_nibbles(const uint8_t *qs, const float *x, int off) {
    const __m256i m4 = _mm256_set1_epi32(15), o = _mm256_set1_epi32(off);
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int k = 0; k < 2; k++) {
        const __m256i v = bytes8(qs + 8 * k);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_srli_epi32(v, 4);
        if (off) lo = _mm256_sub_epi32(lo, o), hi = _mm256_sub_epi32(hi, o);
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(x + 8 * k), a);
        b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_loadu_ps(x + 16 + 8 * k), b);
    }
    return _mm256_add_ps(a, b);
}
#define dot_q4_0(p, x) dot_nibbles((p) + 2, x, 8)
#define dot_q4_1(p, x) dot_nibbles((p) + 4, x, 0)

/* Blocks of 32 with one scale: SCALE(p) and DOT(p, x) of block p. */
#define ROW_DOT_32(NAME, BYTES, SCALE, DOT)                                                 \
    static float NAME(const uint8_t *p, int64_t nb, const float *x, const float *xs) {     \
        (void)xs;                                                                           \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                     \
        int64_t i = 0;                                                                      \
        for (; i + 2 <= nb; i += 2, p += 2 * (BYTES), x += 64) {                            \
            mg_avx2_prefetch_ahead(p, 2 * (BYTES));                                         \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(p)), DOT(p, x), acc0);              \
            const uint8_t *p1 = p + (BYTES);                                                \
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(p1)), DOT(p1, x + 32), acc1);       \
        }                                                                                   \
        if (i < nb) acc0 = _mm256_fmadd_ps(_mm256_set1_ps(SCALE(p)), DOT(p, x), acc0);      \
        return hsum8(_mm256_add_ps(acc0, acc1));                                            \
    }

/* Blocks of 32 with a scale d (f16 at p) and a min m (f16 at p + 2), d * q + m: the min's share
 * is m * xs[block] (xs: the sums of x per 32 columns), a scalar per block. */
#define ROW_DOT_32_MIN(NAME, BYTES, DOT)                                                    \
    static float NAME(const uint8_t *p, int64_t nb, const float *x, const float *xs) {     \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                     \
        float m0 = 0, m1 = 0;                                                               \
        int64_t i = 0;                                                                      \
        for (; i + 2 <= nb; i += 2, p += 2 * (BYTES), x += 64) {                            \
            mg_avx2_prefetch_ahead(p, 2 * (BYTES));                                         \
            const uint8_t *p1 = p + (BYTES);                                                \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p)), DOT(p, x), acc0);             \
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p1)), DOT(p1, x + 32), acc1);      \
            m0 += f16_at(p + 2) * xs[i], m1 += f16_at(p1 + 2) * xs[i + 1];                  \
        }                                                                                   \
        if (i < nb) {                                                                       \
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p)), DOT(p, x), acc0);             \
            m0 += f16_at(p + 2) * xs[i];                                                    \
        }                                                                                   \
        return hsum8(_mm256_add_ps(acc0, acc1)) + (m0 + m1);                                \
    }

/* The codes of one 32-element block as a register of 32 int8 in element order, for the exact
 * dequantisation of prefill. */
#define CODES_Q8_0(p) loadu256((p) + 2)
#define CODES_Q4_0(p) _mm256_shuffle_epi8(lut16(Q4_0_VALUES), nibbles16((p) + 2))
#define CODES_IQ4_NL(p) _mm256_shuffle_epi8(lut16(MG_IQ4NL_VALUES), nibbles16((p) + 2))
#define CODES_MXFP4(p) _mm256_shuffle_epi8(lut16(MG_MXFP4_VALUES2), nibbles16((p) + 1))
#define CODES_Q5_0(p) _mm256_sub_epi8(_mm256_or_si256(nibbles16((p) + 6), q5_0_high((p) + 2)), _mm256_set1_epi8(16))
#define CODES_Q4_1(p) nibbles16((p) + 4) /* unsigned 0..15: the min is added apart */
#define CODES_Q5_1(p) _mm256_or_si256(nibbles16((p) + 8), q5_0_high((p) + 4)) /* unsigned 0..31 */

#define SCALE_F16(p) f16_at(p)
#define SCALE_E8M0(p) MG_E8M0_HALF[(p)[0]]
#define DOT_IQ4_NL(p, x) dot32(CODES_IQ4_NL(p), x)
#define DOT_MXFP4(p, x) dot32(CODES_MXFP4(p), x)
#define DOT_Q5_0(p, x) dot32(CODES_Q5_0(p), x)
#define DOT_Q5_1(p, x) dot32(CODES_Q5_1(p), x)

ROW_DOT_32(row_dot_q8_0, 34, SCALE_F16, dot_q8_0)
ROW_DOT_32(row_dot_q4_0, 18, SCALE_F16, dot_q4_0)
ROW_DOT_32(row_dot_q5_0, 22, SCALE_F16, DOT_Q5_0)
ROW_DOT_32(row_dot_iq4_nl, 18, SCALE_F16, DOT_IQ4_NL)
ROW_DOT_32(row_dot_mxfp4, 17, SCALE_E8M0, DOT_MXFP4)
ROW_DOT_32_MIN(row_dot_q4_1, 20, dot_q4_1)
ROW_DOT_32_MIN(row_dot_q5_1, 24, DOT_Q5_1)

/* A Q4_K / Q5_K block's factors d * sc into ds, and its mins' share dmin * (m . xs) added to
 * accm (xs: x's sums per 32 columns of the block). */
INLINE void k4_block_factors(const uint8_t *p, const float *xs, float ds[8], __m256 *accm) {
    uint8_t sc[8], mn[8];
    mg_ggml_k4_scales_mins(p + 4, sc, mn);
    _mm256_store_ps(ds, bytes_times(sc, f16_at(p)));
    *accm = _mm256_fmadd_ps(bytes_times(mn, f16_at(p + 2)), _mm256_loadu_ps(xs), *accm);
}

/* Chunk c of a Q4_K / Q5_K (q5) block p dotted with x (the block's 256 columns), the low nibbles
 * (sub-block 2c) into lo and the high ones (2c + 1) into hi, as 8 partial sums each.  A chunk's
 * byte l holds element l of both: each byte is widened once, to a dword, and both nibbles are
 * taken from it by a mask and a shift, with no byte shuffles at all. */
INLINE void k4_chunk_widened(const uint8_t *p, int c, int q5, const float *x, __m256 *lo, __m256 *hi) {
    const __m256i m4 = _mm256_set1_epi32(15), m16 = _mm256_set1_epi32(16);
    const uint8_t *qs = p + (q5 ? 48 : 16), *qh = p + 16;
    *lo = *hi = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        const __m256i v = bytes8(qs + 32 * c + 8 * k);
        __m256i l = _mm256_and_si256(v, m4), h = _mm256_srli_epi32(v, 4);
        if (q5) { /* bit 2c (2c + 1) of qh[l] is the fifth bit of element l of sub-block 2c (2c + 1) */
            const __m256i b = bytes8(qh + 8 * k);
            l = _mm256_or_si256(l, _mm256_and_si256(_mm256_srli_epi32(_mm256_slli_epi32(b, 4), 2 * c), m16));
            h = _mm256_or_si256(h, _mm256_and_si256(_mm256_srli_epi32(_mm256_slli_epi32(b, 3), 2 * c), m16));
        }
        *lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), _mm256_loadu_ps(x + 64 * c + 8 * k), *lo);
        *hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h), _mm256_loadu_ps(x + 64 * c + 32 + 8 * k), *hi);
    }
}

/* 16 codes' dot product with x (the lanes k, k + 1 of codes8) as 8 partial sums. */
INLINE __m256 dot16(__m256i q, int k, const float *x) {
    return _mm256_fmadd_ps(codes8(q, k + 1), _mm256_loadu_ps(x + 8), _mm256_mul_ps(codes8(q, k), _mm256_loadu_ps(x)));
}

/* Q6_K: a scale per 16 elements. */
static float row_dot_q6_k(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 210, x += 256) {
        float ds[16] __attribute__((aligned(32)));
        mg_avx2_prefetch_ahead(p, 210);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
        const __m256 d = _mm256_set1_ps(f16_at(p + 208));
        _mm256_store_ps(ds, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16))), d));
        _mm256_store_ps(ds + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16, 1))), d));
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6_k_half(p, h, q);
            for (int g = 0; g < 4; g++) {
                const float *xg = x + 128 * h + 32 * g;
                const float *sg = ds + 8 * h + 2 * g;
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(sg), dot16(q[g], 0, xg), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(sg + 1), dot16(q[g], 2, xg + 16), acc1);
            }
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* Q2_K takes each code from qs (bits 2s, 2s + 1 of qs[32h + l] for element 128h + 32s + l) as
 * Q4_K takes its nibbles: each byte widened once to a dword lane, its 4 codes taken by masks.
 * The mask leaves code s at bits 2s (its value times 4^s), with no shift: the factors of group s
 * are divided by 4^s instead (exact, a power of two), Q2_K_POW4 for the 8 sub-blocks of 16 of
 * one half (sub-block 2s + t is in group s). */
static const float Q2_K_POW4[8] __attribute__((aligned(32))) = {1.0f, 1.0f, 0x1p-2f, 0x1p-2f, 0x1p-4f, 0x1p-4f, 0x1p-6f, 0x1p-6f};

/* out[0..16) = the 16 unsigned bytes b times v (lanes j and 8 + j times v[j]). */
INLINE void ubytes16_times(__m128i b, __m256 v, float out[16]) {
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), v));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(b, b))), v));
}

/* The 16 sub-block factors d * sc / 4^s of a Q2_K block from its 16 scale nibbles sc (bytes):
 * ds[8h + 2s + t] is that of elements 128h + 32s + 16t .. + 15. */
INLINE void q2_k_factors(__m128i sc, float d, float ds[16]) {
    ubytes16_times(sc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_load_ps(Q2_K_POW4)), ds);
}

/* sum over the 16 sub-blocks of m[j] * xs[j] (m: 16 unsigned bytes; xs: the sums of x per 16
 * columns) as 8 lanes. */
INLINE __m256 mins_dot_xs(__m128i m, const float *xs) {
    const __m256 a = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(m, m)));
    return _mm256_fmadd_ps(b, _mm256_loadu_ps(xs + 8), _mm256_mul_ps(a, _mm256_loadu_ps(xs)));
}

/* The codes' dot products of half h of a Q2_K block (qs: its 64 code bytes), scaled by the
 * factors ds (q2_k_factors) and added to acc0 (the first 16 of each group of 32) and acc1. */
INLINE void q2_k_half(const uint8_t *qs, int h, const float *x, const float *ds, __m256 *acc0, __m256 *acc1) {
    __m256i v[4];
    for (int k = 0; k < 4; k++) v[k] = bytes8(qs + 32 * h + 8 * k);
    for (int s = 0; s < 4; s++) {
        const __m256i ml = _mm256_set1_epi32(3 << 2 * s);
        __m256 a[4];
        for (int k = 0; k < 4; k++) a[k] = _mm256_cvtepi32_ps(_mm256_and_si256(v[k], ml));
        const float *xg = x + 128 * h + 32 * s;
        const __m256 lo = _mm256_fmadd_ps(a[1], _mm256_loadu_ps(xg + 8), _mm256_mul_ps(a[0], _mm256_loadu_ps(xg)));
        const __m256 hi = _mm256_fmadd_ps(a[3], _mm256_loadu_ps(xg + 24), _mm256_mul_ps(a[2], _mm256_loadu_ps(xg + 16)));
        *acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 8 * h + 2 * s), lo, *acc0);
        *acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 8 * h + 2 * s + 1), hi, *acc1);
    }
}

/* Q2_K: (d * sc) * q - dmin * m per sub-block of 16; the mins' share is dmin * (m . xs), xs the
 * sums of x per 16 columns. */
static float row_dot_q2_k(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 84, x += 256, xs += 16) {
        mg_avx2_prefetch_ahead(p, 84);
        float ds[16] __attribute__((aligned(32)));
        const __m128i sc = _mm_loadu_si128((const __m128i *)p);
        q2_k_factors(_mm_and_si128(sc, m4), f16_at(p + 80), ds);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p + 82)), mins_dot_xs(_mm_and_si128(_mm_srli_epi16(sc, 4), m4), xs), accm);
        for (int h = 0; h < 2; h++) q2_k_half(p + 16, h, x, ds, &acc0, &acc1);
    }
    return hsum8(_mm256_sub_ps(_mm256_add_ps(acc0, acc1), accm));
}

/* Q3_K's 16 scales (6 bits, minus 32) as signed bytes: the low 4 bits of scale i are nibble i / 8
 * of byte i % 8, the top 2 bits 2(i / 4) .. of byte 8 + i % 4 (mg_ggml_q3_k_scale); 64-bit
 * shifts move bits across bytes and the masks keep each byte's own. */
INLINE __m128i q3_k_scales(const uint8_t *s) {
    uint64_t a;
    uint32_t c;
    memcpy(&a, s, 8);
    memcpy(&c, s + 8, 4);
    const uint64_t m2 = 0x03030303u, m4 = 0x0f0f0f0f0f0f0f0full;
    const uint64_t h0 = (c & m2) | ((c >> 2) & m2) << 32, h1 = ((c >> 4) & m2) | ((c >> 6) & m2) << 32;
    const __m128i lo = _mm_set_epi64x((long long)((a >> 4) & m4), (long long)(a & m4));
    const __m128i hi = _mm_set_epi64x((long long)h1, (long long)h0);
    return _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
}

/* Q3_K's 16 factors d * scale (exact), ds[8h + 2s + t] as in q2_k_factors. */
INLINE void q3_k_factors(const uint8_t *p, float ds[16]) {
    const __m128i sc = q3_k_scales(p + 96);
    const __m256 d = _mm256_set1_ps(f16_at(p + 108));
    _mm256_storeu_ps(ds, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d));
    _mm256_storeu_ps(ds + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(sc, sc))), d));
}

/* Group s (0..3) of half h of a Q2_K / Q3_K block as 32 codes in element order: bits 2s, 2s + 1
 * of the 32 qs bytes Q of the half; with Q3_K's high bits (hm: the 32 hmask bytes), bit 4h + s
 * of each, clear meaning -4. */
INLINE __m256i qk_group(__m256i Q, __m256i hm, int q3, int h, int s) {
    const __m256i c = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * s), _mm256_set1_epi8(3));
    if (!q3) return c;
    const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
    const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), _mm256_setzero_si256());
    return _mm256_sub_epi8(c, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
}

/* Q3_K as Q6_K: 32 signed codes in a register (qk_group), each 16 dotted with x and times the
 * factor of its sub-block.  (Q2_K's way, codes masked in dword lanes, needs a shift and an or
 * more per 8 codes for the high bit here, and measured ~30 % slower.) */
static float row_dot_q3_k(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 110, x += 256) {
        mg_avx2_prefetch_ahead(p, 110);
        float ds[16] __attribute__((aligned(32)));
        q3_k_factors(p, ds);
        const __m256i hm = loadu256(p);
        for (int h = 0; h < 2; h++) {
            const __m256i Q = loadu256(p + 32 + 32 * h);
            for (int g = 0; g < 4; g++) {
                const __m256i q = qk_group(Q, hm, 1, h, g);
                const float *xg = x + 128 * h + 32 * g;
                const float *sg = ds + 8 * h + 2 * g;
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(sg), dot16(q, 0, xg), acc0);
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(sg + 1), dot16(q, 2, xg + 16), acc1);
            }
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales. */
static float row_dot_iq4_xs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    const __m256i lut = lut16(MG_IQ4NL_VALUES);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 136, x += 256) {
        mg_avx2_prefetch_ahead(p, 136);
        float dl[8] __attribute__((aligned(32)));
        _mm256_store_ps(dl, iq4_xs_scales(p, f16_at(p)));
        for (int j = 0; j < 8; j += 2) {
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(dl + j), dot32(_mm256_shuffle_epi8(lut, nibbles16(p + 8 + 16 * j)), x + 32 * j), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(dl + j + 1),
                                   dot32(_mm256_shuffle_epi8(lut, nibbles16(p + 24 + 16 * j)), x + 32 * j + 32), acc1);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* ---- Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS with the codes left in place (lane order) ---------- */

/* A 32-byte vector of codes (a Q4_K chunk's qs; a Q3_K, Q5_K, Q6_K or IQ4_XS 32 as bytes)
 * taken as 8 dword lanes: byte k of lane j holds the code of element 4j + k of its 32.  A mask
 * leaves that code where it is, its value times 2^(8k) (a Q4_K high nibble: 2^(8k + 4)), and
 * vcvtdq2ps makes it fp32 exactly, so x's element 4j + k is stored in lane j of vector k times
 * 2^-(8k) (2^-(8k + 4)), a power of two (lane_order_x, once per call).  Per 8 codes that is a
 * mask, a conversion and an FMA, where the loops above widen bytes to dwords with a shuffle per
 * 8 codes and shift the high nibbles: on a Golden Cove core (Alder Lake's performance core), one
 * core in L2, Q5_K 1.7x, Q6_K 1.15x, Q3_K 1.17x, IQ4_XS 1.1x (1.26x with its scales below),
 * Q4_K 1.05x the weight GB/s (docs/KERNELS.md).  Where a code times 2^24 or 2^28 would not be a
 * signed dword (a Q4_K high nibble of byte 3, IQ4_XS's byte 3), it is shifted down instead, its
 * x not scaled. */

/* The scales of x's vectors k = 0..3 for a 32 whose codes sit at bits 8k (BYTES), at bit
 * 8k + 4 with byte 3's shifted down (HIGH_NIBBLES), or at 8k with byte 3's shifted down
 * (BYTES_TOP_SHIFTED: unsigned codes of 8 bits, which times 2^24 are not signed dwords). */
static const float BYTES[4] = {1.0f, 0x1p-8f, 0x1p-16f, 0x1p-24f}, HIGH_NIBBLES[4] = {0x1p-4f, 0x1p-12f, 0x1p-20f, 1.0f},
                   BYTES_TOP_SHIFTED[4] = {1.0f, 0x1p-8f, 0x1p-16f, 1.0f};

/* out[8k + j] = x[4j + k] * sc[k] for one 32 of x: the 4 x 8 transpose of its four vectors. */
INLINE void lane_order32(const float *x, const float *sc, float *out) {
    const __m256 a0 = _mm256_loadu_ps(x), a1 = _mm256_loadu_ps(x + 8), a2 = _mm256_loadu_ps(x + 16), a3 = _mm256_loadu_ps(x + 24);
    const __m256 b0 = _mm256_permute2f128_ps(a0, a2, 0x20), b1 = _mm256_permute2f128_ps(a0, a2, 0x31), /* x0-3 | x16-19, x4-7 | x20-23 */
        b2 = _mm256_permute2f128_ps(a1, a3, 0x20), b3 = _mm256_permute2f128_ps(a1, a3, 0x31);
    const __m256 t0 = _mm256_unpacklo_ps(b0, b1), t1 = _mm256_unpackhi_ps(b0, b1), t2 = _mm256_unpacklo_ps(b2, b3),
                 t3 = _mm256_unpackhi_ps(b2, b3);
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_shuffle_ps(t0, t2, 0x44), _mm256_set1_ps(sc[0])));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_shuffle_ps(t0, t2, 0xee), _mm256_set1_ps(sc[1])));
    _mm256_storeu_ps(out + 16, _mm256_mul_ps(_mm256_shuffle_ps(t1, t3, 0x44), _mm256_set1_ps(sc[2])));
    _mm256_storeu_ps(out + 24, _mm256_mul_ps(_mm256_shuffle_ps(t1, t3, 0xee), _mm256_set1_ps(sc[3])));
}

/* The codes of a lane-order 32 (v) dotted with x's lane-order 32 at xq, as 8 partial sums: byte
 * k's code masked in place by mask << 8k (its value times 2^8k) against x's vector k; with
 * top_shift, byte 3's code is v >> top_shift instead (x's vector 3 unscaled). */
INLINE __m256 lanes_dot(__m256i v, uint32_t mask, int top_shift, const float *xq) {
    __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)mask))), _mm256_loadu_ps(xq));
    for (int k = 1; k < 4; k++) {
        const __m256i c = k == 3 && top_shift ? _mm256_srli_epi32(v, top_shift) : _mm256_and_si256(v, _mm256_set1_epi32((int)(mask << 8 * k)));
        part = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_loadu_ps(xq + 8 * k), part);
    }
    return part;
}

/* [f[2g] x 4, f[2g + 1] x 4]: the factors of a lane-order 32 of two sub-blocks of 16 (lanes 0-3
 * the first), from the 8 factors f of its half block. */
INLINE __m256 pair_factors(__m256 f, int g) {
    return _mm256_permutevar8x32_ps(f, _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_set1_epi32(2 * g)));
}

/* x's cols (a multiple of 256) in lane order into xq, the 32s scaled by even and odd in turn
 * (Q4_K: BYTES, HIGH_NIBBLES; Q3_K, Q5_K, Q6_K: BYTES; IQ4_XS: BYTES_TOP_SHIFTED).  0 when some
 * x is non-zero below 2^-102 in magnitude, which the scaling by up to 2^-24 would make an fp32
 * denormal (inexact, and a microcode assist per multiply on Intel cores): the caller then takes
 * the loops above. */
INLINE int lane_order_x(const float *x, int64_t cols, const float *even, const float *odd, float *xq) {
    const __m256 tiny = _mm256_set1_ps(0x1p-102f), sign = _mm256_set1_ps(-0.0f);
    __m256 bad = _mm256_setzero_ps();
    for (int64_t g = 0; g < cols; g += 32) {
        for (int v = 0; v < 32; v += 8) {
            const __m256 a = _mm256_loadu_ps(x + g + v), m = _mm256_andnot_ps(sign, a);
            bad = _mm256_or_ps(bad, _mm256_and_ps(_mm256_cmp_ps(m, tiny, _CMP_LT_OQ), _mm256_cmp_ps(m, _mm256_setzero_ps(), _CMP_NEQ_OQ)));
        }
        lane_order32(x + g, g & 32 ? odd : even, xq + g);
    }
    return _mm256_movemask_ps(bad) == 0;
}

/* Chunk c of a Q4_K / Q5_K (q5) block p in lane order (see above): its 32 bytes, the low nibbles
 * (sub-block 2c) into lo, the high ones (2c + 1) into hi, x in lane order at xq (the block's).
 * Q5_K's 5-bit codes are assembled as bytes first (the low nibbles with bit 2c of qh[l] as their
 * fifth bit, the high ones with bit 2c + 1), then each byte is taken in place as Q6_K's, x in
 * lane_order_x's BYTES order. */
INLINE __m256i q5_k_fifth(__m256i qh, int bit) { /* bit `bit` of each byte of qh moved to bit 4 */
    const __m256i b = bit < 4 ? _mm256_slli_epi16(qh, 4 - bit) : bit > 4 ? _mm256_srli_epi16(qh, bit - 4) : qh;
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}
INLINE void k4_chunk_lanes(const uint8_t *p, int c, int q5, const float *xq, __m256 *lo, __m256 *hi) {
    const __m256i v = loadu256(p + (q5 ? 48 : 16) + 32 * c), m4 = _mm256_set1_epi8(0x0f);
    if (q5) {
        const __m256i qh = loadu256(p + 16);
        *lo = lanes_dot(_mm256_or_si256(_mm256_and_si256(v, m4), q5_k_fifth(qh, 2 * c)), 0xff, 0, xq + 64 * c);
        *hi = lanes_dot(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), q5_k_fifth(qh, 2 * c + 1)), 0xff, 0,
                        xq + 64 * c + 32);
    } else {
        *lo = lanes_dot(v, 0x0f, 0, xq + 64 * c), *hi = lanes_dot(v, 0xf0, 28, xq + 64 * c + 32);
    }
}

/* Q4_K and Q5_K (q5 = 1): scales times the codes' dot products, minus the mins times xs (the sums
 * of x per 32 columns); each chunk in lane order (x in lane order) or widened (x as it is). */
INLINE float row_dot_k4(const uint8_t *p, int64_t nb, const float *x, const float *xs, int q5, int lanes) {
    const size_t bytes = q5 ? 176 : 144;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += bytes, x += 256, xs += 8) {
        float ds[8] __attribute__((aligned(32)));
        mg_avx2_prefetch_ahead(p, bytes);
        k4_block_factors(p, xs, ds, &accm);
        for (int c = 0; c < 4; c++) {
            __m256 lo, hi;
            if (lanes)
                k4_chunk_lanes(p, c, q5, x, &lo, &hi);
            else
                k4_chunk_widened(p, c, q5, x, &lo, &hi);
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 2 * c), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ds + 2 * c + 1), hi, acc1);
        }
    }
    return hsum8(_mm256_sub_ps(_mm256_add_ps(acc0, acc1), accm));
}
static float row_dot_q4_k(const uint8_t *p, int64_t nb, const float *x, const float *xs) { return row_dot_k4(p, nb, x, xs, 0, 0); }
static float row_dot_q5_k(const uint8_t *p, int64_t nb, const float *x, const float *xs) { return row_dot_k4(p, nb, x, xs, 1, 0); }
static float row_dot_q4_k_lanes(const uint8_t *p, int64_t nb, const float *xq, const float *xs) {
    return row_dot_k4(p, nb, xq, xs, 0, 1);
}
static float row_dot_q5_k_lanes(const uint8_t *p, int64_t nb, const float *xq, const float *xs) {
    return row_dot_k4(p, nb, xq, xs, 1, 1);
}

/* IQ4_XS in lane order: sub-block j's 32 values as bytes in element order (nibbles16 and the
 * table), offset by 128 so that they are unsigned (1..241) and each byte is taken in place as
 * Q6_K's, byte 3 shifted down (x: BYTES_TOP_SHIFTED); the offset goes through x's sums per 32
 * (xs): sum (v + 128) x - 128 sum x. */
static float row_dot_iq4_xs_lanes(const uint8_t *p, int64_t nb, const float *xq, const float *xs) {
    const __m256i lut = _mm256_add_epi8(lut16(MG_IQ4NL_VALUES), _mm256_set1_epi8(-128)); /* v + 128, mod 256 */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 136, xq += 256, xs += 8) {
        mg_avx2_prefetch_ahead(p, 136);
        float dl[8] __attribute__((aligned(32)));
        const __m256 scales = iq4_xs_scales(p, f16_at(p));
        _mm256_store_ps(dl, scales);
        accm = _mm256_fmadd_ps(scales, _mm256_loadu_ps(xs), accm);
        for (int j = 0; j < 8; j++) {
            const __m256 part = lanes_dot(_mm256_shuffle_epi8(lut, nibbles16(p + 8 + 16 * j)), 0xff, 24, xq + 32 * j);
            if (j & 1)
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(dl + j), part, acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(dl + j), part, acc0);
        }
    }
    return hsum8(_mm256_fnmadd_ps(_mm256_set1_ps(128.0f), accm, _mm256_add_ps(acc0, acc1)));
}

/* Q3_K in lane order: group s of half h (elements 128h + 32s + l) as unsigned bytes 0..7, the
 * two bits 2s, 2s + 1 of the half's qs bytes under the bit 4h + s of hmask (set: plus 4), each
 * byte in place as Q6_K's, lanes 0-3 sub-block 8h + 2s, lanes 4-7 the next; the offset 4 goes
 * through x's sums per 16 columns (xs): sum (q - 4) x = sum q x - 4 sum x. */
static float row_dot_q3_k_lanes(const uint8_t *p, int64_t nb, const float *xq, const float *xs) {
    const __m256i low2 = _mm256_set1_epi8(3), bit2 = _mm256_set1_epi8(4);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 110, xq += 256, xs += 16) {
        mg_avx2_prefetch_ahead(p, 110);
        float f[16] __attribute__((aligned(32)));
        q3_k_factors(p, f);
        const __m256 ds[2] = {_mm256_load_ps(f), _mm256_load_ps(f + 8)};
        accm = _mm256_fmadd_ps(ds[1], _mm256_loadu_ps(xs + 8), _mm256_fmadd_ps(ds[0], _mm256_loadu_ps(xs), accm));
        const __m256i hm = loadu256(p);
        for (int h = 0; h < 2; h++) {
            const __m256i Q = loadu256(p + 32 + 32 * h);
            for (int g = 0; g < 4; g++) {
                const int b = 4 * h + g; /* the hmask bit, moved to bit 2 */
                const __m256i top = b < 2 ? _mm256_slli_epi16(hm, 2 - b) : b > 2 ? _mm256_srli_epi16(hm, b - 2) : hm;
                const __m256i v = _mm256_or_si256(_mm256_and_si256(g ? _mm256_srli_epi16(Q, 2 * g) : Q, low2), _mm256_and_si256(top, bit2));
                const __m256 part = lanes_dot(v, 0xff, 0, xq + 128 * h + 32 * g), fac = pair_factors(ds[h], g);
                if (g & 1)
                    acc1 = _mm256_fmadd_ps(fac, part, acc1);
                else
                    acc0 = _mm256_fmadd_ps(fac, part, acc0);
            }
        }
    }
    return hsum8(_mm256_fnmadd_ps(_mm256_set1_ps(4.0f), accm, _mm256_add_ps(acc0, acc1)));
}

/* Q6_K in lane order: the unsigned codes (0..63) of group g of half h, byte k of lane j element
 * 4j + k of the group, lanes 0-3 sub-block 8h + 2g, lanes 4-7 the next; the codes' offset 32 goes
 * through x's sums per 16 columns (xs): sum (q - 32) x = sum q x - 32 sum x per sub-block. */
static float row_dot_q6_k_lanes(const uint8_t *p, int64_t nb, const float *xq, const float *xs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 210, xq += 256, xs += 16) {
        mg_avx2_prefetch_ahead(p, 210);
        const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p + 192)));
        const __m256 d = _mm256_set1_ps(f16_at(p + 208));
        const __m256 ds[2] = {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s16))), d),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(s16, 1))), d)};
        accm = _mm256_fmadd_ps(ds[1], _mm256_loadu_ps(xs + 8), _mm256_fmadd_ps(ds[0], _mm256_loadu_ps(xs), accm));
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++) {
                const __m256 part = lanes_dot(q6_k_codes(p, h, g), 0xff, 0, xq + 128 * h + 32 * g), fac = pair_factors(ds[h], g);
                if (g & 1)
                    acc1 = _mm256_fmadd_ps(fac, part, acc1);
                else
                    acc0 = _mm256_fmadd_ps(fac, part, acc0);
            }
    }
    return hsum8(_mm256_fnmadd_ps(_mm256_set1_ps(32.0f), accm, _mm256_add_ps(acc0, acc1)));
}

typedef mg_avx2_row_dot_fn row_dot_fn;

static row_dot_fn *row_dot_of(mg_format f) {
    switch (f) {
    case MG_Q8_0: return row_dot_q8_0;
    case MG_Q4_0: return row_dot_q4_0;
    case MG_Q5_0: return row_dot_q5_0;
    case MG_Q4_K: return row_dot_q4_k;
    case MG_Q5_K: return row_dot_q5_k;
    case MG_Q6_K: return row_dot_q6_k;
    case MG_MXFP4: return row_dot_mxfp4;
    case MG_IQ4_NL: return row_dot_iq4_nl;
    case MG_IQ4_XS: return row_dot_iq4_xs;
    case MG_Q4_1: return row_dot_q4_1;
    case MG_Q5_1: return row_dot_q5_1;
    case MG_Q2_K: return row_dot_q2_k;
    case MG_Q3_K: return row_dot_q3_k;
    default: return mg_avx2_iq_row_dot(f); /* the grid formats (iq_avx2.c), NULL for others */
    }
}

int mg_avx2_ggml_takes(mg_format f) { return row_dot_of(f) != NULL; }

/* Columns per pass: the sums of x per 16 columns of one pass fit a stack array (16 KiB).
 * Almost every matrix is one pass; wider rows add the passes' partial sums. */
enum { GGML_PASS_COLS = 65536 };
/* Columns per pass in lane order (x's copy in xq on the stack, 32 KiB). */
enum { LANE_PASS_COLS = 8192 };

/* The columns each sum of x in xs covers for format f: 32 for the mins of Q4_1, Q5_1, Q4_K and
 * Q5_K and IQ1_S's deltas; 16 for Q2_K's (sub-blocks of 16); 0: no mins. */
static int xs_group(mg_format f) {
    switch (f) {
    case MG_Q4_1:
    case MG_Q5_1:
    case MG_Q4_K:
    case MG_Q5_K:
    case MG_IQ1_S: return 32; /* IQ1_S: its delta per 32 */
    case MG_Q2_K: return 16;
    default: return 0;
    }
}

/* The lane-order row of format f (NULL: it has none) and the columns each of its sums of x covers
 * (Q3_K and Q6_K: their offsets per sub-block of 16; IQ4_XS: its offset per 32; Q4_K, Q5_K: their
 * mins, as in the other rows). */
static row_dot_fn *lane_row_dot(mg_format f) {
    switch (f) {
    case MG_Q3_K: return row_dot_q3_k_lanes;
    case MG_Q4_K: return row_dot_q4_k_lanes;
    case MG_Q5_K: return row_dot_q5_k_lanes;
    case MG_Q6_K: return row_dot_q6_k_lanes;
    case MG_IQ4_XS: return row_dot_iq4_xs_lanes;
    default: return NULL;
    }
}
static int lane_xs_group(mg_format f) { return f == MG_Q3_K || f == MG_Q6_K ? 16 : 32; }

void mg_avx2_decode_ggml(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {
    const mg_format f = w->format;
    int64_t e, bytes;
    mg_format_block(f, &e, &bytes);
    row_dot_fn *const in_place = lane_row_dot(f);
    const int64_t pass = in_place ? LANE_PASS_COLS : GGML_PASS_COLS;
    const float *even = f == MG_IQ4_XS ? BYTES_TOP_SHIFTED : BYTES, *odd = f == MG_Q4_K ? HIGH_NIBBLES : even;
    const size_t rb = mg_matrix_row_bytes(w);
    float xs[GGML_PASS_COLS / 16] __attribute__((aligned(32)));
    float xq[LANE_PASS_COLS] __attribute__((aligned(32)));
    for (int64_t c0 = 0; c0 < w->cols; c0 += pass) {
        const int64_t kc = w->cols - c0 < pass ? w->cols - c0 : pass;
        const int in_lanes = in_place && lane_order_x(x + c0, kc, even, odd, xq);
        row_dot_fn *dot = in_lanes ? in_place : row_dot_of(f);
        const float *xr = in_lanes ? xq : x + c0;
        const int xg = in_lanes ? lane_xs_group(f) : xs_group(f);
        for (int64_t g = 0; xg && g < kc / xg; g++) {
            const float *xp = x + c0 + xg * g;
            __m256 s = _mm256_add_ps(_mm256_loadu_ps(xp), _mm256_loadu_ps(xp + 8));
            if (xg == 32) s = _mm256_add_ps(s, _mm256_add_ps(_mm256_loadu_ps(xp + 16), _mm256_loadu_ps(xp + 24)));
            xs[g] = hsum8(s);
        }
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb + (size_t)(c0 / e * bytes);
            const float part = dot(p, kc / e, xr, xs);
            y[r] = c0 == 0 ? part : y[r] + part;
        }
    }
}

/* ---- exact dequantisation of one block (prefill) ----------------------------------------- */

/* out[0..32) = codes * s (one rounding each, as the scalar decoder); emit32_2: s0 for the
 * first 16, s1 for the last (sub-blocks of 16). */
INLINE void emit32_2(__m256i q, __m256 s0, __m256 s1, float *out) {
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + 8 * k, _mm256_mul_ps(codes8(q, k), k < 2 ? s0 : s1));
}
INLINE void emit32(__m256i q, __m256 s, float *out) { emit32_2(q, s, s, out); }
/* out[0..32) = ds * q - dm: ds * q is exact, so one FMA rounds as the scalar mul then sub (and
 * Q4_1 / Q5_1's d * q + m is this with dm = -m); emit32_min2: ds0, dm0 for the first 16. */
INLINE void emit32_min2(__m256i q, __m256 ds0, __m256 dm0, __m256 ds1, __m256 dm1, float *out) {
    for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + 8 * k, _mm256_fmsub_ps(codes8(q, k), k < 2 ? ds0 : ds1, k < 2 ? dm0 : dm1));
}
INLINE void emit32_min(__m256i q, __m256 ds, __m256 dm, float *out) { emit32_min2(q, ds, dm, ds, dm, out); }

/* Q2_K (q3 = 0: (d*sc) * q - dmin*m) and Q3_K ((d*scale) * q) dequantised, 32 elements (two
 * sub-blocks of 16) at a time; every factor is exact, as in the scalar decoder. */
INLINE void dequant_qk(const uint8_t *p, int q3, float *out) {
    float ds[16], dm[16];
    if (q3) {
        q3_k_factors(p, ds);
    } else {
        const __m128i m4 = _mm_set1_epi8(0x0f), sc = _mm_loadu_si128((const __m128i *)p);
        ubytes16_times(_mm_and_si128(sc, m4), _mm256_set1_ps(f16_at(p + 80)), ds);
        ubytes16_times(_mm_and_si128(_mm_srli_epi16(sc, 4), m4), _mm256_set1_ps(f16_at(p + 82)), dm);
    }
    const __m256i hm = q3 ? loadu256(p) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i Q = loadu256(p + (q3 ? 32 : 16) + 32 * h);
        for (int g = 0; g < 4; g++) {
            const int j = 8 * h + 2 * g;
            const __m256i q = qk_group(Q, hm, q3, h, g);
            float *o = out + 128 * h + 32 * g;
            if (q3)
                emit32_2(q, _mm256_set1_ps(ds[j]), _mm256_set1_ps(ds[j + 1]), o);
            else
                emit32_min2(q, _mm256_set1_ps(ds[j]), _mm256_set1_ps(dm[j]), _mm256_set1_ps(ds[j + 1]), _mm256_set1_ps(dm[j + 1]), o);
        }
    }
}

void mg_avx2_ggml_dequant_block(mg_format f, const uint8_t *p, float *out) {
    switch (f) {
    case MG_Q8_0: emit32(CODES_Q8_0(p), _mm256_set1_ps(f16_at(p)), out); break;
    case MG_Q4_0: emit32(CODES_Q4_0(p), _mm256_set1_ps(f16_at(p)), out); break;
    case MG_Q5_0: emit32(CODES_Q5_0(p), _mm256_set1_ps(f16_at(p)), out); break;
    case MG_IQ4_NL: emit32(CODES_IQ4_NL(p), _mm256_set1_ps(f16_at(p)), out); break;
    case MG_MXFP4: emit32(CODES_MXFP4(p), _mm256_set1_ps(SCALE_E8M0(p)), out); break;
    case MG_Q4_1: emit32_min(CODES_Q4_1(p), _mm256_set1_ps(f16_at(p)), _mm256_set1_ps(-f16_at(p + 2)), out); break;
    case MG_Q5_1: emit32_min(CODES_Q5_1(p), _mm256_set1_ps(f16_at(p)), _mm256_set1_ps(-f16_at(p + 2)), out); break;
    case MG_Q2_K: dequant_qk(p, 0, out); break;
    case MG_Q3_K: dequant_qk(p, 1, out); break;
    case MG_Q4_K:
    case MG_Q5_K: {
        const int q5 = f == MG_Q5_K;
        uint8_t sc[8], mn[8];
        float ds[8], dm[8];
        mg_ggml_k4_scales_mins(p + 4, sc, mn);
        _mm256_storeu_ps(ds, bytes_times(sc, f16_at(p)));
        _mm256_storeu_ps(dm, bytes_times(mn, f16_at(p + 2)));
        const uint8_t *qs = p + (q5 ? 48 : 16);
        const __m256i qh = q5 ? loadu256(p + 16) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i lo, hi;
            k4_codes(qs, qh, c, q5, &lo, &hi);
            emit32_min(lo, _mm256_set1_ps(ds[2 * c]), _mm256_set1_ps(dm[2 * c]), out + 64 * c);
            emit32_min(hi, _mm256_set1_ps(ds[2 * c + 1]), _mm256_set1_ps(dm[2 * c + 1]), out + 64 * c + 32);
        }
        break;
    }
    case MG_Q6_K: {
        const float d = f16_at(p + 208);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6_k_half(p, h, q);
            for (int g = 0; g < 4; g++) {
                const int8_t *s = (const int8_t *)(p + 192 + 8 * h + 2 * g);
                emit32_2(q[g], _mm256_set1_ps(d * (float)s[0]), _mm256_set1_ps(d * (float)s[1]), out + 128 * h + 32 * g);
            }
        }
        break;
    }
    case MG_IQ4_XS: {
        const __m256i lut = lut16(MG_IQ4NL_VALUES);
        float dl[8];
        _mm256_storeu_ps(dl, iq4_xs_scales(p, f16_at(p)));
        for (int j = 0; j < 8; j++) emit32(_mm256_shuffle_epi8(lut, nibbles16(p + 8 + 16 * j)), _mm256_set1_ps(dl[j]), out + 32 * j);
        break;
    }
    default: mg_avx2_iq_dequant_block(f, p, out); break; /* the grid formats: iq_avx2.c */
    }
}
#endif
