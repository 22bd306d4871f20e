/* AVX2 kernels for the ggml block formats with int8 activations (core/q8_act.h; the arithmetic
 * and its scalar twin: kernels/scalar/q8_scalar.c).  Per group of 32 columns: vpmaddubsw (u8 x
 * s8 -> saturating i16 pairs) and vpmaddwd (-> 8 i32), the sum converted once and multiplied by
 * the group's factor wd * dx.  AVX2 has no vpdpbusd, and its i16 pairs saturate, which decides
 * how each format's codes enter (the bound of every pair is stated where it is formed).
 *
 * As in the VNNI loops (avx512/q8_avx512vnni.c): whatever every row needs of x is prepared once
 * per token and column pass (prep_x: x's codes permuted to the order the weight bytes come in,
 * |x|, offset sums), and rows go four per pass (Q6_K two; rows_*), sharing x's loads and the
 * work on the rows' block scales (gathered in general registers, converted and multiplied by
 * dx in one vector), with software prefetch of the group of rows ahead.  The sums stay exact
 * integers (|isum| < 2^24), so the results differ from the scalar twin's only in the order of
 * the fp32 additions (and FMA contraction).  Measurements: docs/KERNELS.md (AVX2 int8 rows).
 *
 * q8_rows_avxvnni.c builds this file a second time with AVX-VNNI (MG_Q8_ROWS_AVXVNNI, entries
 * named mg_avxvnni_*), for the avx2 table on CPUs that have it (Alder Lake and later desktops):
 * there dot4 is one vpdpbusd where AVX2 takes vpmaddubsw and vpmaddwd with ones.  Where no pair
 * saturates i16 (every use of dot4 states its bound) the two give the same i32 sums. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/scalar/scalar.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"
#include "kernels/unaligned.h"
#include "core/ggml_blocks.h"

/* Prefetch distance (at least this many bytes on, a whole number of row groups) and whether to
 * prefetch at all: compile-time knobs for measuring (docs/KERNELS.md has what was tried).  Where
 * to (L1 or L2) is the CPU's (mg_cpu_features.prefetch_l2, kernels/prefetch_rows.h). */
#ifndef MG_AVX2_Q8_MIN_AHEAD
#define MG_AVX2_Q8_MIN_AHEAD 8192
#endif
#ifndef MG_AVX2_Q8_PREFETCH
#define MG_AVX2_Q8_PREFETCH 1
#endif

/* The rows' entry: this file's, or the AVX-VNNI build's (q8_rows_avxvnni.c). */
#ifdef MG_Q8_ROWS_AVXVNNI
#define Q8_ROWS mg_avxvnni_linear_q8_rows
#define Q8_FP4_ROWS mg_avxvnni_linear_q8_fp4
#else
#define Q8_ROWS mg_avx2_linear_q8_rows
#define Q8_FP4_ROWS mg_avx2_linear_q8_fp4
#endif

INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE __m256i ones16(void) { return _mm256_set1_epi16(1); }
INLINE __m256 cvt_i32(__m256i v) { return _mm256_cvtepi32_ps(v); }
/* The i32 sums of each four u8 x s8 products (pairs within i16, see the file comment). */
INLINE __m256i dot4(__m256i u, __m256i s) {
#if defined(MG_Q8_ROWS_AVXVNNI) && defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16());
#endif
}
/* [a x 4 | b x 4] */
INLINE __m256 pair4(const float *a, const float *b) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(a)), _mm_broadcast_ss(b), 1);
}

/* The group of rows ahead (contiguous: rows are rb bytes apart), at least MIN_AHEAD bytes on;
 * each step of a row loop prefetches as many bytes of it as the step reads of its own group,
 * so the group ahead is in cache when its turn comes (the hardware prefetcher follows four
 * interleaved row streams badly, see docs/KERNELS.md). */
INLINE size_t rows_ahead(size_t group) {
    return group >= MG_AVX2_Q8_MIN_AHEAD ? group : (MG_AVX2_Q8_MIN_AHEAD + group - 1) / group * group;
}
INLINE void prefetch_step(const uint8_t *pf, size_t n, int l2) {
    if (MG_AVX2_Q8_PREFETCH) mg_prefetch_rows(pf, n, l2);
}

/* out[r] += the sum of acc[r], r < R.  Each row reduced alone, in the same order whatever R:
 * a row's accumulator sees the same sequence of FMAs in a group of four as alone, so its
 * result does not depend on where a row range starts (a shared hadd reduction of the four,
 * as the VNNI loops do, would save a few operations per group but not that). */
INLINE void store_sums(const int R, const __m256 *acc, float *out) {
    for (int r = 0; r < R; r++) out[r] += hsum8(acc[r]);
}

/* The f16 at p of R rows (rb bytes apart) as the 16-bit fields of one word, row r in field r. */
INLINE uint64_t gather16(const int R, const uint8_t *p, size_t rb) {
    uint64_t h = 0;
    for (int r = 0; r < R; r++) h |= mg_ld16(p + (size_t)r * rb) << (16 * r);
    return h;
}

/* ---- x prepared once per token and column pass ------------------------------------------ */

/* Widest column pass: the prepared x lives on the stack (wider rows add the passes' sums). */
enum { XP_MAX = 8192 };

