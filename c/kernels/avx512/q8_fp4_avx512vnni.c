/* AVX-512 VNNI rows of native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32 columns: DeepSeek-V4's
 * experts; the contract: kernels/q8_fp4.h) under int8 activations, which q8_avx512vnni.c's entry
 * hands FP4 to below the GEMM's token count.  MXFP4's loop there (rows_32) on another layout:
 *  - x is prepared once per token and column pass in a quad layout (per 128 columns, groups g ..
 *    g + 3: the 16 even columns of each group, then the 16 odd ones of each), so that a row's 64
 *    bytes of those four groups, as low nibbles, are exactly the first 64 bytes and, as high
 *    nibbles, the next 64: two vpdpbusd into the same lanes, no interleaving;
 *  - codes enter vpdpbusd's unsigned operand as 2 * e2m1 + 128 (a vpshufb table), each sum
 *    started at -128 * (sum of x's 8 codes of the lane), prepared with x: exact, |lane| < 2^19;
 *  - i32 lane l then holds 8 of group g + l / 4's products; the factors wd * dx (the twin's
 *    products) come 8 groups at a time per row from its 8 scale bytes, and one vpermps spreads
 *    four of them per step (each step: one load, two masks, a shift, two vpshufb, two vpdpbusd,
 *    one conversion, one permute and one FMA per 64 bytes; the pair layout this replaced, 32 bytes
 *    broadcast per step, spent twice the conversions, permutes and FMAs: docs/KERNELS.md).
 * Rows go four per pass, sharing x's loads, with prefetch of the group of rows ahead (a row's
 * result does not depend on its group).  Checked against the scalar twin by
 * tests/c/test_q8_fp4.c. */
#include "kernels/tables.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/q8_fp4.h"
#include "kernels/unaligned.h"

/* Widest column pass (a multiple of 128): the prepared x lives on the stack (wider rows add the
 * passes' sums). */
enum { XP_MAX = 8192 };

typedef struct {
    int8_t q[XP_MAX] __attribute__((aligned(64)));        /* the quad layout, zeros past kc */
    int32_t off[XP_MAX / 8] __attribute__((aligned(64)));  /* -128 * (sum of each lane's 8 codes) */
    float dx[XP_MAX / 32 + 8] __attribute__((aligned(64))); /* x's scales, zeros up to 8 on */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

/* kc columns (a multiple of 32) of x's codes q into xp in the quad layout, rounded up to 128
 * columns with zeros (groups past kc). */
static void quad_x(const int8_t *q, int64_t kc, int8_t *xp) {
    /* per 128-bit lane (16 columns): the 8 even columns, then the 8 odd */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10,
                                           12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const int64_t kc128 = (kc + 127) / 128 * 128;
    for (int64_t c = 0; c < kc128; c += 32) {
        const int64_t at = c / 128 * 128 + (c % 128) / 2; /* group k of the block: bytes 16k, 64 + 16k */
        /* one group as [its 16 even columns | its 16 odd]: quadwords (e0 o0 e1 o1) -> (e0 e1 o0 o1) */
        const __m256i v = c < kc ? _mm256_permute4x64_epi64(
                                       _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(q + c)), split), 0xd8)
                                 : _mm256_setzero_si256();
        _mm_store_si128((__m128i *)(xp + at), _mm256_castsi256_si128(v));
        _mm_store_si128((__m128i *)(xp + at + 64), _mm256_extracti128_si256(v, 1));
    }
}

static void prep(const int8_t *q, const float *dx, int64_t kc, prep_x *x) {
    const int64_t kc128 = (kc + 127) / 128 * 128;
    quad_x(q, kc, x->q);
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t c = 0; c < kc128; c += 128) {
        const __m512i even = _mm512_load_si512((const void *)(x->q + c)), odd = _mm512_load_si512((const void *)(x->q + c + 64));
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k128, even), k128, odd);
        _mm512_store_si512((void *)(x->off + c / 8), _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
    memcpy(x->dx, dx, (size_t)(kc / 32) * sizeof(float));
    memset(x->dx + kc / 32, 0, 8 * sizeof(float));
}

