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
 * factor once; IQ2's * 0.25 and IQ3_XXS's * 0.5 (exact powers of two) by the row's sum once.
 * IQ1's value dl * (entry + delta) splits as dl * (entry . x) + dl * delta * sum(x): IQ1_S has
 * one delta per 32 elements, whose sums of x ggml_avx2.c's decode makes once per call (xs);
 * IQ1_M's delta changes every 8, and it is added to the converted entry (one vaddps from a
 * broadcast load) instead.
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

/* ---- decode: one row's dot product with x over nb blocks of 256 ------------------------------ */

/* IQ2_XXS (66 bytes): per 32 elements 4 index bytes and a u32 of 4 7-bit sign fields and the
 * scale s; factor d * (0.5 + s) * 0.25, the 0.25 applied to the row's sum. */
static float row_dot_iq2_xxs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 66, x += 256) {
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

/* IQ2_XS (74 bytes) and IQ2_S (82 bytes, s = 1): per 32 elements 4 groups and one scale byte
 * (low nibble: groups 0, 1; high: 2, 3); factor d * (0.5 + nibble) * 0.25.  IQ2_XS: a u16 per
 * group, 9-bit index and 7 sign bits; IQ2_S: an index byte, 2 more index bits per group in qh and
 * a whole sign byte per group. */
INLINE float row_dot_iq2_xs_s(const uint8_t *p, int64_t nb, const float *x, int s2) {
    const size_t bytes = s2 ? 82 : 74;
    const uint8_t *const base = p;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, x += 256) {
        p = base + (size_t)i * bytes;
        const float d = f16_at(p);
        const uint8_t *sc = p + (s2 ? 74 : 66);
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
            const __m256 lo = group_dot(g[1], xb + 8, sg[1], _mm256_mul_ps(g[0], _mm256_xor_ps(_mm256_loadu_ps(xb), sign_row(sg[0]))));
            const __m256 hi = group_dot(g[3], xb + 24, sg[3], _mm256_mul_ps(g[2], _mm256_xor_ps(_mm256_loadu_ps(xb + 16), sign_row(sg[2]))));
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * (0.5f + (float)(sc[ib] & 15))), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * (0.5f + (float)(sc[ib] >> 4))), hi, acc1);
        }
    }
    return 0.25f * hsum8(_mm256_add_ps(acc0, acc1));
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
 * sign fields (per 8 elements) and the scale s; factor d * (0.5 + s) * 0.5, the 0.5 applied to
 * the row's sum. */
static float row_dot_iq3_xxs(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 98, x += 256) {
        const float d = f16_at(p);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 8 * ib;
            const float *xb = x + 32 * ib;
            uint32_t aux;
            memcpy(&aux, p + 66 + 4 * ib, 4);
            __m256 s0 = _mm256_mul_ps(entry4x2(mg_iq3xxs_grid[q[0]], mg_iq3xxs_grid[q[1]]),
                                      _mm256_xor_ps(_mm256_loadu_ps(xb), sign_row(KSIGN_MASKS[aux & 127])));
            __m256 s1 = _mm256_mul_ps(entry4x2(mg_iq3xxs_grid[q[2]], mg_iq3xxs_grid[q[3]]),
                                      _mm256_xor_ps(_mm256_loadu_ps(xb + 8), sign_row(KSIGN_MASKS[(aux >> 7) & 127])));
            s0 = group_dot(entry4x2(mg_iq3xxs_grid[q[4]], mg_iq3xxs_grid[q[5]]), xb + 16, KSIGN_MASKS[(aux >> 14) & 127], s0);
            s1 = group_dot(entry4x2(mg_iq3xxs_grid[q[6]], mg_iq3xxs_grid[q[7]]), xb + 24, KSIGN_MASKS[(aux >> 21) & 127], s1);
            const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(aux >> 28)));
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc1);
            else
                acc0 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc0);
        }
    }
    return 0.5f * hsum8(_mm256_add_ps(acc0, acc1));
}

