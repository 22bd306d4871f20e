/* AVX-512 VNNI kernels for the ggml block formats with int8 activations (core/q8_act.h; the
 * arithmetic and its scalar twin: kernels/scalar/q8_scalar.c).  vpdpbusd multiplies 64 unsigned
 * bytes by 64 signed bytes and adds each 4 products into 16 i32 lanes in one instruction, where
 * AVX2 needs vpmaddubsw + vpmaddwd on 32: a zmm covers two 32-column groups, lanes 0-7 the first
 * and 8-15 the second, so the per-group factor wd * dx is a vector [f0 x 8 | f1 x 8].
 *  - unsigned weight codes (Q4_K, Q5_K: 0..31; Q6_K: 0..63 before its -32) go straight into the
 *    unsigned operand; Q6_K's offset enters as the sum's start value -32 * (sum of 4 x codes);
 *  - signed codes of the 32-element formats (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4) as w + 128, the
 *    sum started at -128 * (sum of 4 x codes); IQ4_XS takes |w| and x negated where w < 0
 *    (AVX-512 has no vpsignb: vpabsb, vpmovb2m and a masked subtract).
 * Those start values and everything else about x that every row needs are prepared once per
 * token (prep_*), and rows go four per pass (rows_*), see below.
 * The sums stay exact (|4 products| < 2^16 per step, |isum| < 2^24), so the results differ from
 * the scalar twin's only in the order of the fp32 additions.  Selected at run time: the avx512
 * table takes these entries on a CPU with AVX512_VNNI (table_avx512.c), else keeps avx2's. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/scalar/scalar.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"
#include "core/ggml_blocks.h"

INLINE float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* [a x 8 | b x 8]: the factors of two 32-column groups. */
INLINE __m512 pair(float a, float b) { return _mm512_insertf32x8(_mm512_set1_ps(a), _mm256_set1_ps(b), 1); }

/* sum of 4 products of unsigned u and signed x per i32 lane */
INLINE __m512i udot(__m512i u, __m512i x) { return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, x); }
/* both signed: |w| times x negated where w < 0 */
INLINE __m512i sdot(__m512i w, __m512i x) {
    const __m512i nx = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), nx);
}
INLINE __m512 fma_i32(__m512 f, __m512i p, __m512 acc) { return _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc); }

/* 16 nibble bytes in Q4_0 order as 32 bytes 0..15 in element order. */
INLINE __m256i nib32(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1),
                            _mm256_set1_epi8(0x0f));
}
INLINE __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }
static const int8_t Q4_0_VALUES[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
INLINE __m512i lut64(const int8_t *v) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)v)); }

/* Lane indices picking factors a (lanes 0-7) and b (lanes 8-15) of a factor vector. */
INLINE __m512i pair_index_n(int a, int b) {
    return _mm512_inserti64x4(_mm512_set1_epi32(a), _mm256_set1_epi32(b), 1);
}

/* ---- K-quants: x prepared once per token and column pass, rows in groups of four ---------
 * Every row of a call reads the same x, so whatever about x a block needs (its codes in the
 * order the weight bytes come, its scales laid out as the factor vectors want them, Q6_K's
 * offset sums) is prepared once per token (prep_k4, prep_q6) and then read by every row; and
 * rows go four per pass, so that one load of x serves four weight streams and the end-of-row
 * reductions of four rows share their shuffles (reduce4). */

/* Widest column pass: the prepared x lives on the stack (wider rows add the passes' sums). */
enum { XP_MAX = 8192 };

