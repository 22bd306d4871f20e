/* AVX2 kernels for the ggml codebook ("grid") formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S and IQ1_M (layouts and the scalar twin in core/ggml_blocks.h, codebooks in
 * core/iq_grids.h), with fp32 activations.  ggml_avx2.c's dispatch calls in here: its decode loop
 * (row_dot_of, mg_avx2_iq_row_dot) and its exact dequantisation for prefill's tiles
 * (mg_avx2_iq_dequant_block).
 *
 * Decode (n_tok == 1).  Every group of 8 elements (IQ3: two codebook entries of 4) is one
 * codebook entry: its index is put together by scalar code, the entry's 8 bytes are widened
 * straight from the codebook in memory (vpmovzxbd / vpmovsxbd with a memory operand) and
 * converted to fp32.  The signs are not applied to the codes but to x: the group's sign byte
 * picks a row of SIGN_MASKS (8 fp32 sign bits), and x xor that row is x with the flipped
 * elements negated, one vxorps with a memory operand per 8 weights in place of the compare and
 * select a sign needs otherwise.  IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits whose eighth is
 * their parity (mg_iq2_ksigns): KSIGN_MASKS is keyed by the 7 bits directly, so no ksigns load.
 * The per-group products are summed per sub-scale (16 or 32 elements) and multiplied by its
 * factor once (see "sub-scale factors" below); a power of two common to a format's factors
 * multiplies the row's sum once.  IQ1's value dl * (entry + delta) splits as dl * (entry . x) +
 * dl * delta * sum(x): IQ1_S has one delta per 32 elements, whose sums of x ggml_avx2.c's decode
 * makes once per call (xs); IQ1_M's delta changes every 8, and it is added to the converted entry
 * (one vaddps from a broadcast load) instead.
 * Measured A/B and not kept (docs/KERNELS.md, IQ section): vpgatherdd of a sub-block's 8 IQ3
 * entries (2.3x slower on Zen 5), IQ3_XXS's codebook as fp32 and IQ3_S's indices built in
 * vector lanes (no change).
 *
 * Dequantisation (prefill's tiles): equal to the scalar decoder bit for bit.  There, every value
 * is (factor * entry) * (+-1) (IQ1: factor * (entry + delta), entry + delta exact) with the
 * factor exact: so vmulps of the same factor (computed in the same order) and the entries, then
 * the same sign bits by xor, give the same bits. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "core/ggml_blocks.h"

INLINE float f16_at(const uint8_t *p) { /* vcvtph2ps: exact, denormals included */
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- sign masks --------------------------------------------------------------------------- */

/* Row b: lane j holds the fp32 sign bit iff bit j of b is set (a constant table, 8 KiB). */
#define SGN_LANE(b, j) ((uint32_t)(((b) >> (j)) & 1u) << 31)
#define SGN_ROW(b) {SGN_LANE(b, 0), SGN_LANE(b, 1), SGN_LANE(b, 2), SGN_LANE(b, 3), \
                    SGN_LANE(b, 4), SGN_LANE(b, 5), SGN_LANE(b, 6), SGN_LANE(b, 7)}
#define SGN_ROW4(b) SGN_ROW(b), SGN_ROW((b) + 1), SGN_ROW((b) + 2), SGN_ROW((b) + 3)
#define SGN_ROW16(b) SGN_ROW4(b), SGN_ROW4((b) + 4), SGN_ROW4((b) + 8), SGN_ROW4((b) + 12)
#define SGN_ROW64(b) SGN_ROW16(b), SGN_ROW16((b) + 16), SGN_ROW16((b) + 32), SGN_ROW16((b) + 48)
static const uint32_t SIGN_MASKS[256][8] __attribute__((aligned(32))) = {SGN_ROW64(0), SGN_ROW64(64), SGN_ROW64(128),
                                                                           SGN_ROW64(192)};