typedef struct {
    const int8_t *q;                                      /* x's codes as the rows read them */
    const int8_t *qa;                                     /* |q| (IQ4_NL, IQ4_XS) */
    const float *dx, *sx;                                 /* x's scales and sums per 32 */
    int8_t perm[XP_MAX] __attribute__((aligned(32)));    /* the pair order (prep_pairs) */
    int8_t absq[XP_MAX] __attribute__((aligned(32)));    /* |perm| */
    int16_t off[XP_MAX / 4] __attribute__((aligned(32))); /* -k * sums of x (nibble formats; prep_off) */
    int16_t xs16[XP_MAX / 16] __attribute__((aligned(32))); /* sums of x per 16 columns (K16) */
    float dxp[XP_MAX / 32] __attribute__((aligned(32)));  /* IQ4_XS: dx per 256 in lane order */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

/* The pair order of the nibble formats: a 16-byte load of nibbles is one 32-column group
 * (element i the low nibble of byte i, 16 + i its high nibble), and two of them, groups g and
 * g + 1, fill a ymm [g | g + 1]; its low nibbles are then elements 0..15 of both groups and
 * its high nibbles 16..31.  So x goes per 64 columns as [g 0..15 | g+1 0..15] [g 16..31 |
 * g+1 16..31] (the middle 16 bytes swapped); an odd last group gets zeros for its partner. */
static void prep_pairs(const int8_t *q, int64_t cols, int8_t *xp) {
    int64_t c = 0;
    for (; c + 64 <= cols; c += 64) {
        memcpy(xp + c, q + c, 16);
        memcpy(xp + c + 16, q + c + 32, 16);
        memcpy(xp + c + 32, q + c + 16, 16);
        memcpy(xp + c + 48, q + c + 48, 16);
    }
    if (c < cols) {
        memset(xp + c, 0, 64);
        memcpy(xp + c, q + c, 16);
        memcpy(xp + c + 32, q + c + 16, 16);
    }
}

static void prep_abs(const int8_t *q, int64_t n, int8_t *qa) {
    for (int64_t c = 0; c < n; c += 32) _mm256_store_si256((__m256i *)(qa + c), _mm256_abs_epi8(load32(q + c)));
}

/* off = -k * (sums of x in the i16 pair lanes): per 64 columns of the pair order, lane l of
 * maddubs(lo, x[0..32)) + maddubs(hi, x[32..64)) has the pairs of columns 2l, 2l + 1 of both
 * halves, so its offset is -k times their four codes; pairs formats with unsigned codes u and
 * value u - k then sum exactly (u - k) x.  (Q6_K and Q3_K take their offsets per block from
 * xs16 instead, rows_q6_k.) */
static void prep_off(const int8_t *q, int64_t n, int k, int16_t *off) {
    const __m256i kv = _mm256_set1_epi8((char)k);
    for (int64_t c = 0; c < n; c += 64) {
        const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(kv, load32(q + c)), _mm256_maddubs_epi16(kv, load32(q + c + 32)));
        const __m256i o = _mm256_sub_epi16(_mm256_setzero_si256(), s);
#if defined(MG_Q8_ROWS_AVXVNNI) && defined(__AVXVNNI__) /* the i32 sums of the lanes' quads (nib_sum) */
        _mm256_store_si256((__m256i *)(off + c / 4), _mm256_madd_epi16(o, ones16()));
#else
        _mm256_store_si256((__m256i *)(off + c / 4), o);
#endif
    }
}

/* Sums of x per 16 columns (|sum| <= 16 * 127; Q2_K's mins, Q3_K's and Q6_K's offsets): one
 * pass per token, where the rows would each redo it per block. */
static void prep_sums16(const int8_t *q, int64_t n, int16_t *xs) {
    for (int64_t c = 0; c < n; c += 16) {
        int s = 0;
        for (int l = 0; l < 16; l++) s += q[c + l];
        xs[c / 16] = (int16_t)s;
    }
}

/* ---- Q8_0 ------------------------------------------------------------------------------- */

/* Factors of two blocks (p, p + bytes) of R rows, f16 scales at offset 0, as [rows of block 0
 * | rows of block 1] times [dx0 x 4 | dx1 x 4]: the twin's products wd * dx.  one: only the
 * first block exists (the upper lanes are 0). */
INLINE __m256 factors2_f16(const int R, const uint8_t *p, size_t rb, size_t bytes, const float *dx, int one) {
    const uint64_t lo = gather16(R, p, rb), hi = one ? 0 : gather16(R, p + bytes, rb);
    const __m256 s = _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
    const float zero = 0.0f;
    return _mm256_mul_ps(s, pair4(dx, one ? &zero : dx + 1));
}

/* Block k (0, 1) of the pair of Q8_0 blocks at p of R rows: acc[r] += f[4k + r] * (w . x).
 * Signed codes w in [-128, 127], x in [-127, 127]: |w| (unsigned, 128 is fine there) times x
 * with w's sign, pairs <= 2 * 128 * 127 < 2^15.  (|x| once per token and sign(w, x) per row
 * would save one op, but -w overflows for w = -128, which a Q8_0 block may hold; checking for
 * it cost what it saved.) */
INLINE void q8_0_block(const int R, const uint8_t *p, size_t rb, int k, const int8_t *q, const float *f, __m256 *acc) {
    const __m256i xv = load32(q + 32 * k);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const __m256i w = load32(p + (size_t)r * rb + 34 * k + 2);
        const __m256i pr = dot4(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(f + 4 * k + r), cvt_i32(pr), acc[r]);
    }
}

INLINE void rows_q8_0(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    const size_t ahead = rows_ahead((size_t)R * rb);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const int8_t *q = x->q;
    const float *dx = x->dx;
    const uint8_t *pf = p + ahead;
    float f[8] __attribute__((aligned(32)));
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 68, pf += R * 68, q += 64, dx += 2) {
        prefetch_step(pf, (size_t)R * 68, x->l2);
        _mm256_store_ps(f, factors2_f16(R, p, rb, 34, dx, 0));
        q8_0_block(R, p, rb, 0, q, f, acc);
        q8_0_block(R, p, rb, 1, q, f, acc);
    }
    if (i < nb) {
        _mm256_store_ps(f, factors2_f16(R, p, rb, 34, dx, 1));
        q8_0_block(R, p, rb, 0, q, f, acc);
    }
    store_sums(R, acc, out);
}