typedef struct {
    const int8_t *codes;                                 /* q (Q4_K / Q5_K) or x's own codes */
    const float *dx, *sx;                                /* x's own scales and sums per 32 */
    int8_t q[XP_MAX] __attribute__((aligned(64)));      /* Q4_K / Q5_K: the codes permuted */
    float ds[XP_MAX / 16] __attribute__((aligned(64))); /* per block: 16 floats (below) */
    int32_t off[XP_MAX / 4] __attribute__((aligned(64))); /* Q6_K: -32 * (sum of 4 codes) */
    int16_t xs16[XP_MAX / 16] __attribute__((aligned(64))); /* Q2_K: sums of x per 16 columns */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

/* Prefetch of the R-row loops: the rows of a group are contiguous, and so is the group ahead
 * (rows_ahead: at least 8 KiB on); each step of R blocks prefetches the next R * block bytes of
 * it in order (mg_prefetch_rows), so that the group ahead is in cache when its turn comes.
 * Hardware prefetch alone follows R interleaved streams badly: four rows without it streamed
 * ~11 GB/s instead of ~27.  Into L1 on Zen 4 (a little faster there than L2), into L2 on a
 * Sapphire Rapids-class Intel core (Q4_K_M decode 11-19 % faster there; docs/KERNELS.md). */
/* Horizontal sums of four accumulators: {sum a, sum b, sum c, sum d}. */
INLINE __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
    const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
    const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
    const __m256 ab = _mm256_hadd_ps(a8, b8), cd = _mm256_hadd_ps(c8, d8); /* a01 a23 b01 b23 | a45 a67 b45 b67 */
    const __m256 abcd = _mm256_hadd_ps(ab, cd);                           /* a b c d (lanes 0-3) | (4-7) */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* Q4_K / Q5_K.  x's 32-column groups of each 256 in the order 0 2 1 3 4 6 5 7: one 64-byte load
 * of codes holds chunks c and c + 1, whose low nibbles are sub-blocks 2c and 2c + 2 and high
 * nibbles 2c + 1 and 2c + 3, against x in that order.  ds per block: dx of its 8 groups, then
 * their sums sx, so that the 8 factors d*sc*dx and the 8 min terms dmin*m*sx come from one
 * 16-lane multiply. */
static void prep_k4(const int8_t *q, const float *dx, const float *sx, int64_t cols, prep_x *p) {
    static const int order[8] = {0, 2, 1, 3, 4, 6, 5, 7};
    for (int64_t b = 0; b < cols; b += 256) {
        for (int g = 0; g < 8; g++) memcpy(p->q + b + 32 * g, q + b + 32 * order[g], 32);
        memcpy(p->ds + b / 16, dx + b / 32, 32);
        memcpy(p->ds + b / 16 + 8, sx + b / 32, 32);
    }
    p->codes = p->q;
}

/* The 8 scales and 8 mins of a Q4_K / Q5_K block (12 bytes at s) as 16 bytes sc0..7 m0..7: the
 * 32-bit words a, b, c give sc0-3 = a & 63, sc4-7 = (c & 15) | (a >> 6) << 4, m0-3 = b & 63,
 * m4-7 = (c >> 4) | (b >> 6) << 4 (ggml_blocks.h), one dword lane each. */
INLINE __m128i k4_scales_mins(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);  /* a b c + 4 bytes of the block */
    const __m128i t = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* a c b c */
    const __m128i u = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* a a b b */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(t, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* lo | ((u >> 2) & 0x30 in lanes 1 and 3) */
    return _mm_ternarylogic_epi32(lo, _mm_srli_epi32(u, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030), 0xf8);
}

/* One block's 16 factors [d*sc_j*dx_j (j < 8) | dmin*m_j*sx_j]: the same products as the twin's
 * wd * dx and wm * sx (d*sc and dmin*m are exact). */
INLINE __m512 k4_factors(const uint8_t *p, const float *ds) {
    uint32_t dd;
    memcpy(&dd, p, 4);
    const __m512 d2 = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128((int)dd)));
    const __m512 dm = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d2);
    const __m512 sm = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(k4_scales_mins(p + 4)));
    return _mm512_mul_ps(_mm512_mul_ps(sm, dm), _mm512_load_ps(ds));
}

/* R rows (1 or 4) of Q4_K (q5 = 0) or Q5_K, nb blocks each, from row p[0] on, rb bytes apart:
 * out[r] += the row's dot product with the prepared x. */
INLINE void rows_k4(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, int q5, float *out) {
    const size_t ahead = rows_ahead(R * rb);
    const __m512i m4 = _mm512_set1_epi8(0x0f), k16 = _mm512_set1_epi8(0x10);
    const __m512i pick[4] = {pair_index_n(0, 2), pair_index_n(1, 3), pair_index_n(4, 6), pair_index_n(5, 7)};
    const size_t bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        mg_prefetch_rows(pf, R * bytes, x->l2);
        const int8_t *xq = x->codes + 256 * i;
        const float *ds = x->ds + 16 * i;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            const __m512 f = k4_factors(b, ds);
            acc[r] = _mm512_mask_sub_ps(acc[r], 0xff00, acc[r], f); /* lanes 8-15: minus the min terms */
            const __m512i qh =
                q5 ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 16))) : _mm512_setzero_si512();