/* The same rows keyed by the 7 stored bits of IQ2_XXS / IQ2_XS / IQ3_XXS: the eighth sign is
 * their parity (an even count of flips), as mg_iq2_ksigns makes it (4 KiB). */
#define PARITY7(b) (((b) ^ ((b) >> 1) ^ ((b) >> 2) ^ ((b) >> 3) ^ ((b) >> 4) ^ ((b) >> 5) ^ ((b) >> 6)) & 1u)
#define KSGN_ROW(b) SGN_ROW((b) | (PARITY7(b) << 7))
#define KSGN_ROW4(b) KSGN_ROW(b), KSGN_ROW((b) + 1), KSGN_ROW((b) + 2), KSGN_ROW((b) + 3)
#define KSGN_ROW16(b) KSGN_ROW4(b), KSGN_ROW4((b) + 4), KSGN_ROW4((b) + 8), KSGN_ROW4((b) + 12)
#define KSGN_ROW64(b) KSGN_ROW16(b), KSGN_ROW16((b) + 16), KSGN_ROW16((b) + 32), KSGN_ROW16((b) + 48)
static const uint32_t KSIGN_MASKS[128][8] __attribute__((aligned(32))) = {KSGN_ROW64(0u), KSGN_ROW64(64u)};

INLINE __m256 sign_row(const uint32_t *row) { return _mm256_load_ps((const float *)row); }

/* ---- codebook entries as fp32 --------------------------------------------------------------- */

/* 8 unsigned (IQ2) or signed (IQ1) codebook bytes at g. */
INLINE __m256 entry8u(const uint8_t *g) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)g)));
}
INLINE __m256 entry8s(const int8_t *g) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)g)));
}
/* Two IQ3 entries of 4 bytes: elements 0..3 from g0, 4..7 from g1. */
INLINE __m256 entry4x2(const uint8_t *g0, const uint8_t *g1) {
    uint32_t a, b;
    memcpy(&a, g0, 4);
    memcpy(&b, g1, 4);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_insert_epi32(_mm_cvtsi32_si128((int)a), (int)b, 1)));
}

/* One group's dot product: entry g times x[0..8) with the signs of row s, added to acc. */
INLINE __m256 group_dot(__m256 g, const float *x, const uint32_t *s, __m256 acc) {
    return _mm256_fmadd_ps(g, _mm256_xor_ps(_mm256_loadu_ps(x), sign_row(s)), acc);
}

/* ---- sub-scale factors ----------------------------------------------------------------------
 * Every format's factor is d * (2s + 1) times a power of two (IQ2: d * (0.5 + s) * 0.25 =
 * d * (2s + 1) / 8; IQ3_XXS: / 4; IQ3_S and IQ1: * 1).  Decode makes a block's factors d * (2s + 1)
 * eight at a time in vector lanes, stores them, and reads each by a broadcast load (no per-group
 * conversion); the power of two multiplies the row's sum once.  This made IQ2_S, IQ3_S and IQ1_M
 * ~12 % faster than a scalar factor per sub-scale; IQ2_XXS, whose scales sit 8 bytes apart,
 * measured 15 % slower with it (the lanes take two loads, shifts and a permute) and keeps the
 * scalar one. */

/* d * (2s + 1) for 8 dword lanes of s. */
INLINE __m256 odd_factors(__m256i s, float d) {
    const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(odd), _mm256_set1_ps(d));
}

/* IQ2_XS / IQ2_S: the factors d * (2s + 1) of the 8 scale bytes at sc, fl[ib] from the low nibble
 * (groups 0, 1 of ib), fh[ib] from the high one (groups 2, 3). */
INLINE void iq2_xs_factors(const uint8_t *sc, float d, float fl[8], float fh[8]) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sc));
    _mm256_store_ps(fl, odd_factors(_mm256_and_si256(b, _mm256_set1_epi32(15)), d));
    _mm256_store_ps(fh, odd_factors(_mm256_srli_epi32(b, 4), d));
}