/* ---- the nibble formats: Q4_0, Q5_0, MXFP4, IQ4_NL, Q4_1, Q5_1 (blocks of 32, two per ymm) --
 * Blocks g, g + 1 of a row: one ymm of their nibbles [g | g + 1] (prep_pairs), low nibbles
 * against x's first halves, high nibbles against the second halves.  Codes enter as:
 *  - Q4_0: the nibble u (0..15), value u - 8; Q5_0: u with its fifth bit (0..31), value u - 16;
 *    MXFP4: u = 2 * e2m1 + 12 (0..24) by a vpshufb table, value u - 12; the -k goes into the
 *    i16 sums as prep_off's offsets: lo + hi pairs + off, |lane| <= 4 * 31 * 127 + 16 * 508
 *    < 2^15 (no sign trick, one vpmaddwd for both halves);
 *  - Q4_1, Q5_1: as Q4_0, Q5_0 without the offset (the value is u); their min m * sx is a float
 *    term per block, summed for all rows in one vector (nib_pair's macc);
 *  - IQ4_NL (values -127..113, whose pairs with an offset of 127 would saturate): |x| (once per
 *    token) times the value with x's sign (never -128), pairs <= 2 * 127 * 127 < 2^15, too big
 *    to add the halves in i16: one vpmaddwd each.
 * The i32 lanes are [block g x 4 | block g + 1 x 4], so each row's factors come from the four
 * rows' [rows of g | rows of g + 1] by one in-lane vpermilps. */

/* The ymm of nibbles [block at p | block at p + bytes] (one: the upper half zero). */
INLINE __m256i nibbles2(const uint8_t *p, size_t bytes, size_t off, int one) {
    const __m128i a = _mm_loadu_si128((const __m128i *)(p + off));
    const __m128i b = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)(p + bytes + off));
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
}

/* Q5_0 / Q5_1: 0x10 in the bytes of [low | high] nibble ymms whose fifth bit is set (qh, 32
 * bits at offset qo of each block: bit i for element i). */
INLINE void q5_0_bits(const uint8_t *p, size_t bytes, size_t qo, int one, __m256i *lo, __m256i *hi) {
    const uint64_t qh = mg_ld32(p + qo) | (one ? 0 : mg_ld32(p + bytes + qo) << 32);
    const __m256i v = _mm256_set1_epi64x((long long)qh); /* [qh0 qh1 qh0 qh1 | ...] */
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull), k10 = _mm256_set1_epi8(0x10);
    /* low nibbles: bytes 0, 1 of block g's qh (lane 0), of g + 1's (lane 1); high: bytes 2, 3 */
    const __m256i s_lo = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5,
                                          5, 5, 5, 5, 5);
    const __m256i s_hi = _mm256_add_epi8(s_lo, _mm256_set1_epi8(2));
    const __m256i bl = _mm256_and_si256(_mm256_shuffle_epi8(v, s_lo), bit);
    const __m256i bh = _mm256_and_si256(_mm256_shuffle_epi8(v, s_hi), bit);
    *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_cmpeq_epi8(bl, bit), k10));
    *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_cmpeq_epi8(bh, bit), k10));
}

/* 2^(e-128) (mg_ggml_e8m0_half) of 8 e8m0 bytes in i32 lanes: (e - 1) << 23 for e >= 2, the
 * denormals 2^-128, 2^-127 (0x00200000 << e) for e = 0, 1. */
INLINE __m256 e8m0_half8(__m256i e) {
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(denormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
}

/* Factors of blocks p, p + bytes of R rows for the nibble formats, [rows of p | rows of
 * p + bytes] (one: the second block absent, its lanes 0). */
INLINE __m256 factors2_nib(const int R, mg_format f, const uint8_t *p, size_t rb, size_t bytes, const float *dx, int one) {
    if (f != MG_MXFP4) return factors2_f16(R, p, rb, bytes, dx, one);
    /* absent rows and blocks: byte 127 (2^-1), not 0, whose denormal scale would make every
     * multiply with it a microcode assist (R < 4 ran at half the speed) */
    uint64_t e = 0x7f7f7f7f7f7f7f7full;
    for (int r = 0; r < R; r++) {
        e = (e & ~((uint64_t)0xff << (8 * r))) | (uint64_t)p[(size_t)r * rb] << (8 * r);
        if (!one) e = (e & ~((uint64_t)0xff << (8 * r + 32))) | (uint64_t)p[(size_t)r * rb + bytes] << (8 * r + 32);
    }
    const float zero = 0.0f;
    const __m256 s = e8m0_half8(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e)));
    return _mm256_mul_ps(s, pair4(dx, one ? &zero : dx + 1)); /* an absent block: 2^-1 * 0 */
}

/* The sum of lo . x0 + hi . x1 per i32 lane, plus the offsets off (prep_off; NULL: none): the
 * i16 pairs of both added with the offsets (the bound above) and one vpmaddwd, or in the
 * AVX-VNNI build two vpdpbusd from the offsets' i32 sums (the same sums). */
INLINE __m256i nib_sum(__m256i lo, __m256i hi, __m256i x0, __m256i x1, const int16_t *off) {
#if defined(MG_Q8_ROWS_AVXVNNI) && defined(__AVXVNNI__)
    const __m256i o = off ? _mm256_load_si256((const __m256i *)off) : _mm256_setzero_si256();
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(o, lo, x0), hi, x1);
#else
    __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1));
    if (off) pairs = _mm256_add_epi16(pairs, _mm256_load_si256((const __m256i *)off));
    return _mm256_madd_epi16(pairs, ones16());
#endif
}

/* Blocks p, p + bytes (one: only p) of R rows: acc[r] += their dot products with x; Q4_1 /
 * Q5_1: macc += their min terms m * sx, lanes as the factors' (rows of p | rows of p + bytes),
 * one add for all R rows (the twin's products, m * sx). */