/* IQ3_S (110 bytes): per 32 elements 8 index bytes, their 9th bits in one qh byte, 4 sign bytes
 * (one per 8 elements) and a scale nibble; factor d * (1 + 2s). */
static float row_dot_iq3_s(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 110, x += 256) {
        const float d = f16_at(p);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 8 * ib, *signs = p + 74 + 4 * ib;
            const unsigned qh = p[66 + ib];
            const float *xb = x + 32 * ib;
#define IQ3S_ENTRY(k) mg_iq3s_grid[q[k] | ((qh << (8 - (k))) & 0x100)]
            __m256 s0 = _mm256_mul_ps(entry4x2(IQ3S_ENTRY(0), IQ3S_ENTRY(1)),
                                      _mm256_xor_ps(_mm256_loadu_ps(xb), sign_row(SIGN_MASKS[signs[0]])));
            __m256 s1 = _mm256_mul_ps(entry4x2(IQ3S_ENTRY(2), IQ3S_ENTRY(3)),
                                      _mm256_xor_ps(_mm256_loadu_ps(xb + 8), sign_row(SIGN_MASKS[signs[1]])));
            s0 = group_dot(entry4x2(IQ3S_ENTRY(4), IQ3S_ENTRY(5)), xb + 16, SIGN_MASKS[signs[2]], s0);
            s1 = group_dot(entry4x2(IQ3S_ENTRY(6), IQ3S_ENTRY(7)), xb + 24, SIGN_MASKS[signs[3]], s1);
#undef IQ3S_ENTRY
            const int s = (p[106 + ib / 2] >> (4 * (ib & 1))) & 15;
            const __m256 db = _mm256_set1_ps(d * (float)(1 + 2 * s));
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc1);
            else
                acc0 = _mm256_fmadd_ps(db, _mm256_add_ps(s0, s1), acc0);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

/* The IQ1 delta for its sign bit: +1/8 (clear) or -1/8, loaded (IQ1_M: by a broadcast load)
 * rather than selected, which the compiler makes a branch the random signs mispredict. */
static const float IQ1_DELTAS[2] = {MG_IQ1_DELTA, -MG_IQ1_DELTA};

/* IQ1_S (50 bytes): per 32 elements 4 index bytes and a u16 with 3 more index bits per group,
 * the scale s and the delta's sign; dl * (entry . x) + dl * delta * xs[block of 32], xs the sums
 * of x per 32 columns (ggml_avx2.c's decode makes them). */
static float row_dot_iq1_s(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float m0 = 0, m1 = 0;
    for (int64_t i = 0; i < nb; i++, p += 50, x += 256, xs += 8) {
        const float d = f16_at(p);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = p + 2 + 4 * ib;
            uint16_t qh;
            memcpy(&qh, p + 34 + 2 * ib, 2);
            const float *xb = x + 32 * ib;
            const unsigned h = qh;
            __m256 s0 = _mm256_mul_ps(entry8s(mg_iq1s_grid[q[0] | ((h << 8) & 0x700)]), _mm256_loadu_ps(xb));
            __m256 s1 = _mm256_mul_ps(entry8s(mg_iq1s_grid[q[1] | ((h << 5) & 0x700)]), _mm256_loadu_ps(xb + 8));
            s0 = _mm256_fmadd_ps(entry8s(mg_iq1s_grid[q[2] | ((h << 2) & 0x700)]), _mm256_loadu_ps(xb + 16), s0);
            s1 = _mm256_fmadd_ps(entry8s(mg_iq1s_grid[q[3] | ((h >> 1) & 0x700)]), _mm256_loadu_ps(xb + 24), s1);
            const float dl = d * (float)(2 * ((h >> 12) & 7) + 1);
            const float dm = IQ1_DELTAS[h >> 15] * dl * xs[ib]; /* a table, not a branch: random signs */
            if (ib & 1)
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(dl), _mm256_add_ps(s0, s1), acc1), m1 += dm;
            else
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(dl), _mm256_add_ps(s0, s1), acc0), m0 += dm;
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1)) + (m0 + m1);
}