/* IQ3_S: the factors d * (2s + 1) of its 8 scale nibbles (nibble ib % 2 of byte 106 + ib / 2). */
INLINE void iq3_s_factors(const uint8_t *p, float d, float f[8]) {
    uint32_t sc;
    memcpy(&sc, p + 106, 4);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128((int)sc)),
                                                  _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)), _mm256_set1_epi32(15));
    _mm256_store_ps(f, odd_factors(s, d));
}

/* IQ1_M's 16 factors d * (2s + 1), f[j] for elements 16j .. 16j + 15: s is bits 3 (j % 4) .. of
 * the u16 word j / 4 (4 words at 48, whose top nibbles make d). */
INLINE void iq1_m_factors(const uint8_t *p, float d, float f[16]) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(p + 48)));
    const __m256i shift = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9), m7 = _mm256_set1_epi32(7);
    const __m256i a = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
    const __m256i b = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3));
    _mm256_store_ps(f, odd_factors(_mm256_and_si256(_mm256_srlv_epi32(a, shift), m7), d));
    _mm256_store_ps(f + 8, odd_factors(_mm256_and_si256(_mm256_srlv_epi32(b, shift), m7), d));
}

/* ---- decode: one row's dot product with x over nb blocks of 256 ------------------------------ */

/* x[0..8) with the signs of row s, times entry g. */
INLINE __m256 group_mul(__m256 g, const float *x, const uint32_t *s) {
    return _mm256_mul_ps(g, _mm256_xor_ps(_mm256_loadu_ps(x), sign_row(s)));
}

/* IQ2_XXS (66 bytes): per 32 elements 4 index bytes and a u32 of 4 7-bit sign fields and the
 * scale s; factor d * (0.5 + s) * 0.25, the 0.25 applied to the row's sum. */
static float row_dot_iq2_xxs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 66, x += 256) {
        mg_avx2_prefetch_ahead(p, 66);
        const float d = f16_at(p);
        for (int ib = 0; ib < 8; ib += 2) {
            for (int h = 0; h < 2; h++) {
                const uint8_t *q = p + 2 + 8 * (ib + h);
                const float *xb = x + 32 * (ib + h);
                uint32_t aux;
                memcpy(&aux, q + 4, 4);
                __m256 s0 = _mm256_mul_ps(entry8u(mg_iq2xxs_grid[q[0]]),
                                          _mm256_xor_ps(_mm256_loadu_ps(xb), sign_row(KSIGN_MASKS[aux & 127])));
                __m256 s1 = _mm256_mul_ps(entry8u(mg_iq2xxs_grid[q[1]]),
                                          _mm256_xor_ps(_mm256_loadu_ps(xb + 8), sign_row(KSIGN_MASKS[(aux >> 7) & 127])));
                s0 = group_dot(entry8u(mg_iq2xxs_grid[q[2]]), xb + 16, KSIGN_MASKS[(aux >> 14) & 127], s0);
                s1 = group_dot(entry8u(mg_iq2xxs_grid[q[3]]), xb + 24, KSIGN_MASKS[(aux >> 21) & 127], s1);
                const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(aux >> 28)));
                if (h)
                    acc1 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc1);
                else
                    acc0 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc0);
            }
        }
    }
    return 0.25f * hsum8(_mm256_add_ps(acc0, acc1));
}

/* IQ2_XS (74 bytes) and IQ2_S (82 bytes, s2 = 1): per 32 elements 4 groups and one scale byte
 * (low nibble: groups 0, 1; high: 2, 3).  IQ2_XS: a u16 per group, 9-bit index and 7 sign bits;
 * IQ2_S: an index byte, 2 more index bits per group in qh and a whole sign byte per group. */
