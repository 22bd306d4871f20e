/* AVX2 kernels of native FP4 (MG_FP4_E2M1 with ue8m0 scales per 32 columns: DeepSeek-V4's
 * experts; the contract: kernels/q8_fp4.h) under int8 activations: the rows that
 * mg_avx2_linear_q8 hands FP4 to, and the int8 GEMM's decoder (kernels/q8_gemm.h).
 *
 * Rows: MXFP4's loop (q8_avx2.c, rows_nib) on another layout.  x is prepared once per token and
 * column pass in the pair layout of q8_fp4.h, so that one 32-byte load of a row (groups g,
 * g + 1) gives, as low nibbles, the even columns of both groups against x's first 32 bytes and,
 * as high nibbles, the odd ones against the next 32: no interleaving of the nibbles.  Codes
 * enter vpmaddubsw as the unsigned 2 * e2m1 + 12 (0 .. 24: a vpshufb table) and x's part 12 *
 * (sum of each pair lane's 4 codes) is taken off by an offset prepared with x: |pair| <= 2 * 24
 * * 127 per product pair, the two halves and the offset together < 3 * 6096 < 2^15.  The i32
 * lanes 0-3 are then group g's, 4-7 group g + 1's, scaled by [f_g x 4 | f_g+1 x 4], f = wd * dx
 * (the twin's products), computed 8 groups at a time per row from its 8 scale bytes.  Rows go
 * four per pass with prefetch of the group of rows ahead; each row is reduced alone, in the
 * same order whatever its group (as q8_avx2.c's).  Checked against the scalar twin by
 * tests/c/test_q8_fp4.c.  q8_fp4_rows_avxvnni.c builds the rows again with AVX-VNNI, as
 * q8_rows_avxvnni.c does q8_avx2.c's: two vpdpbusd from the offsets' i32 sums in place of the
 * two vpmaddubsw, the i16 adds and the vpmaddwd (the same sums). */
#include "kernels/tables.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"
#include "kernels/q8_gemm.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/q8_fp4.h"
#include "kernels/unaligned.h"

#if defined(MG_Q8_ROWS_AVXVNNI) && defined(__AVXVNNI__)
#define FP4_VNNI 1
#define FP4_ROWS mg_avxvnni_linear_q8_fp4
#else
#define FP4_VNNI 0
#define FP4_ROWS mg_avx2_linear_q8_fp4
#endif

/* Widest column pass: the prepared x lives on the stack (wider rows add the passes' sums). */
enum { XP_MAX = 8192, MIN_AHEAD = 8192 };

typedef struct {
    int8_t q[XP_MAX] __attribute__((aligned(32)));      /* the pair layout (q8_fp4.h) */
    int16_t off[XP_MAX / 4] __attribute__((aligned(32))); /* -12 * the 4 codes of each pair lane (the
                                                           * AVX-VNNI build: of each i32 lane) */
    float dx[XP_MAX / 32 + 8] __attribute__((aligned(32))); /* x's scales, zeros up to 8 on */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

static void prep(const int8_t *q, const float *dx, int64_t kc, prep_x *x) {
    const int64_t kc64 = (kc + 63) / 64 * 64;
    mg_q8_fp4_pair_x(q, kc, x->q);
    const __m256i k12 = _mm256_set1_epi8(12);
    for (int64_t c = 0; c < kc64; c += 64) {
        const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(k12, _mm256_load_si256((const __m256i *)(x->q + c))),
                                           _mm256_maddubs_epi16(k12, _mm256_load_si256((const __m256i *)(x->q + c + 32))));
        const __m256i o = _mm256_sub_epi16(_mm256_setzero_si256(), s);
        _mm256_store_si256((__m256i *)(x->off + c / 4), FP4_VNNI ? _mm256_madd_epi16(o, _mm256_set1_epi16(1)) : o);
    }
    memcpy(x->dx, dx, (size_t)(kc / 32) * sizeof(float));
    memset(x->dx + kc / 32, 0, 8 * sizeof(float));
}

/* wd (mg_q8_fp4_wd) of 8 ue8m0 bytes in i32 lanes: (e - 1) << 23 for e >= 2, the denormals
 * 2^-128, 2^-127 (0x00200000 << e) for e = 0, 1, NaN for 255. */
INLINE __m256 wd8(__m256i e) {
    const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i v = _mm256_blendv_epi8(denormal, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1)));
    const __m256 nan = _mm256_set1_ps(NAN);
    return _mm256_blendv_ps(_mm256_castsi256_ps(v), nan, _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, _mm256_set1_epi32(255))));
}

/* The n (1..8) scale bytes at s as 8 i32 lanes; absent ones 127 (2^-1), not 0, whose denormal
 * factor would make every multiply with it a microcode assist (their x is 0 anyway). */