INLINE void nib_pair(const int R, mg_format f, const uint8_t *p, size_t rb, size_t bytes, size_t qs, int one,
                     const int8_t *q, const int8_t *qa, const int16_t *off, const float *dx, const float *sx,
                     __m256i tbl, __m256 *acc, __m256 *macc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const int with_min = f == MG_Q4_1 || f == MG_Q5_1;
    const __m256 fr = factors2_nib(R, f, p, rb, bytes, dx, one);
    if (with_min) *macc = _mm256_add_ps(*macc, factors2_f16(R, p + 2, rb, bytes, sx, one));
    const __m256i x0 = load32(q), x1 = load32(q + 32);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const uint8_t *b = p + (size_t)r * rb;
        const __m256i v = nibbles2(b, bytes, qs, one);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        __m256i sum;
        if (f == MG_IQ4_NL) {
            const __m256i plo = dot4(load32(qa), _mm256_sign_epi8(_mm256_shuffle_epi8(tbl, lo), x0));
            const __m256i phi = dot4(load32(qa + 32), _mm256_sign_epi8(_mm256_shuffle_epi8(tbl, hi), x1));
            sum = _mm256_add_epi32(plo, phi);
        } else {
            if (f == MG_MXFP4) lo = _mm256_shuffle_epi8(tbl, lo), hi = _mm256_shuffle_epi8(tbl, hi);
            if (f == MG_Q5_0 || f == MG_Q5_1) q5_0_bits(b, bytes, f == MG_Q5_0 ? 2 : 4, one, &lo, &hi);
            sum = nib_sum(lo, hi, x0, x1, with_min ? NULL : off);
        }
        acc[r] = _mm256_fmadd_ps(_mm256_permutevar_ps(fr, _mm256_set1_epi32(r)), cvt_i32(sum), acc[r]);
    }
}

INLINE void rows_nib(const int R, mg_format f, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    int64_t e, bytes_i;
    mg_format_block(f, &e, &bytes_i);
    const size_t bytes = (size_t)bytes_i;
    const size_t qs = f == MG_Q5_0 ? 6 : f == MG_MXFP4 ? 1 : f == MG_Q4_1 ? 4 : f == MG_Q5_1 ? 8 : 2;
    const size_t ahead = rows_ahead((size_t)R * rb);
    static const int8_t MXFP4_U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0}; /* values2 + 12 */
    const __m256i tbl = _mm256_broadcastsi128_si256(
        _mm_loadu_si128((const __m128i *)(f == MG_MXFP4 ? MXFP4_U : MG_IQ4NL_VALUES)));
    __m256 acc[4], macc = _mm256_setzero_ps();
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const int8_t *q = x->q, *qa = x->qa;
    const int16_t *off = x->off;
    const float *dx = x->dx, *sx = x->sx;
    const uint8_t *pf = p + ahead;
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 2 * bytes, pf += R * 2 * bytes, q += 64, qa += 64, off += 16, dx += 2, sx += 2) {
        prefetch_step(pf, (size_t)R * 2 * bytes, x->l2);
        nib_pair(R, f, p, rb, bytes, qs, 0, q, qa, off, dx, sx, tbl, acc, &macc);
    }
    if (i < nb) nib_pair(R, f, p, rb, bytes, qs, 1, q, qa, off, dx, sx, tbl, acc, &macc);
    store_sums(R, acc, out);
    if (f == MG_Q4_1 || f == MG_Q5_1) { /* row r's min terms: lanes r and 4 + r */
        float m[8];
        _mm256_storeu_ps(m, macc);
        for (int r = 0; r < R; r++) out[r] += m[r] + m[4 + r];
    }
}

/* ---- Q4_K / Q5_K ------------------------------------------------------------------------ */

/* The 8 scales and 8 mins of a Q4_K / Q5_K block (12 bytes at s) as 16 bytes sc0..7 m0..7: the
 * 32-bit words a, b, c give sc0-3 = a & 63, sc4-7 = (c & 15) | (a >> 6) << 4, m0-3 = b & 63,
 * m4-7 = (c >> 4) | (b >> 6) << 4 (ggml_blocks.h), one dword lane each. */
INLINE __m128i k4_scales_mins(const uint8_t *s) {
    const __m128i v = _mm_loadu_si128((const __m128i *)s);      /* a b c + 4 bytes of the block */
    const __m128i t = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)); /* a c b c */
    const __m128i u = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)); /* a a b b */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(t, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    return _mm_or_si128(lo, _mm_and_si128(_mm_srli_epi32(u, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030)));
}

/* Q5_K: bit j of each qh byte moved to bit 4 (16-bit shifts: the bits a shift carries in from
 * the neighbouring byte land below bit 4 for left shifts <= 4, above it for right shifts <= 3). */
INLINE __m256i q5_k_bit(__m256i qh, int j) {
    const __m256i s = j < 4 ? _mm256_slli_epi16(qh, 4 - j) : j > 4 ? _mm256_srli_epi16(qh, j - 4) : qh;
    return _mm256_and_si256(s, _mm256_set1_epi8(0x10));
}

/* R rows of Q4_K (q5 = 0) or Q5_K.  Chunk c (32 code bytes) holds sub-block 2c in its low
 * nibbles and 2c + 1 in its high nibbles, each against its 32 columns of x in order; codes
 * unsigned (0..31), pairs <= 2 * 31 * 127.  Per row and block, the factors d * sc_j * dx_j
 * (one vector, stored for broadcasts) and the min terms dmin * m_j * sx_j (one FMA); the R
 * rows' d and dmin are converted together.  The rows are the innermost loop, so that R
 * accumulator chains interleave (one row's FMA chain alone, 9 per block, was the bound). */