INLINE float row_dot_iq2_xs_s(const uint8_t *p, int64_t nb, const float *x, int s2) {
    const size_t bytes = s2 ? 82 : 74;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float fl[8] __attribute__((aligned(32))), fh[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, p += bytes, x += 256) {
        mg_avx2_prefetch_ahead(p, bytes);
        iq2_xs_factors(p + (s2 ? 74 : 66), f16_at(p), fl, fh);
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            __m256 g[4];
            const uint32_t *sg[4];
            if (s2) {
                const uint8_t *qs = p + 2 + 4 * ib, *signs = p + 34 + 4 * ib;
                const unsigned qh = p[66 + ib];
                for (int l = 0; l < 4; l++) {
                    g[l] = entry8u(mg_iq2s_grid[qs[l] | ((qh << (8 - 2 * l)) & 0x300)]);
                    sg[l] = SIGN_MASKS[signs[l]];
                }
            } else {
                uint64_t codes;
                memcpy(&codes, p + 2 + 8 * ib, 8);
                for (int l = 0; l < 4; l++) {
                    const unsigned c = (unsigned)(codes >> (16 * l));
                    g[l] = entry8u(mg_iq2xs_grid[c & 511]);
                    sg[l] = KSIGN_MASKS[(c >> 9) & 127];
                }
            }
            const __m256 lo = group_dot(g[1], xb + 8, sg[1], group_mul(g[0], xb, sg[0]));
            const __m256 hi = group_dot(g[3], xb + 24, sg[3], group_mul(g[2], xb + 16, sg[2]));
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(fl + ib), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(fh + ib), hi, acc1);
        }
    }
    return 0.125f * hsum8(_mm256_add_ps(acc0, acc1));
}
static float row_dot_iq2_xs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    return row_dot_iq2_xs_s(p, nb, x, 0);
}
static float row_dot_iq2_s(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    return row_dot_iq2_xs_s(p, nb, x, 1);
}

/* IQ3_XXS (98 bytes): 64 index bytes (one per 4 elements), then per 32 elements a u32 of 4 7-bit
 * sign fields (per 8 elements) and the scale s in its top 4 bits. */
static float row_dot_iq3_xxs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float f[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, p += 98, x += 256) {
        mg_avx2_prefetch_ahead(p, 98);
        _mm256_store_ps(f, odd_factors(_mm256_srli_epi32(_mm256_loadu_si256((const __m256i *)(p + 66)), 28), f16_at(p)));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 8 * ib;
            const float *xb = x + 32 * ib;
            uint32_t aux;
            memcpy(&aux, p + 66 + 4 * ib, 4);
            __m256 s0 = group_mul(entry4x2(mg_iq3xxs_grid[q[0]], mg_iq3xxs_grid[q[1]]), xb, KSIGN_MASKS[aux & 127]);
            __m256 s1 = group_mul(entry4x2(mg_iq3xxs_grid[q[2]], mg_iq3xxs_grid[q[3]]), xb + 8, KSIGN_MASKS[(aux >> 7) & 127]);
            s0 = group_dot(entry4x2(mg_iq3xxs_grid[q[4]], mg_iq3xxs_grid[q[5]]), xb + 16, KSIGN_MASKS[(aux >> 14) & 127], s0);
            s1 = group_dot(entry4x2(mg_iq3xxs_grid[q[6]], mg_iq3xxs_grid[q[7]]), xb + 24, KSIGN_MASKS[(aux >> 21) & 127], s1);
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc0);
        }
    }
    return 0.25f * hsum8(_mm256_add_ps(acc0, acc1));
}

/* IQ3_S (110 bytes): per 32 elements 8 index bytes, their 9th bits in one qh byte, 4 sign bytes
 * (one per 8 elements) and a scale nibble (nibble ib % 2 of byte 106 + ib / 2). */