#pragma GCC unroll 2
            for (int c = 0; c < 4; c += 2) {
                const __m512i v = _mm512_loadu_si512((const void *)(b + qs + 32 * c));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (q5) { /* fifth bits: bit j of qh[l] for sub-block j, element l */
                    const __m512i blo = join(_mm256_set1_epi8((char)(1 << (2 * c))), _mm256_set1_epi8((char)(4 << (2 * c))));
                    const __m512i bhi = join(_mm256_set1_epi8((char)(2 << (2 * c))), _mm256_set1_epi8((char)(8 << (2 * c))));
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, k16);
                    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bhi), hi, k16);
                }
                const __m512i x0 = _mm512_load_si512((const void *)(xq + 64 * c));
                const __m512i x1 = _mm512_load_si512((const void *)(xq + 64 * c + 64));
                acc[r] = fma_i32(_mm512_permutexvar_ps(pick[c], f), udot(lo, x0), acc[r]);
                acc[r] = fma_i32(_mm512_permutexvar_ps(pick[c + 1], f), udot(hi, x1), acc[r]);
            }
        }
    }
    if (R == 4) {
        _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), reduce4(acc[0], acc[1], acc[2], acc[3])));
    } else {
        for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
    }
}

/* Q6_K.  ds per block: dx per 16 columns (each group's scale twice); off per 64 columns: -32 *
 * the sum of each 4 codes, the start of vpdpbusd's sum, so the unsigned codes u (0..63) give
 * sum (u - 32) x without a second dot product. */
static void prep_q6(const int8_t *q, const float *dx, int64_t cols, prep_x *p) {
    const __m512i k32 = _mm512_set1_epi8(32);
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int64_t b = 0; b < cols; b += 256)
        _mm512_store_ps(p->ds + b / 16,
                        _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(dx + b / 32))));
    for (int64_t c = 0; c < cols; c += 64)
        _mm512_store_si512((void *)(p->off + c / 4),
                           _mm512_sub_epi32(_mm512_setzero_si512(), udot(k32, _mm512_loadu_si512((const void *)(q + c)))));
    p->codes = q;
}

/* R rows (1 or 4) of Q6_K.  Per half h of a block, ql[64h ..) is one zmm whose low nibbles are
 * the half's elements 0..63 and high nibbles 64..127; qh[32h ..) (broadcast to both 256-bit
 * halves) holds element e's top 2 bits at shift 2 * (e / 32): moved to bits 4-5 by one 16-bit
 * shift per chunk (left 4 and 2, right 0 and 2: the bits a 16-bit shift carries in from the
 * neighbouring byte are masked off) and merged by one ternary-logic op.  The factor of chunk k
 * (64 elements), lane l (elements 4l .. 4l + 3): d * sc[4k + l / 4] * dx, one vpermps of the
 * block's 16 factors. */
INLINE void rows_q6_k(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    const size_t ahead = rows_ahead(R * rb);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i cnt0 = join(_mm256_set1_epi16(4), _mm256_set1_epi16(2)); /* left: shifts 0 and 2 */
    const __m512i cnt1 = join(_mm256_set1_epi16(0), _mm256_set1_epi16(2)); /* right: shifts 4 and 6 */
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i pick[4] = {spread, _mm512_add_epi32(spread, _mm512_set1_epi32(4)),
                             _mm512_add_epi32(spread, _mm512_set1_epi32(8)), _mm512_add_epi32(spread, _mm512_set1_epi32(12))};
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += 210, pf += R * 210) {
        mg_prefetch_rows(pf, R * 210, x->l2);
        const int8_t *xq = x->codes + 256 * i;
        const int32_t *off = x->off + 64 * i;
        const __m512 dx = _mm512_load_ps(x->ds + 16 * i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 192))));
            const __m512 f = _mm512_mul_ps(_mm512_mul_ps(sc, _mm512_set1_ps(f16_at(b + 208))), dx);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m512i ql = _mm512_loadu_si512((const void *)(b + 64 * h));
                const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h)));
                /* u = lo | (shifted qh & 0x30): ternary logic 0xf8 is a | (b & c) */
                const __m512i lo0 = _mm512_and_si512(ql, m4), lo1 = _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4);
                const __m512i u0 = _mm512_ternarylogic_epi32(lo0, _mm512_sllv_epi16(qh, cnt0), m30, 0xf8);
                const __m512i u1 = _mm512_ternarylogic_epi32(lo1, _mm512_srlv_epi16(qh, cnt1), m30, 0xf8);
                /* x: the caller's codes (64-byte aligned by q8_act.h's contract; loadu costs
                 * nothing extra when they are) */
                const __m512i p0 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(off + 32 * h)), u0,
                                                       _mm512_loadu_si512((const void *)(xq + 128 * h)));
                const __m512i p1 = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(off + 32 * h + 16)), u1,
                                                       _mm512_loadu_si512((const void *)(xq + 128 * h + 64)));
                acc[r] = fma_i32(_mm512_permutexvar_ps(pick[2 * h], f), p0, acc[r]);
                acc[r] = fma_i32(_mm512_permutexvar_ps(pick[2 * h + 1], f), p1, acc[r]);
            }
        }
    }
    if (R == 4) {
        _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), reduce4(acc[0], acc[1], acc[2], acc[3])));
    } else {
        for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
    }
}