INLINE void rows_k4(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, int q5, float *out) {
    const size_t bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    const size_t ahead = rows_ahead((size_t)R * rb);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        prefetch_step(pf, (size_t)R * bytes, x->l2);
        const int8_t *xq = x->q + 256 * i;
        const __m256 dxv = _mm256_loadu_ps(x->dx + 8 * i), sxv = _mm256_loadu_ps(x->sx + 8 * i);
        /* d, dmin of the R rows: [d0 dmin0 d1 dmin1 ...] */
        uint64_t w01 = mg_ld32(p), w23 = 0;
        if (R > 1) w01 |= mg_ld32(p + rb) << 32;
        if (R > 2) w23 = mg_ld32(p + 2 * rb);
        if (R > 3) w23 |= mg_ld32(p + 3 * rb) << 32;
        float dm[8] __attribute__((aligned(32)));
        _mm256_store_ps(dm, _mm256_cvtph_ps(_mm_set_epi64x((long long)w23, (long long)w01)));
        float f[4][8] __attribute__((aligned(32)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m128i sm = k4_scales_mins(p + (size_t)r * rb + 4);
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm));
            const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)));
            _mm256_store_ps(f[r], _mm256_mul_ps(_mm256_mul_ps(sc, _mm256_broadcast_ss(dm + 2 * r)), dxv));
            acc[r] = _mm256_fnmadd_ps(_mm256_mul_ps(mn, _mm256_broadcast_ss(dm + 2 * r + 1)), sxv, acc[r]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const __m256i x0 = load32(xq + 64 * c), x1 = load32(xq + 64 * c + 32);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + (size_t)r * rb;
                const __m256i v = load32(b + qs + 32 * c);
                __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (q5) {
                    const __m256i qh = load32(b + 16);
                    lo = _mm256_or_si256(lo, q5_k_bit(qh, 2 * c)), hi = _mm256_or_si256(hi, q5_k_bit(qh, 2 * c + 1));
                }
                const __m256i slo = dot4(lo, x0), shi = dot4(hi, x1);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(f[r] + 2 * c), cvt_i32(slo), acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(f[r] + 2 * c + 1), cvt_i32(shi), acc[r]);
            }
        }
    }
    store_sums(R, acc, out);
}

/* ---- Q6_K ------------------------------------------------------------------------------- */

/* vpshufb indices that spread the i16 scales 2g, 2g + 1 of 8 (bytes 4g..4g+3) over the low and
 * high 128-bit lanes of group g's pair sums (Q6_K, Q2_K, Q3_K). */
static const int8_t K16_PICK[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
     14, 15}};

/* One 32-column group of the per-16-scaled formats (Q6_K, Q2_K, Q3_K): the i16 pair sums times
 * the group's two integer scales k16 (one vpmaddwd, exact), then times the float factor f into
 * one of two accumulators by group parity (two dependency chains). */
INLINE void add_group(__m256i pairs, __m256i k16, const float *f, int g, __m256 *acc, __m256 *acc2) {
    const __m256 v = cvt_i32(_mm256_madd_epi16(pairs, k16));
    if (g & 1)
        *acc2 = _mm256_fmadd_ps(_mm256_broadcast_ss(f), v, *acc2);
    else
        *acc = _mm256_fmadd_ps(_mm256_broadcast_ss(f), v, *acc);
}

/* The factors of a row's 8 groups, stored for add_group's broadcasts.  The empty asm keeps them
 * in memory: without it GCC broadcasts from the register, two shuffles each on the port that
 * also runs vpshufb, where a broadcast from memory is a load. */
INLINE void store_factors(float *f, __m256 v) {
    _mm256_store_ps(f, v);
    __asm__("" : : "m"(*(float(*)[8])f));
}

/* The unsigned codes (0..63) of groups k and k + 2 (k = 0, 1) of a Q6_K half: the low 4 bits
 * are the low and high nibbles of the half's ql bytes L = ql + 32k, the top 2 of its qh bytes H
 * at bits 2g, moved to bits 4-5 by one 16-bit shift (left 4 for group 0, left 2 for 1, none for
 * 2, right 2 for 3; what a shift carries in from the neighbouring byte is masked off). */
INLINE void q6_codes2(const uint8_t *L, const uint8_t *qh, int k, __m256i *u0, __m256i *u2) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i l = load32(L), h = load32(qh);
    const __m256i h0 = k == 0 ? _mm256_slli_epi16(h, 4) : _mm256_slli_epi16(h, 2);
    const __m256i h2 = k == 0 ? h : _mm256_srli_epi16(h, 2);
    *u0 = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_and_si256(h0, m30));
    *u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), m4), _mm256_and_si256(h2, m30));
}

/* R rows of Q6_K.  The unsigned codes u (0..63) against x by vpmaddubsw (|pair| <= 2 * 63 *
 * 127 < 2^15, no sign trick); group g of half h has the int8 scales 8h + 2g (its first 16
 * elements, the low 128-bit lane of the pairs) and 8h + 2g + 1 (the high lane), which vpmaddwd
 * applies in place of the ones.  The value is u - 32: the -32 goes in once per row and block,
 * as one vpmaddwd of the block's 16 scales with x's sums per 16 (prep: xs16), whose i32 lane k
 * is group k's sa * sum_a + sb * sum_b, times -32 * d * dx_k in one FMA (the twin's isum,
 * split into its u and offset parts).  Unlike the other formats, a row's whole block at a time
 * (two accumulators per row, whose chains are short enough) and two rows per pass: measured
 * faster than four rows innermost, whose extra setup per row cost more than the shared loads of
 * x saved (docs/KERNELS.md).  The factors d * dx are stored and broadcast from memory: a
 * broadcast from a register takes two shuffles on the port that also runs vpshufb. */