INLINE __m256i scale_bytes8(const uint8_t *s, int n) {
    uint64_t e = 0x7f7f7f7f7f7f7f7full;
    if (n == 8)
        e = mg_ld64(s);
    else
        for (int i = 0; i < n; i++) e = (e & ~((uint64_t)0xff << (8 * i))) | (uint64_t)s[i] << (8 * i);
    return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)e));
}

/* R rows of ng groups at p (rb bytes apart), scales at s (sb bytes apart): out[r] += the row's
 * dot product with the prepared x. */
INLINE void rows_fp4(const int R, const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng,
                     const prep_x *x, float *out) {
    static const int8_t U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0}; /* values2 + 12 */
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)U));
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const size_t group = (size_t)R * rb, ahead = group >= MIN_AHEAD ? group : (MIN_AHEAD + group - 1) / group * group;
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g += 8) {
        const int n = ng - g < 8 ? (int)(ng - g) : 8;
        const __m256 dx = _mm256_load_ps(x->dx + g);
        __m256 f[4];
        for (int r = 0; r < R; r++) f[r] = _mm256_mul_ps(wd8(scale_bytes8(s + r * sb + g, n)), dx);
        /* the factor lanes of pair j: [j x 4 | j + 1 x 4], stepped by 2 (an add, not a vector
         * built from j) */
        __m256i pick = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
        for (int j = 0; j < n; j += 2, pick = _mm256_add_epi32(pick, _mm256_set1_epi32(2))) {
            const int8_t *xq = x->q + 32 * (g + j);
            const __m256i x0 = _mm256_load_si256((const __m256i *)xq), x1 = _mm256_load_si256((const __m256i *)(xq + 32));
            const __m256i off = _mm256_load_si256((const __m256i *)(x->off + 8 * (g + j)));
            mg_prefetch_rows(p + ahead + 16 * (g + j) * R, (size_t)R * 32, x->l2);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *b = p + r * rb + 16 * (g + j);
                /* an odd last group: 16 bytes (the row may end the mapping), its partner's x is 0 */
                const __m256i v = j + 1 < n ? _mm256_loadu_si256((const __m256i *)b)
                                            : _mm256_set_m128i(_mm_setzero_si128(), _mm_loadu_si128((const __m128i *)b));
                const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, m4));
                const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
#if FP4_VNNI
                const __m256i sum = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(off, lo, x0), hi, x1);
#else
                const __m256i pairs =
                    _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_maddubs_epi16(hi, x1)), off);
                const __m256i sum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
                acc[r] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(f[r], pick), _mm256_cvtepi32_ps(sum), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] += hsum8(acc[r]);
}

static void prep_any(const int8_t *q, const float *dx, int64_t kc, void *x) { prep(q, dx, kc, x); }
static void rows4(const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng, const void *x, float *out) {
    rows_fp4(4, p, rb, s, sb, ng, x, out);
}
static void rows1(const uint8_t *p, size_t rb, const uint8_t *s, size_t sb, int64_t ng, const void *x, float *out) {
    rows_fp4(1, p, rb, s, sb, ng, x, out);
}

void FP4_ROWS(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0, int64_t r1,
              int l2) {
    prep_x x;
    x.l2 = l2;
    mg_q8_drive_rows_scaled(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep_any, &x, rows4, 4, rows1);
}

#if !FP4_VNNI
/* The GEMM's decoder: per group, the 16 bytes' low and high nibbles through the value table and
 * interleaved back to element order (vpunpck*bw), the factor the twin's. */
static void decode_fp4(const uint8_t *p, const uint8_t *s, int64_t ng, int8_t *codes, float *fac) {
    const __m128i m4 = _mm_set1_epi8(0x0f), tbl = _mm_loadu_si128((const __m128i *)MG_MXFP4_VALUES2);
    for (int64_t g = 0; g < ng; g++) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(p + 16 * g));
        const __m128i lo = _mm_shuffle_epi8(tbl, _mm_and_si128(v, m4));
        const __m128i hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
        _mm_storeu_si128((__m128i *)(codes + 32 * g), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128((__m128i *)(codes + 32 * g + 16), _mm_unpackhi_epi8(lo, hi));
        fac[g] = mg_q8_fp4_wd(s[g]);
    }
}

mg_q8_decode_fp4_fn *mg_avx2_q8_decoder_fp4(void) { return decode_fp4; }
#endif
#elif !defined(MG_Q8_ROWS_AVXVNNI)
mg_q8_decode_fp4_fn *mg_avx2_q8_decoder_fp4(void) { return NULL; }
#endif