/* ---- Q2_K / Q3_K ------------------------------------------------------------------------
 * Their 64 code bytes are one zmm: bits 2s.. of the first 32 are group s, of the last 32 group
 * 4 + s, so x's groups go in the order 0 4 1 5 2 6 3 7 (prep_k23) and one shift and mask per s
 * gives a zmm of codes [group s | group 4 + s]. */

/* x permuted so, dx per 16 columns (as prep_q6), x's sums per 16 in column order (Q2_K's mins)
 * and, for Q3_K (q3), off: -4 * (sum of 4 codes), the start of vpdpbusd's sum, so its unsigned
 * codes u = q + 4 (0..7) give sum q x. */
static void prep_k23(const int8_t *q, const float *dx, int64_t cols, int q3, prep_x *p) {
    static const int order[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int64_t b = 0; b < cols; b += 256) {
        for (int g = 0; g < 8; g++) memcpy(p->q + b + 32 * g, q + b + 32 * order[g], 32);
        _mm512_store_ps(p->ds + b / 16, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(dx + b / 32))));
    }
    for (int64_t c = 0; c < cols; c += 16) {
        int sum = 0;
        for (int l = 0; l < 16; l++) sum += q[c + l];
        p->xs16[c / 16] = (int16_t)sum;
    }
    if (q3)
        for (int64_t c = 0; c < cols; c += 64)
            _mm512_store_si512((void *)(p->off + c / 4),
                               _mm512_sub_epi32(_mm512_setzero_si512(), udot(_mm512_set1_epi8(4), _mm512_load_si512((const void *)(p->q + c)))));
    p->codes = p->q, p->dx = dx;
}

/* R rows (1 or 4) of Q2_K (q3 = 0) or Q3_K.  The factors per 16 columns d * k * dx (d * k
 * exact), one vpermps each for the lanes of a zmm of codes ([2s x4, 2s+1 x4, 8+2s x4, 9+2s x4]
 * of the 16).  Q3_K's high bits: bit s (first 32 bytes) and 4 + s (last 32) of hmask, a mask
 * that adds 4.  Q2_K's mins: the 8 groups' imin is one vpmaddwd of the 16 min nibbles with x's
 * sums per 16, taken off lanes 0-7 times dmin * dx (the twin's products). */
INLINE void rows_k23(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, int q3, float *out) {
    const size_t ahead = rows_ahead(R * rb);
    const size_t bytes = q3 ? 110 : 84, qs = q3 ? 32 : 16;
    const __m512i m3 = _mm512_set1_epi8(3), k4 = _mm512_set1_epi8(4);
    __m512i pick[4];
    for (int s = 0; s < 4; s++)
        pick[s] = _mm512_setr_epi32(2 * s, 2 * s, 2 * s, 2 * s, 2 * s + 1, 2 * s + 1, 2 * s + 1, 2 * s + 1, 8 + 2 * s, 8 + 2 * s,
                                    8 + 2 * s, 8 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s, 9 + 2 * s);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        mg_prefetch_rows(pf, R * bytes, x->l2);
        const int8_t *xq = x->codes + 256 * i;
        const int32_t *off = x->off + 64 * i;
        const __m512 dx16 = _mm512_load_ps(x->ds + 16 * i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            __m512i k;
            __m512i hm = _mm512_setzero_si512();
            if (q3) {
                k = _mm512_cvtepi8_epi32(q3_k_scales(b + 96));
                hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b));
            } else {
                const __m128i sc = _mm_loadu_si128((const __m128i *)b);
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
                const __m256i imin = _mm256_madd_epi16(mins, _mm256_load_si256((const __m256i *)(x->xs16 + 16 * i)));
                const __m256 fm = _mm256_mul_ps(_mm256_set1_ps(f16_at(b + 82)), _mm256_loadu_ps(x->dx + 8 * i));
                acc[r] = _mm512_mask3_fnmadd_ps(_mm512_castps256_ps512(fm), _mm512_castps256_ps512(_mm256_cvtepi32_ps(imin)),
                                                acc[r], 0x00ff);
                k = _mm512_cvtepu8_epi32(_mm_and_si128(sc, _mm_set1_epi8(15)));
            }
            const __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(k), _mm512_set1_ps(f16_at(b + (q3 ? 108 : 80)))), dx16);
            const __m512i v = _mm512_loadu_si512((const void *)(b + qs));
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
                __m512i u = _mm512_and_si512(s ? _mm512_srli_epi16(v, 2 * s) : v, m3);
                __m512i start = _mm512_setzero_si512();
                if (q3) {
                    const __m512i bits = join(_mm256_set1_epi8((char)(1 << s)), _mm256_set1_epi8((char)(16 << s)));
                    u = _mm512_mask_add_epi8(u, _mm512_test_epi8_mask(hm, bits), u, k4);
                    start = _mm512_load_si512((const void *)(off + 16 * s));
                }
                const __m512i prod = _mm512_dpbusd_epi32(start, u, _mm512_load_si512((const void *)(xq + 64 * s)));
                acc[r] = fma_i32(_mm512_permutexvar_ps(pick[s], f), prod, acc[r]);
            }
        }
    }
    if (R == 4) {
        _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), reduce4(acc[0], acc[1], acc[2], acc[3])));
    } else {
        for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
    }
}