INLINE void rows_q6_k(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    const int8_t(*pick)[32] = K16_PICK;
    const size_t ahead = rows_ahead((size_t)R * rb);
    __m256 acc[4], acc2[4];
    for (int r = 0; r < R; r++) acc[r] = acc2[r] = _mm256_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += 210, pf += R * 210) {
        prefetch_step(pf, (size_t)R * 210, x->l2);
        const int8_t *xq = x->q + 256 * i;
        const __m256 dxv = _mm256_loadu_ps(x->dx + 8 * i);
        const __m256i xs = _mm256_load_si256((const __m256i *)(x->xs16 + 16 * i));
        float d[4] __attribute__((aligned(16)));
        _mm_store_ps(d, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)gather16(R, p + 208, rb))));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + (size_t)r * rb;
            float f[8] __attribute__((aligned(32)));
            const __m256 fv = _mm256_mul_ps(_mm256_broadcast_ss(d + r), dxv);
            store_factors(f, fv);
            const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
            acc2[r] = _mm256_fnmadd_ps(_mm256_mul_ps(fv, _mm256_set1_ps(32.0f)), cvt_i32(_mm256_madd_epi16(s16, xs)), acc2[r]);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                /* the half's 8 scales as i16, in both 128-bit lanes */
                const __m256i sh = h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00);
                __m256i u[4];
                q6_codes2(b + 64 * h, b + 128 + 32 * h, 0, &u[0], &u[2]);
                q6_codes2(b + 64 * h + 32, b + 128 + 32 * h, 1, &u[1], &u[3]);
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    const __m256i pairs = _mm256_maddubs_epi16(u[g], load32(xq + 128 * h + 32 * g));
                    add_group(pairs, _mm256_shuffle_epi8(sh, load32(pick[g])), f + 4 * h + g, g, &acc[r], &acc2[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) acc[r] = _mm256_add_ps(acc[r], acc2[r]);
    store_sums(R, acc, out);
}

/* ---- Q2_K / Q3_K ------------------------------------------------------------------------ */

/* Q3_K's 16 scales minus 32 (12 bytes at s, mg_ggml_q3_k_scale) as i16: the low nibbles are
 * bytes 0-7 then their high nibbles; the top 2 bits of scale 4j + b are bits 2j.. of byte
 * 8 + b, so dword lane j of the 4 bytes shifted right by 2j holds them in byte b.  Reads the
 * 12 bytes only (the block may end the matrix). */
INLINE __m256i q3_k_scales16(const uint8_t *s) {
    const __m128i a = _mm_loadl_epi64((const __m128i *)s);
    const __m128i lo = _mm_and_si128(_mm_unpacklo_epi64(a, _mm_srli_epi16(a, 4)), _mm_set1_epi8(15));
    const __m128i c = _mm_set1_epi32((int)mg_ld32(s + 8));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(c, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm256_cvtepi8_epi16(_mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32)));
}

/* Q3_K: 4 where bit g of hmask byte l is set, for each l of the ymm hm (16-bit shifts: what one
 * carries in from the neighbouring byte lands below bit 2 for left shifts <= 2, above it for
 * right shifts <= 5). */
INLINE __m256i q3_k_high(__m256i hm, int g) {
    const __m256i s = g < 2 ? _mm256_slli_epi16(hm, 2 - g) : g > 2 ? _mm256_srli_epi16(hm, g - 2) : hm;
    return _mm256_and_si256(s, _mm256_set1_epi8(4));
}

/* R rows of Q2_K (q3 = 0) or Q3_K.  Group g = 4h + s of a block: bits 2s.. of the 32 code bytes
 * of half h (one load per half), against x's columns in order; Q3_K adds 4 where its hmask bit
 * is set, so u = q + 4 (0..7), value u - 4.  Pairs <= 2 * 7 * 127 < 2^15; the two 16-element
 * halves of a group are the pairs' 128-bit lanes, and vpmaddwd applies their integer scales k
 * in place of the ones (Q6_K's pick); the factor d * dx per group.  Once per row and block, one
 * vpmaddwd of the 16 scales-or-mins with x's sums per 16 (prep: xs16) gives each group's
 * Q2_K min term (times dmin * dx) or Q3_K offset (times -4 * d * dx), as Q6_K's.  A row's whole
 * block at a time, two accumulators per row, as Q6_K. */
INLINE void rows_k23(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, int q3, float *out) {
    const int8_t(*pick)[32] = K16_PICK;
    const size_t bytes = q3 ? 110 : 84, qs = q3 ? 32 : 16, dof = q3 ? 108 : 80;
    const size_t ahead = rows_ahead((size_t)R * rb);
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(15);
    __m256 acc[4], acc2[4];
    for (int r = 0; r < R; r++) acc[r] = acc2[r] = _mm256_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        prefetch_step(pf, (size_t)R * bytes, x->l2);
        const int8_t *xq = x->q + 256 * i;
        const __m256 dxv = _mm256_loadu_ps(x->dx + 8 * i);
        const __m256i xs = _mm256_load_si256((const __m256i *)(x->xs16 + 16 * i)); /* shared by the R rows */
        float d[4] __attribute__((aligned(16))), dm[4] __attribute__((aligned(16)));
        _mm_store_ps(d, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)gather16(R, p + dof, rb))));
        if (!q3) _mm_store_ps(dm, _mm_cvtph_ps(_mm_cvtsi64_si128((long long)gather16(R, p + 82, rb))));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + (size_t)r * rb;
            float f[8] __attribute__((aligned(32)));
            const __m256 fv = _mm256_mul_ps(_mm256_broadcast_ss(d + r), dxv);
            store_factors(f, fv);
            __m256i k16, hm = _mm256_setzero_si256();
            if (q3) {
                k16 = q3_k_scales16(b + 96), hm = load32(b);
                const __m256i ioff = _mm256_madd_epi16(k16, xs);
                acc2[r] = _mm256_fnmadd_ps(_mm256_mul_ps(fv, _mm256_set1_ps(4.0f)), cvt_i32(ioff), acc2[r]);
            } else {
                const __m128i sc = _mm_loadu_si128((const __m128i *)b);
                const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
                const __m256i imin = _mm256_madd_epi16(mins, xs);
                acc2[r] = _mm256_fnmadd_ps(_mm256_mul_ps(_mm256_broadcast_ss(dm + r), dxv), cvt_i32(imin), acc2[r]);
                k16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm256_castsi256_si128(m4)));
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const __m256i v = load32(b + qs + 32 * h);
                const __m256i s16 = _mm256_permute2x128_si256(k16, k16, h ? 0x11 : 0x00); /* the half's 8 k, both lanes */