/* IQ1_M (56 bytes): per 16 elements (2 groups) 2 index bytes, one qh byte (a nibble per group: 3
 * index bits and the delta's sign) and a 3-bit scale s; factor d * (2s + 1), d from the scale
 * words' top nibbles.  The delta is added to the converted entry. */
static float row_dot_iq1_m(const uint8_t *p, int64_t nb, const float *x, const float *xs) {
    (void)xs;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 56, x += 256) {
        const float d = mg_ggml_iq1_m_d(p);
        uint64_t sw;
        memcpy(&sw, p + 48, 8);
        for (int k = 0; k < 32; k += 4) { /* groups k .. k + 3: two scales */
            const unsigned h0 = p[32 + k / 2], h1 = p[33 + k / 2];
            const float *xb = x + 8 * k;
            const __m256 g0 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k] | ((h0 << 8) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + ((h0 >> 3) & 1)));
            const __m256 g1 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 1] | ((h0 << 4) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + (h0 >> 7)));
            const __m256 g2 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 2] | ((h1 << 8) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + ((h1 >> 3) & 1)));
            const __m256 g3 = _mm256_add_ps(entry8s(mg_iq1s_grid[p[k + 3] | ((h1 << 4) & 0x700)]), _mm256_broadcast_ss(IQ1_DELTAS + (h1 >> 7)));
            const __m256 lo = _mm256_fmadd_ps(g1, _mm256_loadu_ps(xb + 8), _mm256_mul_ps(g0, _mm256_loadu_ps(xb)));
            const __m256 hi = _mm256_fmadd_ps(g3, _mm256_loadu_ps(xb + 24), _mm256_mul_ps(g2, _mm256_loadu_ps(xb + 16)));
            /* the scale of groups k, k + 1 is bits 3 * ((k / 2) % 4) .. of word k / 8, that of
             * groups k + 2, k + 3 the next 3 bits */
            const unsigned sc = (unsigned)(sw >> (16 * (k / 8) + 3 * ((k / 2) % 4)));
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(2 * (sc & 7) + 1)), lo, acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * (float)(2 * ((sc >> 3) & 7) + 1)), hi, acc1);
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

static void dequant_iq2_xs_s(const uint8_t *p, int s2, float *out) {
    const float d = f16_at(p);
    const uint8_t *sc = p + (s2 ? 74 : 66);
    for (int k = 0; k < 32; k++) {
        const int s = (sc[k / 4] >> (4 * ((k / 2) & 1))) & 15;
        const __m256 db = _mm256_set1_ps(d * (0.5f + (float)s) * 0.25f);
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
    const float d = f16_at(p);
    for (int m = 0; m < 32; m++) { /* elements 8m .. 8m + 7: entries 2m, 2m + 1, sign byte m */
        const int k0 = 2 * m, k1 = 2 * m + 1;
        const int i0 = p[2 + k0] | (((p[66 + k0 / 8] >> (k0 % 8)) & 1) << 8);
        const int i1 = p[2 + k1] | (((p[66 + k1 / 8] >> (k1 % 8)) & 1) << 8);
        const int s = (p[106 + k0 / 16] >> (4 * ((k0 / 8) & 1))) & 15;
        emit8(_mm256_set1_ps(d * (float)(1 + 2 * s)), entry4x2(mg_iq3s_grid[i0], mg_iq3s_grid[i1]), SIGN_MASKS[p[74 + m]], out + 8 * m);
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
    const float d = mg_ggml_iq1_m_d(p);
    uint16_t w[4];
    memcpy(w, p + 48, 8);
    for (int k = 0; k < 32; k++) {
        const int nib = (p[32 + k / 2] >> (4 * (k % 2))) & 15, s = (w[k / 8] >> (3 * ((k / 2) % 4))) & 7;
        emit8_iq1(d * (float)(2 * s + 1), mg_iq1s_grid[p[k] | ((nib & 7) << 8)], IQ1_DELTAS[nib >> 3], out + 8 * k);
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