/* ---- blocks of 32 with one scale (Q8_0, Q4_0, Q5_0, IQ4_NL, MXFP4, Q4_1, Q5_1) -------------
 * Signed codes w go into vpdpbusd's unsigned operand as w + 128 (w ^ 0x80 for Q8_0; the +128
 * folded into the value tables, once per call, and into Q5_0's offset for the others), and x's
 * part 128 * sum x is taken off by starting each sum at -128 * (sum of the 4 codes of x),
 * prepared once per token: one xor (or nothing) instead of the sign trick's three operations
 * per 64 weights.  Exact: (w + 128) x - 128 x = w x, |lane| < 2^17.  Q4_1 and Q5_1's codes are
 * unsigned already (sums start at 0); their mins m * sx go into one lane of each block only, once per
 * block (a masked add). */

/* Whether two blocks of format f go into a zmm as nibble halves (nibbles2): every 32-element
 * format but Q8_0, whose bytes are its codes. */
INLINE int nibble_format(mg_format f) { return f != MG_Q8_0; }

/* off per 64 columns: -128 * (sum of each 4 codes); a last half chunk reads only its 32.  For the
 * nibble formats x's 16-byte quarters of each 64 columns go in the order 0 2 1 3 (into p->q), the
 * order of nibbles2's codes: both blocks' low nibbles, then both blocks' high nibbles. */
static void prep_32(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t cols, prep_x *p) {
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t c = 0; c < cols; c += 64) {
        __m512i x = _mm512_maskz_loadu_epi8(cols - c >= 64 ? ~0ull : 0xffffffffull, q + c);
        if (nibble_format(f)) {
            x = _mm512_shuffle_i64x2(x, x, _MM_SHUFFLE(3, 1, 2, 0));
            _mm512_store_si512((void *)(p->q + c), x);
        }
        _mm512_store_si512((void *)(p->off + c / 4), _mm512_sub_epi32(_mm512_setzero_si512(), udot(k128, x)));
    }
    p->codes = nibble_format(f) ? p->q : q, p->dx = dx, p->sx = sx;
}

/* The codes (+ 128 for the signed formats; table formats: the nibble indices, looked up by the
 * caller) of the blocks at p and p + bytes (two: 0, the bytes past a last odd block) as
 * [block 0's elements 0-15 | block 1's 0-15 | block 0's 16-31 | block 1's 16-31]: one 32-byte
 * register of both blocks' nibble bytes, shifted once for the high nibbles, where element order
 * took a shift and an insert per block.  Q5_0 / Q5_1's fifth bits: one 64-bit mask of the two
 * qh words in that order, one masked add. */
INLINE __m512i nibbles2(mg_format f, const uint8_t *p, size_t bytes, int two) {
    const size_t at = mg_ggml_qs_at(f);
    const __m128i b0 = _mm_loadu_si128((const __m128i *)(p + at));
    const __m256i v = two ? _mm256_inserti128_si256(_mm256_castsi128_si256(b0), _mm_loadu_si128((const __m128i *)(p + bytes + at)), 1)
                          : _mm256_zextsi128_si256(b0);
    __m512i u = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1), _mm512_set1_epi8(0x0f));
    if (f == MG_Q5_0 || f == MG_Q5_1) {
        uint32_t h0, h1 = 0;
        memcpy(&h0, p + at - 4, 4);
        if (two) memcpy(&h1, p + bytes + at - 4, 4);
        const uint64_t m = (uint64_t)(h0 & 0xffff) | (uint64_t)(h1 & 0xffff) << 16 | (uint64_t)(h0 >> 16) << 32 | (uint64_t)(h1 >> 16) << 48;
        u = _mm512_mask_add_epi8(u, m, u, _mm512_set1_epi8(0x10));
        if (f == MG_Q5_0) u = _mm512_add_epi8(u, _mm512_set1_epi8(128 - 16)); /* q - 16 + 128 */
    }
    return u;
}