#pragma GCC unroll 4
                for (int s = 0; s < 4; s++) {
                    const int g = 4 * h + s;
                    __m256i u = _mm256_and_si256(s ? _mm256_srli_epi16(v, 2 * s) : v, m3);
                    if (q3) u = _mm256_or_si256(u, q3_k_high(hm, g));
                    const __m256i pairs = _mm256_maddubs_epi16(u, load32(xq + 32 * g));
                    add_group(pairs, _mm256_shuffle_epi8(s16, load32(pick[s])), f + g, g, &acc[r], &acc2[r]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) acc[r] = _mm256_add_ps(acc[r], acc2[r]);
    store_sums(R, acc, out);
}

/* ---- IQ4_XS ----------------------------------------------------------------------------- */

/* R rows of IQ4_XS: sub-blocks 2m, 2m + 1 (16 nibble bytes each, contiguous) are one 32-byte
 * load, in the pair order of the nibble formats (x prepared so), through the IQ4_NL value
 * table with x's sign against |x| (IQ4_NL's bound).  The 8 scales d * (s_j - 32) of a row's
 * block are one vector in lane order [0 2 4 6 | 1 3 5 7] (the shift counts pick that order),
 * times x's dx in the same order (prep: dxp), so that pair m's factors [f_2m x 4 | f_2m+1 x 4]
 * are one in-lane vpermilps of it.  Rows innermost, as in rows_k4. */
INLINE void rows_iq4_xs(const int R, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    const size_t ahead = rows_ahead((size_t)R * rb);
    const __m256i m4 = _mm256_set1_epi8(0x0f), tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)MG_IQ4NL_VALUES));
    const __m256i cnt_l = _mm256_setr_epi32(0, 8, 16, 24, 4, 12, 20, 28), cnt_h = _mm256_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14);
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += 136, pf += R * 136) {
        prefetch_step(pf, (size_t)R * 136, x->l2);
        const int8_t *xq = x->q + 256 * i, *xa = x->qa + 256 * i;
        const __m256 dxv = _mm256_load_ps(x->dxp + 8 * i);
        const __m256 d = _mm256_cvtph_ps(_mm_cvtsi64_si128((long long)gather16(R, p, rb)));
        float f[4][8] __attribute__((aligned(32)));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + (size_t)r * rb;
            /* s_j = nibble j of scales_l (4 bytes at 4) | bits 2j, 2j + 1 of scales_h (at 2) << 4 */
            int32_t sl, sh;
            memcpy(&sl, b + 4, 4);
            memcpy(&sh, b + 2, 4); /* scales_h and 2 bytes of scales_l: only bits 0-15 are used */
            const __m256i s = _mm256_or_si256(
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sl), cnt_l), _mm256_set1_epi32(15)),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sh), cnt_h), _mm256_set1_epi32(3)), 4));
            const __m256 wd = _mm256_mul_ps(cvt_i32(_mm256_sub_epi32(s, _mm256_set1_epi32(32))),
                                            _mm256_permutevar8x32_ps(d, _mm256_set1_epi32(r)));
            _mm256_store_ps(f[r], _mm256_mul_ps(wd, dxv));
        }
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const __m256i x0 = load32(xq + 64 * m), x1 = load32(xq + 64 * m + 32);
            const __m256i a0 = load32(xa + 64 * m), a1 = load32(xa + 64 * m + 32);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m256i v = load32(p + (size_t)r * rb + 8 + 32 * m);
                const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, m4));
                const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                const __m256i sum = _mm256_add_epi32(dot4(a0, _mm256_sign_epi8(lo, x0)), dot4(a1, _mm256_sign_epi8(hi, x1)));
                const __m256 fac = _mm256_permutevar_ps(_mm256_load_ps(f[r]), _mm256_set1_epi32(m));
                acc[r] = _mm256_fmadd_ps(fac, cvt_i32(sum), acc[r]);
            }
        }
    }
    store_sums(R, acc, out);
}

/* ---- dispatch --------------------------------------------------------------------------- */

/* Rows per pass of each format (measured, docs/KERNELS.md: AVX2 int8 rows); MG_AVX2_Q8_GROUP
 * (1 to 4) overrides them all, for measuring. */
#ifdef MG_AVX2_Q8_GROUP
#define GROUP(n) MG_AVX2_Q8_GROUP
#else
#define GROUP(n) n
#endif
#define ROWS_FNS(NAME, G, CALLG, CALL1)                                                                \
    enum { G_##NAME = GROUP(G) };                                                                       \
    static void rowsg_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *vx, float *o) {    \
        const int R = G_##NAME;                                                                        \
        const prep_x *x = vx;                                                                          \
        CALLG;                                                                                         \
    }                                                                                                  \
    static void rows1_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *vx, float *o) {    \
        const prep_x *x = vx;                                                                          \
        CALL1;                                                                                         \
    }