static float row_dot_iq3_s(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float f[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, p += 110, x += 256) {
        mg_avx2_prefetch_ahead(p, 110);
        iq3_s_factors(p, f16_at(p), f);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 8 * ib, *signs = p + 74 + 4 * ib;
            const unsigned qh = p[66 + ib];
            const float *xb = x + 32 * ib;
#define IQ3S_ENTRY(k) mg_iq3s_grid[q[k] | ((qh << (8 - (k))) & 0x100)]
            __m256 s0 = group_mul(entry4x2(IQ3S_ENTRY(0), IQ3S_ENTRY(1)), xb, SIGN_MASKS[signs[0]]);
            __m256 s1 = group_mul(entry4x2(IQ3S_ENTRY(2), IQ3S_ENTRY(3)), xb + 8, SIGN_MASKS[signs[1]]);
            s0 = group_dot(entry4x2(IQ3S_ENTRY(4), IQ3S_ENTRY(5)), xb + 16, SIGN_MASKS[signs[2]], s0);
            s1 = group_dot(entry4x2(IQ3S_ENTRY(6), IQ3S_ENTRY(7)), xb + 24, SIGN_MASKS[signs[3]], s1);
#undef IQ3S_ENTRY
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc0);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* The IQ1 delta for its sign bit: +1/8 (clear) or -1/8, loaded (IQ1_M: by a broadcast load)
 * rather than selected, which the compiler makes a branch the random signs mispredict. */
static const float IQ1_DELTAS[2] = {MG_IQ1_DELTA, -MG_IQ1_DELTA};

/* IQ1_S (50 bytes): per 32 elements 4 index bytes and a u16 with 3 more index bits per group,
 * the scale s (bits 12..14) and the delta's sign (bit 15): dl * (entry . x) + dl * delta * xs[ib],
 * xs the sums of x per 32 columns (ggml_avx2.c's decode makes them); the block's 8 dl * (+-1)
 * times its 8 sums of x are one FMA, the 1/8 applied to the row's sum. */
static float row_dot_iq1_s(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), accd = _mm256_setzero_ps();
    float f[8] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, p += 50, x += 256, xs += 8) {
        mg_avx2_prefetch_ahead(p, 50);
        const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 34)));
        const __m256 dl = odd_factors(_mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7)), f16_at(p));
        _mm256_store_ps(f, dl);
        const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(qh, 15), 31));
        accd = _mm256_fmadd_ps(_mm256_xor_ps(dl, sign), _mm256_loadu_ps(xs), accd);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 4 * ib;
            uint16_t h16;
            memcpy(&h16, p + 34 + 2 * ib, 2);
            const unsigned h = h16;
            const float *xb = x + 32 * ib;
            __m256 s0 = _mm256_mul_ps(entry8s(mg_iq1s_grid[q[0] | ((h << 8) & 0x700)]), _mm256_loadu_ps(xb));
            __m256 s1 = _mm256_mul_ps(entry8s(mg_iq1s_grid[q[1] | ((h << 5) & 0x700)]), _mm256_loadu_ps(xb + 8));
            s0 = _mm256_fmadd_ps(entry8s(mg_iq1s_grid[q[2] | ((h << 2) & 0x700)]), _mm256_loadu_ps(xb + 16), s0);
            s1 = _mm256_fmadd_ps(entry8s(mg_iq1s_grid[q[3] | ((h >> 1) & 0x700)]), _mm256_loadu_ps(xb + 24), s1);
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc1);
            else
                acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + ib), _mm256_add_ps(s0, s1), acc0);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) + MG_IQ1_DELTA * hsum8(accd);
}

/* IQ1_M (56 bytes): per 16 elements (2 groups) 2 index bytes, one qh byte (a nibble per group: 3
 * index bits and the delta's sign) and a 3-bit scale.  The delta changes every 8 elements: it is
 * added to the converted entry. */