/* wd (mg_q8_fp4_wd) of the n (1..8) ue8m0 bytes at s, times dx[0..8): (e - 1) << 23 for e >= 2,
 * the denormals 2^-128, 2^-127 (0x00200000 << e) for e = 0, 1, NaN for 255.  Absent bytes read
 * as 127 (2^-1), not 0, whose denormal factor would make every multiply with it a microcode
 * assist (their x is 0 anyway). */
INLINE __m256 factors8(const uint8_t *s, int n, __m256 dx) {
    /* a plain 8-byte load where all 8 are there: with the masked load every time the streaming
     * rows ran at ~33 Gweights/s instead of ~55 (Zen 5, docs/KERNELS.md) */
    const __m128i b = n == 8 ? _mm_loadl_epi64((const __m128i *)s)
                             : _mm_mask_loadu_epi8(_mm_set1_epi8(127), (__mmask16)((1u << n) - 1), (const void *)s);
    const __m256i e = _mm256_cvtepu8_epi32(b);
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i v = _mm256_mask_sllv_epi32(normal, _mm256_cmple_epi32_mask(e, _mm256_set1_epi32(1)),
                                       _mm256_set1_epi32(0x00200000), e);
    v = _mm256_mask_mov_epi32(v, _mm256_cmpeq_epi32_mask(e, _mm256_set1_epi32(255)), _mm256_set1_epi32(0x7fc00000));
    return _mm256_mul_ps(_mm256_castsi256_ps(v), dx);
}

/* R rows (1 or 4) of ng groups at p (rb bytes apart), scales at s (sb bytes apart): out[r] +=
 * the row's dot product with the prepared x. */
INLINE void rows_fp4(const int R, const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng,
                     const prep_x *x, float *out) {
    const __m512i tbl = _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)MG_MXFP4_VALUES2)),
                                         _mm512_set1_epi8((char)0x80)); /* + 128 */
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    /* the factor lanes of step j (groups j .. j + 3 of 8): [j x 4, j + 1 x 4, j + 2 x 4, j + 3 x 4] */
    const __m512i pick0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i pick1 = _mm512_add_epi32(pick0, _mm512_set1_epi32(4));
    const size_t ahead = rows_ahead((size_t)R * rb);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g += 8) {
        const int n = ng - g < 8 ? (int)(ng - g) : 8;
        const __m256 dx = _mm256_load_ps(x->dx + g);
        __m512 f[4];
        for (int r = 0; r < R; r++) f[r] = _mm512_castps256_ps512(factors8(s + r * sb + g, n, dx));
        for (int j = 0; j < n; j += 4) {
            const __m512i xe = _mm512_load_si512((const void *)(x->q + 32 * (g + j)));
            const __m512i xo = _mm512_load_si512((const void *)(x->q + 32 * (g + j) + 64));
            const __m512i off = _mm512_load_si512((const void *)(x->off + 4 * (g + j)));
            const __m512i pick = j ? pick1 : pick0;
            mg_prefetch_rows(p + ahead + 16 * (g + j) * R, (size_t)R * 64, x->l2);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + r * rb + 16 * (g + j);
                /* a last step of 1-3 groups: only their bytes (the row may end the mapping); the
                 * missing groups' x is 0 */
                const __m512i v = j + 4 <= n ? _mm512_loadu_si512((const void *)b)
                                             : _mm512_maskz_loadu_epi8(((__mmask64)1 << (16 * (n - j))) - 1, b);
                const __m512i lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m4));
                const __m512i hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
                const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(off, lo, xe), hi, xo);
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, f[r]), _mm512_cvtepi32_ps(sum), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
}

static void prep_any(const int8_t *q, const float *dx, int64_t kc, void *x) { prep(q, dx, kc, x); }
static void rows4(const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng, const void *x, float *out) {
    rows_fp4(4, p, rb, s, sb, ng, x, out);
}
static void rows1(const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng, const void *x, float *out) {
    rows_fp4(1, p, rb, s, sb, ng, x, out);
}

void mg_avx512vnni_linear_q8_fp4(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
        int64_t r1, int l2) {
    prep_x x;
    x.l2 = l2;
    mg_q8_drive_rows_scaled(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep_any, &x, rows4, 4, rows1);
}
#endif