ROWS_FNS(q8_0, 4, rows_q8_0(R, p, rb, nb, x, o), rows_q8_0(1, p, rb, nb, x, o))
ROWS_FNS(q4_0, 4, rows_nib(R, MG_Q4_0, p, rb, nb, x, o), rows_nib(1, MG_Q4_0, p, rb, nb, x, o))
ROWS_FNS(q5_0, 4, rows_nib(R, MG_Q5_0, p, rb, nb, x, o), rows_nib(1, MG_Q5_0, p, rb, nb, x, o))
ROWS_FNS(mxfp4, 4, rows_nib(R, MG_MXFP4, p, rb, nb, x, o), rows_nib(1, MG_MXFP4, p, rb, nb, x, o))
ROWS_FNS(iq4_nl, 4, rows_nib(R, MG_IQ4_NL, p, rb, nb, x, o), rows_nib(1, MG_IQ4_NL, p, rb, nb, x, o))
ROWS_FNS(q4_k, 4, rows_k4(R, p, rb, nb, x, 0, o), rows_k4(1, p, rb, nb, x, 0, o))
ROWS_FNS(q5_k, 4, rows_k4(R, p, rb, nb, x, 1, o), rows_k4(1, p, rb, nb, x, 1, o))
ROWS_FNS(q6_k, 2, rows_q6_k(R, p, rb, nb, x, o), rows_q6_k(1, p, rb, nb, x, o))
ROWS_FNS(iq4_xs, 4, rows_iq4_xs(R, p, rb, nb, x, o), rows_iq4_xs(1, p, rb, nb, x, o))
ROWS_FNS(q4_1, 4, rows_nib(R, MG_Q4_1, p, rb, nb, x, o), rows_nib(1, MG_Q4_1, p, rb, nb, x, o))
ROWS_FNS(q5_1, 4, rows_nib(R, MG_Q5_1, p, rb, nb, x, o), rows_nib(1, MG_Q5_1, p, rb, nb, x, o))
ROWS_FNS(q2_k, 2, rows_k23(R, p, rb, nb, x, 0, o), rows_k23(1, p, rb, nb, x, 0, o))
ROWS_FNS(q3_k, 2, rows_k23(R, p, rb, nb, x, 1, o), rows_k23(1, p, rb, nb, x, 1, o))

/* x's codes q, scales dx and sums sx of kc columns, prepared for format f into *x (mg_q8_prep_fn). */
static void prep(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t kc, void *vx) {
    prep_x *x = vx;
    x->q = q, x->qa = q, x->dx = dx, x->sx = sx;
    switch (f) {
    case MG_Q4_0:
    case MG_Q5_0:
    case MG_MXFP4:
        prep_pairs(q, kc, x->perm);
        prep_off(x->perm, (kc + 63) / 64 * 64, f == MG_Q4_0 ? 8 : f == MG_Q5_0 ? 16 : 12, x->off);
        x->q = x->perm;
        break;
    case MG_IQ4_NL:
    case MG_IQ4_XS:
        prep_pairs(q, kc, x->perm);
        prep_abs(x->perm, (kc + 63) / 64 * 64, x->absq);
        x->q = x->perm, x->qa = x->absq;
        if (f == MG_IQ4_XS)
            for (int64_t b = 0; b < kc / 256; b++)
                for (int j = 0; j < 8; j++) x->dxp[8 * b + (j & 1) * 4 + j / 2] = dx[8 * b + j];
        break;
    case MG_Q4_1:
    case MG_Q5_1:
        prep_pairs(q, kc, x->perm);
        x->q = x->perm;
        break;
    case MG_Q2_K:
    case MG_Q3_K:
    case MG_Q6_K: prep_sums16(q, kc, x->xs16); break;
    default: break; /* Q8_0, Q4_K, Q5_K: x in order */
    }
}

static const struct {
    mg_q8_rows_fn *group, *one;
    int n; /* rows per group */
} ROWS[MG_FORMAT_COUNT] = {
    [MG_Q8_0] = {rowsg_q8_0, rows1_q8_0, G_q8_0},       [MG_Q4_0] = {rowsg_q4_0, rows1_q4_0, G_q4_0},
    [MG_Q5_0] = {rowsg_q5_0, rows1_q5_0, G_q5_0},       [MG_MXFP4] = {rowsg_mxfp4, rows1_mxfp4, G_mxfp4},
    [MG_IQ4_NL] = {rowsg_iq4_nl, rows1_iq4_nl, G_iq4_nl}, [MG_Q4_K] = {rowsg_q4_k, rows1_q4_k, G_q4_k},
    [MG_Q5_K] = {rowsg_q5_k, rows1_q5_k, G_q5_k},       [MG_Q6_K] = {rowsg_q6_k, rows1_q6_k, G_q6_k},
    [MG_IQ4_XS] = {rowsg_iq4_xs, rows1_iq4_xs, G_iq4_xs}, [MG_Q4_1] = {rowsg_q4_1, rows1_q4_1, G_q4_1},
    [MG_Q5_1] = {rowsg_q5_1, rows1_q5_1, G_q5_1},       [MG_Q2_K] = {rowsg_q2_k, rows1_q2_k, G_q2_k},
    [MG_Q3_K] = {rowsg_q3_k, rows1_q3_k, G_q3_k}};

/* Per token and column pass, x prepared once; then the rows in groups of ROWS[f].n, the rest
 * one by one (each row's result is the same either way, see store_sums). */
void Q8_ROWS(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1,
             int prefetch_l2) {
    const mg_format f = w->format;
    if (f == MG_FP4_E2M1) { /* native FP4, its scales apart (q8_fp4_avx2.c) */
        Q8_FP4_ROWS(w, xq, n_tok, y, y_stride, r0, r1, prefetch_l2);
        return;
    }
    if (!ROWS[f].group) { /* the grid formats' rows (q8_iq_avx2.c), else the scalar twin (mg_format_has_q8_path) */
        if (mg_avx2_q8_iq_takes(f))
            mg_avx2_linear_q8_iq(w, xq, n_tok, y, y_stride, r0, r1, prefetch_l2);
        else
            mg_scalar_linear_q8(w, xq, n_tok, y, y_stride, r0, r1);
        return;
    }
    prep_x x;
    x.l2 = prefetch_l2;
    mg_q8_drive_rows(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep, &x, ROWS[f].group, ROWS[f].n, ROWS[f].one);
}
#endif