static float row_dot_iq1_m(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float f[16] __attribute__((aligned(32)));
    for (int64_t i = 0; i < nb; i++, p += 56, x += 256) {
        mg_avx2_prefetch_ahead(p, 56);
        iq1_m_factors(p, mg_ggml_iq1_m_d(p), f);
        for (int k = 0; k < 32; k += 4) { /* groups k .. k + 3: factors k / 2, k / 2 + 1 */
            const unsigned h0 = p[32 + k / 2], h1 = p[33 + k / 2];
            const float *xb = x + 8 * k;
            const __m256 g0 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k] | ((h0 << 8) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + ((h0 >> 3) & 1)));
            const __m256 g1 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 1] | ((h0 << 4) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + (h0 >> 7)));
            const __m256 g2 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 2] | ((h1 << 8) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + ((h1 >> 3) & 1)));
            const __m256 g3 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 3] | ((h1 << 4) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + (h1 >> 7)));
            const __m256 lo = _mm256_fmadd_ps(g1, _mm256_loadu_ps(xb + 8), _mm256_mul_ps(g0, _mm256_loadu_ps(xb)));
            const __m256 hi = _mm256_fmadd_ps(g3, _mm256_loadu_ps(xb + 24), _mm256_mul_ps(g2, _mm256_loadu_ps(xb + 16)));
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + k / 2), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(f + k / 2 + 1), hi, acc1);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

mg_avx2_row_dot_fn *mg_avx2_iq_row_dot(mg_format f) {
    switch (f) {
    case MG_IQ2_XXS: return row_dot_iq2_xxs;
    case MG_IQ2_XS: return row_dot_iq2_xs;
    case MG_IQ2_S: return row_dot_iq2_s;
    case MG_IQ3_XXS: return row_dot_iq3_xxs;
    case MG_IQ3_S: return row_dot_iq3_s;
    case MG_IQ1_S: return row_dot_iq1_s;
    case MG_IQ1_M: return row_dot_iq1_m;
    default: return NULL;
    }
}

/* ---- exact dequantisation of one block (prefill) ----------------------------------------- */

/* out[0..8) = (db * entry) with the signs of row s (a sign flip by xor is the scalar's * -1). */
INLINE void emit8(__m256 db, __m256 g, const uint32_t *s, float *out) {
    _mm256_storeu_ps(out, _mm256_xor_ps(_mm256_mul_ps(db, g), sign_row(s)));
}

static void dequant_iq2_xxs(const uint8_t *p, float *out) {
    const float d = f16_at(p);
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *q = p + 2 + 8 * ib;
        uint32_t aux;
        memcpy(&aux, q + 4, 4);
        const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(aux >> 28)) * 0.25f);
        for (int l = 0; l < 4; l++) emit8(db, entry8u(mg_iq2xxs_grid[q[l]]), KSIGN_MASKS[(aux >> (7 * l)) & 127], out + 32 * ib + 8 * l);
    }
}

/* The factors as decode makes them: d * (2s + 1) is the scalar's exact d * (0.5 + s) doubled, so
 * (d * (2s + 1)) * 0.125 equals its (d * (0.5 + s)) * 0.25 (no rounding in either: an f16 d times
 * 5 bits, and powers of two that stay above fp32's normal minimum). */
static void dequant_iq2_xs_s(const uint8_t *p, int s2, float *out) {
    float fl[8] __attribute__((aligned(32))), fh[8] __attribute__((aligned(32)));
    iq2_xs_factors(p + (s2 ? 74 : 66), f16_at(p), fl, fh);
    for (int k = 0; k < 32; k++) {
        const __m256 db = _mm256_mul_ps(_mm256_broadcast_ss((k & 2 ? fh : fl) + k / 4), _mm256_set1_ps(0.125f));
        if (s2) {
            const int idx = p[2 + k] | (((p[66 + k / 4] >> (2 * (k % 4))) & 3) << 8);
            emit8(db, entry8u(mg_iq2s_grid[idx]), SIGN_MASKS[p[34 + k]], out + 8 * k);
        } else {
            uint16_t code;
            memcpy(&code, p + 2 + 2 * k, 2);
            emit8(db, entry8u(mg_iq2xs_grid[code & 511]), KSIGN_MASKS[code >> 9], out + 8 * k);
        }
    }
}