/* Both scales of blocks p and p + bytes times dx[0..1], spread to the lanes of their blocks:
 * [f0 x 8 | f1 x 8] (Q8_0), [f0 x 4, f1 x 4, f0 x 4, f1 x 4] (the nibble formats): one vcvtph2ps,
 * one vmulps and one vpermps (the same products wd * dx as the scalar twin). */
INLINE __m512 scales2(mg_format f, const uint8_t *p, size_t bytes, const float *dx) {
    const __m512i spread01 = nibble_format(f) ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                                              : _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1);
    __m128 s2;
    if (f == MG_MXFP4) {
        s2 = _mm_setr_ps(mg_ggml_e8m0_half(p[0]), mg_ggml_e8m0_half(p[bytes]), 0.0f, 0.0f);
    } else {
        uint16_t h0, h1;
        memcpy(&h0, p, 2);
        memcpy(&h1, p + bytes, 2);
        s2 = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
    }
    s2 = _mm_mul_ps(s2, _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)dx))); /* dx[0..1]: 4-byte aligned */
    return _mm512_permutexvar_ps(spread01, _mm512_castps128_ps512(s2));
}

/* R rows (1 or 4) of a 32-element format, nb blocks each, two blocks per zmm. */
INLINE void rows_32(const int R, mg_format f, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    int64_t e, bytes_i;
    mg_format_block(f, &e, &bytes_i);
    const size_t bytes = (size_t)bytes_i;
    const size_t ahead = rows_ahead(R * rb);
    const int lut = f == MG_Q4_0 || f == MG_IQ4_NL || f == MG_MXFP4;
    const int with_min = f == MG_Q4_1 || f == MG_Q5_1; /* unsigned codes, a min per block */
    const __m512i k80 = _mm512_set1_epi8((char)0x80); /* value + 128 = value ^ 0x80 */
    const int8_t *values = f == MG_Q4_0 ? Q4_0_VALUES : f == MG_IQ4_NL ? MG_IQ4NL_VALUES : MG_MXFP4_VALUES2;
    const __m512i tbl = _mm512_xor_si512(lut64(values), k80);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const int8_t *q = x->codes;
    const int32_t *off = x->off;
    const float *dx = x->dx, *sx = x->sx;
    int64_t i = 0;
    const uint8_t *pf = p + ahead;
    for (; i + 2 <= nb; i += 2, p += 2 * bytes, pf += R * 2 * bytes, q += 64, off += 16, dx += 2, sx += 2) {
        mg_prefetch_rows(pf, R * 2 * bytes, x->l2);
        const __m512i xv = _mm512_loadu_si512((const void *)q);
        const __m512i o = with_min ? _mm512_setzero_si512() : _mm512_load_si512((const void *)off);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            __m512i u = f == MG_Q8_0 ? _mm512_xor_si512(join(_mm256_loadu_si256((const __m256i *)(b + 2)),
                                                              _mm256_loadu_si256((const __m256i *)(b + bytes + 2))), k80)
                                     : nibbles2(f, b, bytes, 1);
            if (lut) u = _mm512_shuffle_epi8(tbl, u);
            acc[r] = fma_i32(scales2(f, b, bytes, dx), _mm512_dpbusd_epi32(o, u, xv), acc[r]);
            if (with_min) acc[r] = _mm512_mask_add_ps(acc[r], 0x0011, acc[r], scales2(f, b + 2, bytes, sx)); /* lanes 0, 4: the two blocks */
        }
    }
    if (i < nb) { /* the odd last block: codes (and so products) of the upper half zero */
        /* the nibble formats' x: prepared as 64 bytes, the zeros included (prep_32) */
        const __m512i xv = _mm512_maskz_loadu_epi8(nibble_format(f) ? ~0ull : 0xffffffffull, q);
        const __m512i o = with_min ? _mm512_setzero_si512() : _mm512_load_si512((const void *)off);
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            __m512i u = f == MG_Q8_0 ? _mm512_xor_si512(_mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 2))), k80)
                                     : nibbles2(f, b, bytes, 0);
            if (lut) u = _mm512_shuffle_epi8(tbl, u);
            /* the lanes past the block: x's codes there are 0 (prep_32), so are their products */
            const float s0 = (f == MG_MXFP4 ? mg_ggml_e8m0_half(b[0]) : f16_at(b)) * dx[0];
            const __m512 f0 = nibble_format(f) ? _mm512_maskz_mov_ps(0x0f0f, _mm512_set1_ps(s0)) : pair(s0, 0.0f);
            acc[r] = fma_i32(f0, _mm512_dpbusd_epi32(o, u, xv), acc[r]);
            if (with_min) acc[r] = _mm512_mask_add_ps(acc[r], 0x0001, acc[r], _mm512_set1_ps(f16_at(b + 2) * sx[0]));
        }
    }
    if (R == 4) {
        _mm_storeu_ps(out, _mm_add_ps(_mm_loadu_ps(out), reduce4(acc[0], acc[1], acc[2], acc[3])));
    } else {
        for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
    }
}

