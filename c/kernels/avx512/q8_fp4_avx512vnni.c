/* AVX-512 VNNI rows of native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32 columns: DeepSeek-V4's
 * experts; the contract: kernels/q8_fp4.h) under int8 activations, which q8_avx512vnni.c's entry
 * hands FP4 to below the GEMM's token count.  MXFP4's loop there (rows_32) on another layout:
 *  - x is prepared once per token and column pass in q8_fp4.h's pair layout (per 64 columns:
 *    the even columns of groups g and g + 1, then their odd ones), so that a row's 32 bytes of
 *    groups g, g + 1, broadcast to both 256-bit halves, give the whole zmm of codes by one
 *    masked 16-bit shift (by 4, the upper half only) and one mask: no interleaving;
 *  - codes enter vpdpbusd's unsigned operand as 2 * e2m1 + 128 (a vpshufb table), each sum
 *    started at -128 * (sum of x's 4 codes), prepared with x: exact, |lane| < 2^17;
 *  - the i32 lanes 0-3 and 8-11 are then group g's, 4-7 and 12-15 group g + 1's; their factors
 *    wd * dx (the twin's products) come 8 groups at a time per row from its 8 scale bytes, and
 *    one vpermps spreads a pair of them per step.
 * Rows go four per pass, sharing x's loads, with prefetch of the group of rows ahead (a row's
 * result does not depend on its group).  Checked against the scalar twin by
 * tests/c/test_q8_fp4.c. */
#include "kernels/tables.h"
#include "kernels/q8_rows.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/q8_fp4.h"
#include "kernels/unaligned.h"

/* Widest column pass: the prepared x lives on the stack (wider rows add the passes' sums). */
enum { XP_MAX = 8192 };

typedef struct {
    int8_t q[XP_MAX] __attribute__((aligned(64)));        /* the pair layout (q8_fp4.h) */
    int32_t off[XP_MAX / 4] __attribute__((aligned(64)));  /* -128 * (sum of each 4 codes) */
    float dx[XP_MAX / 32 + 8] __attribute__((aligned(64))); /* x's scales, zeros up to 8 on */
} prep_x;

static void prep(const int8_t *q, const float *dx, int64_t kc, prep_x *x) {
    const int64_t kc64 = (kc + 63) / 64 * 64;
    mg_q8_fp4_pair_x(q, kc, x->q);
    const __m512i k128 = _mm512_set1_epi8((char)0x80);
    for (int64_t c = 0; c < kc64; c += 64)
        _mm512_store_si512((void *)(x->off + c / 4),
                           _mm512_sub_epi32(_mm512_setzero_si512(),
                                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), k128,
                                                                _mm512_load_si512((const void *)(x->q + c)))));
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
    const size_t ahead = rows_ahead((size_t)R * rb);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g += 8) {
        const int n = ng - g < 8 ? (int)(ng - g) : 8;
        const __m256 dx = _mm256_load_ps(x->dx + g);
        __m512 f[4];
        for (int r = 0; r < R; r++) f[r] = _mm512_castps256_ps512(factors8(s + r * sb + g, n, dx));
        /* the factor lanes of pair j: [j x 4, j + 1 x 4, j x 4, j + 1 x 4], stepped by 2 (an add, not
         * a vector built from j) */
        __m512i pick = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
        for (int j = 0; j < n; j += 2, pick = _mm512_add_epi32(pick, _mm512_set1_epi32(2))) {
            const __m512i xv = _mm512_load_si512((const void *)(x->q + 32 * (g + j)));
            const __m512i off = _mm512_load_si512((const void *)(x->off + 8 * (g + j)));
            for (size_t l = 0; l < (size_t)R * 32; l += 64)
                _mm_prefetch((const char *)p + ahead + 16 * (g + j) * R + l, _MM_HINT_T0);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + r * rb + 16 * (g + j);
                /* an odd last group: 16 bytes (the row may end the mapping), its partner's x is 0 */
                const __m512i v = j + 1 < n ? _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b))
                                            : _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)b));
                /* the upper 256 bits' 16-bit words shifted by 4: the high nibbles */
                const __m512i u =
                    _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xffff0000u, v, 4), m4));
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, f[r]),
                                         _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(off, u, xv)), acc[r]);
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
        int64_t r1) {
    prep_x x;
    mg_q8_drive_rows_scaled(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep_any, &x, rows4, 4, rows1);
}
#endif