static void dequant_iq3_xxs(const uint8_t *p, float *out) {
    const float d = f16_at(p);
    const uint8_t *qs = p + 2;
    for (int ib = 0; ib < 8; ib++) {
        uint32_t aux;
        memcpy(&aux, p + 66 + 4 * ib, 4);
        const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(aux >> 28)) * 0.5f);
        for (int l = 0; l < 4; l++) {
            const uint8_t *q = qs + 8 * ib + 2 * l;
            emit8(db, entry4x2(mg_iq3xxs_grid[q[0]], mg_iq3xxs_grid[q[1]]), KSIGN_MASKS[(aux >> (7 * l)) & 127], out + 32 * ib + 8 * l);
        }
    }
}

static void dequant_iq3_s(const uint8_t *p, float *out) {
    float f[8] __attribute__((aligned(32))); /* d * (1 + 2s), the scalar's product */
    iq3_s_factors(p, f16_at(p), f);
    for (int m = 0; m < 32; m++) { /* elements 8m .. 8m + 7: entries 2m, 2m + 1, sign byte m */
        const int k0 = 2 * m, k1 = 2 * m + 1;
        const int i0 = p[2 + k0] | (((p[66 + k0 / 8] >> (k0 % 8)) & 1) << 8);
        const int i1 = p[2 + k1] | (((p[66 + k1 / 8] >> (k1 % 8)) & 1) << 8);
        emit8(_mm256_broadcast_ss(f + m / 4), entry4x2(mg_iq3s_grid[i0], mg_iq3s_grid[i1]), SIGN_MASKS[p[74 + m]], out + 8 * m);
    }
}

/* IQ1: dl * (entry + delta), entry + delta exact. */
INLINE void emit8_iq1(float dl, const int8_t *g, float delta, float *out) {
    _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(dl), _mm256_add_ps(entry8s(g), _mm256_set1_ps(delta))));
}

static void dequant_iq1_s(const uint8_t *p, float *out) {
    const float d = f16_at(p);
    for (int ib = 0; ib < 8; ib++) {
        uint16_t qh;
        memcpy(&qh, p + 34 + 2 * ib, 2);
        const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
        const float delta = IQ1_DELTAS[qh >> 15];
        for (int l = 0; l < 4; l++) emit8_iq1(dl, mg_iq1s_grid[p[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], delta, out + 32 * ib + 8 * l);
    }
}

static void dequant_iq1_m(const uint8_t *p, float *out) {
    float f[16] __attribute__((aligned(32))); /* d * (2s + 1), the scalar's product */
    iq1_m_factors(p, mg_ggml_iq1_m_d(p), f);
    for (int k = 0; k < 32; k++) {
        const int nib = (p[32 + k / 2] >> (4 * (k % 2))) & 15;
        emit8_iq1(f[k / 2], mg_iq1s_grid[p[k] | ((nib & 7) << 8)], IQ1_DELTAS[nib >> 3], out + 8 * k);
    }
}

int mg_avx2_iq_dequant_block(mg_format f, const uint8_t *p, float *out) {
    switch (f) {
    case MG_IQ2_XXS: dequant_iq2_xxs(p, out); return 1;
    case MG_IQ2_XS: dequant_iq2_xs_s(p, 0, out); return 1;
    case MG_IQ2_S: dequant_iq2_xs_s(p, 1, out); return 1;
    case MG_IQ3_XXS: dequant_iq3_xxs(p, out); return 1;
    case MG_IQ3_S: dequant_iq3_s(p, out); return 1;
    case MG_IQ1_S: dequant_iq1_s(p, out); return 1;
    case MG_IQ1_M: dequant_iq1_m(p, out); return 1;
    default: return 0;
    }
}
#endif