/* IQ4_XS: sub-blocks j, j + 1 (16 nibble bytes each) per zmm through the value table. */
static float row_iq4_xs(const uint8_t *p, int64_t nb, const int8_t *q, const float *dx) {
    const __m512i tbl = lut64(MG_IQ4NL_VALUES);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, p += 136, q += 256, dx += 8) {
        uint16_t sh;
        uint32_t sl;
        memcpy(&sh, p + 2, 2);
        memcpy(&sl, p + 4, 4);
        float f[8];
        const float d = f16_at(p);
        for (int j = 0; j < 8; j++)
            f[j] = d * (float)((int)(((sl >> (4 * j)) & 15) | (((uint32_t)sh >> (2 * j)) & 3) << 4) - 32) * dx[j];
        for (int j = 0; j < 8; j += 2) {
            const __m512i w = _mm512_shuffle_epi8(tbl, join(nib32(p + 8 + 16 * j), nib32(p + 24 + 16 * j)));
            const __m512i prod = sdot(w, _mm512_loadu_si512((const void *)(q + 32 * j)));
            if (j & 2)
                acc1 = fma_i32(pair(f[j], f[j + 1]), prod, acc1);
            else
                acc0 = fma_i32(pair(f[j], f[j + 1]), prod, acc0);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

#define ROWS_FNS(NAME, CALL4, CALL1)                                                                     \
    static void rows4_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *vx, float *o) {     \
        const prep_x *x = vx;                                                                          \
        CALL4;                                                                                         \
    }                                                                                                  \
    static void rows1_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *vx, float *o) {     \
        const prep_x *x = vx;                                                                          \
        CALL1;                                                                                         \
    }
ROWS_FNS(q4_k, rows_k4(4, p, rb, nb, x, 0, o), rows_k4(1, p, rb, nb, x, 0, o))
ROWS_FNS(q5_k, rows_k4(4, p, rb, nb, x, 1, o), rows_k4(1, p, rb, nb, x, 1, o))
ROWS_FNS(q6_k, rows_q6_k(4, p, rb, nb, x, o), rows_q6_k(1, p, rb, nb, x, o))
ROWS_FNS(q8_0, rows_32(4, MG_Q8_0, p, rb, nb, x, o), rows_32(1, MG_Q8_0, p, rb, nb, x, o))
ROWS_FNS(q4_0, rows_32(4, MG_Q4_0, p, rb, nb, x, o), rows_32(1, MG_Q4_0, p, rb, nb, x, o))
ROWS_FNS(q5_0, rows_32(4, MG_Q5_0, p, rb, nb, x, o), rows_32(1, MG_Q5_0, p, rb, nb, x, o))
ROWS_FNS(iq4_nl, rows_32(4, MG_IQ4_NL, p, rb, nb, x, o), rows_32(1, MG_IQ4_NL, p, rb, nb, x, o))
ROWS_FNS(mxfp4, rows_32(4, MG_MXFP4, p, rb, nb, x, o), rows_32(1, MG_MXFP4, p, rb, nb, x, o))
ROWS_FNS(q4_1, rows_32(4, MG_Q4_1, p, rb, nb, x, o), rows_32(1, MG_Q4_1, p, rb, nb, x, o))
ROWS_FNS(q5_1, rows_32(4, MG_Q5_1, p, rb, nb, x, o), rows_32(1, MG_Q5_1, p, rb, nb, x, o))
ROWS_FNS(q2_k, rows_k23(4, p, rb, nb, x, 0, o), rows_k23(1, p, rb, nb, x, 0, o))
ROWS_FNS(q3_k, rows_k23(4, p, rb, nb, x, 1, o), rows_k23(1, p, rb, nb, x, 1, o))

/* The row loops of each format that has them here (the others: the IQ rows, IQ4_XS's own loop
 * or the scalar twin, see linear_q8_to). */
static const struct {
    mg_q8_rows_fn *four, *one;
} ROWS[MG_FORMAT_COUNT] = {
    [MG_Q4_K] = {rows4_q4_k, rows1_q4_k},     [MG_Q5_K] = {rows4_q5_k, rows1_q5_k},
    [MG_Q6_K] = {rows4_q6_k, rows1_q6_k},     [MG_Q8_0] = {rows4_q8_0, rows1_q8_0},
    [MG_Q4_0] = {rows4_q4_0, rows1_q4_0},     [MG_Q5_0] = {rows4_q5_0, rows1_q5_0},
    [MG_IQ4_NL] = {rows4_iq4_nl, rows1_iq4_nl}, [MG_MXFP4] = {rows4_mxfp4, rows1_mxfp4},
    [MG_Q4_1] = {rows4_q4_1, rows1_q4_1},     [MG_Q5_1] = {rows4_q5_1, rows1_q5_1},
    [MG_Q2_K] = {rows4_q2_k, rows1_q2_k},     [MG_Q3_K] = {rows4_q3_k, rows1_q3_k}};

/* x's codes q, scales dx and sums sx of kc columns, prepared for format f (mg_q8_prep_fn). */
static void prep(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t kc, void *vx) {
    prep_x *x = vx;
    if (f == MG_Q6_K)
        prep_q6(q, dx, kc, x);
    else if (f == MG_Q4_K || f == MG_Q5_K)
        prep_k4(q, dx, sx, kc, x);
    else if (f == MG_Q2_K || f == MG_Q3_K)
        prep_k23(q, dx, kc, f == MG_Q3_K, x);
    else
        prep_32(f, q, dx, sx, kc, x);
}

/* Per token and column pass, x prepared once; then the rows four at a time (the last 0-3 one
 * by one). */
static void linear_rows(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                        int64_t r1, int l2, mg_q8_rows_fn *four, mg_q8_rows_fn *one) {
    prep_x x;
    x.l2 = l2;
    mg_q8_drive_rows(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep, &x, four, 4, one);
}

/* The token count from which the GEMM (q8_gemm_avx512vnni.c), which decodes each row once for
 * all tokens, beats these rows, which decode it again per token, as measured (Zen 5, docs/
 * KERNELS.md): the grid formats' and IQ4_XS's rows are slow (decoding dominates them), the
 * K-quants' rows are the fastest (they beat the GEMM up to 3-4 tokens). */
static int64_t gemm_min_tok(mg_format f) {
    if (f >= MG_IQ2_XXS || f == MG_IQ4_XS) return 2;
    if (f == MG_Q2_K || f == MG_Q3_K || f == MG_Q4_K || f == MG_Q5_K || f == MG_Q6_K) return 5;
    return 3;
}

/* The entry, prefetching into L2 (l2) or L1 (mg_cpu_features.prefetch_l2). */
static void linear_q8_to(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                         int64_t r0, int64_t r1, int l2) {
    if (n_tok >= gemm_min_tok(w->format)) {
        mg_avx512vnni_gemm_q8(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    const mg_format f = w->format;
    if (f == MG_FP4_E2M1) { /* q8_fp4_avx512vnni.c */
        mg_avx512vnni_linear_q8_fp4(w, xq, n_tok, y, y_stride, r0, r1, l2);
        return;
    }
    if (ROWS[f].four) {
        linear_rows(w, xq, n_tok, y, y_stride, r0, r1, l2, ROWS[f].four, ROWS[f].one);
        return;
    }
    if (f != MG_IQ4_XS) { /* the grid formats' rows (q8_iq_avx512vnni.c), else the scalar twin (mg_format_has_q8_path) */
        if (mg_avx512vnni_q8_iq_takes(f))
            mg_avx512vnni_linear_q8_iq(w, xq, n_tok, y, y_stride, r0, r1, l2);
        else
            mg_scalar_linear_q8(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    /* IQ4_XS: one row at a time */
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t groups = w->cols / 32;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t t = 0; t < n_tok; t++)
            y[t * y_stride + r] = row_iq4_xs((const uint8_t *)w->data + (size_t)r * rb, w->cols / 256, xq->q + t * xq->cols,
                                             xq->d + t * groups);
}

MG_Q8_PREFETCH_ENTRIES(mg_avx512vnni_linear_q8, linear_q8_to)
#else
mg_linear_q8_fn mg_avx512vnni_linear_q8(int prefetch_l2) { return NULL; }
#endif
