/* AVX2 int8-activation rows of the IQ grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S,
 * IQ1_S, IQ1_M; core/iq_grids.h, layouts in core/ggml_blocks.h): mg_avx2_linear_q8 hands them
 * here.  The arithmetic is the scalar twin's (kernels/scalar/q8_scalar.c: codes = signed grid
 * bytes, IQ1's 8g +- 1; k = 2s + 1 per 16; wd = d/8, d/4 or d), in q8_avx2.c's frame (x once
 * per token and column pass, R rows per pass with the group ahead prefetched, each row reduced
 * alone, so its result does not depend on the row range).
 *
 * Per 32-column group: the grid entries (4 of 8 bytes, IQ3: 8 of 4) are loaded by index into
 * one ymm of UNSIGNED magnitudes (8/25/43, 4..62, 1..15), vpmaddubsw's u8 operand as they are;
 * the weights' signs go onto x instead (a byte mask from the group's 32 sign bits: x ^ m - m,
 * never -128 since |x| <= 127), so no |w| or sign step is spent on the weights.  Pairs <= 2 *
 * 62 * 127 < 2^15.  vpmaddwd then applies k: the per-16 scales (IQ2_XS, IQ2_S, IQ1_M) as Q6_K's
 * in place of its ones; the per-32 ones (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S) folded into the float
 * factor d * c * k * dx (d * c * k exact; one rounding more than the twin's wd * dx, as the VNNI
 * loops' per-16 k).
 * IQ1: the entry g (-1, 0, 1) is signed, so vpsignb(x, g) = g * x against ones, times 8 in the
 * factor; the delta's +-1 (8g +- 1) is per block: its sign times x's sums per 32 (IQ1_S) or per
 * 8 (IQ1_M), prepared per token, one vector of 8 (16) integers per row and block. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"
#include "kernels/avx2/iq_codes.h"

/* As q8_avx2.c (docs/KERNELS.md: AVX2 int8 rows). */
enum { MIN_AHEAD = 8192, XP_MAX = 8192 };

INLINE __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
INLINE __m256 cvt_i32(__m256i v) { return _mm256_cvtepi32_ps(v); }

INLINE size_t rows_ahead(size_t group) {
    return group >= MIN_AHEAD ? group : (MIN_AHEAD + group - 1) / group * group;
}

/* x as every row reads it: the codes in order, dx per 32, and IQ1's integer sums. */
typedef struct {
    const int8_t *q;
    const float *dx;
    int32_t xs32[XP_MAX / 32] __attribute__((aligned(32))); /* IQ1_S: sums of x per 32 */
    int16_t xs8[XP_MAX / 8] __attribute__((aligned(32)));   /* IQ1_M: sums per 8, see prep */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

/* IQ1_M's sums per 8 columns, per block in the lane order of iq1_m_delta: the 8-groups
 * [0..7 | 16..23] then [8..15 | 24..31]. */
static void prep(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t kc, void *vx) {
    prep_x *x = vx;
    (void)sx; /* IQ1 takes its own sums: per 32 and per 8, in integers */
    x->q = q, x->dx = dx;
    if (f == MG_IQ1_S)
        for (int64_t g = 0; g < kc / 32; g++) {
            int s = 0;
            for (int l = 0; l < 32; l++) s += q[32 * g + l];
            x->xs32[g] = s;
        }
    if (f == MG_IQ1_M)
        for (int64_t b = 0; b < kc / 256; b++)
            for (int k = 0; k < 32; k++) {
                int s = 0;
                for (int l = 0; l < 8; l++) s += q[256 * b + 8 * k + l];
                const int lane = (k / 8 == 0 || k / 8 == 2 ? 0 : 16) + (k / 16) * 8 + k % 8;
                x->xs8[32 * b + lane] = (int16_t)s;
            }
}

/* ---- shared pieces ---------------------------------------------------------------------- */

/* vpshufb indices that spread the i16 scales 2g, 2g + 1 of 8 (bytes 4g..4g+3) over the low and
 * high 128-bit lanes of group g's pair sums (as q8_avx2.c's K16_PICK). */
static const int8_t PICK16[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15,
     14, 15}};

/* k of group g (0..7) from the 16 per-16 k (i16): [k_2g x 8 | k_2g+1 x 8] for vpmaddwd. */
INLINE __m256i k_of_group(__m256i k16, int g) {
    const __m256i half = _mm256_permute2x128_si256(k16, k16, g < 4 ? 0x00 : 0x11);
    return _mm256_shuffle_epi8(half, load32(PICK16[g & 3]));
}

/* 2s + 1 of 16 nibbles at sc (low nibble of byte j: the 16 columns 2j, high: 2j + 1) as i16. */
INLINE __m256i k16_nibbles(const uint8_t *sc) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)sc), m4 = _mm_set1_epi8(15);
    const __m128i s = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    return _mm256_or_si256(_mm256_slli_epi16(_mm256_cvtepu8_epi16(s), 1), _mm256_set1_epi16(1));
}

/* One group's pair sums times k (ones or per 16) into one of two accumulators by group parity
 * (two dependency chains), times the factor f. */
INLINE void add_group(__m256i pairs, __m256i k, float f, int g, __m256 *acc, __m256 *acc2) {
    const __m256 v = cvt_i32(_mm256_madd_epi16(pairs, k));
    if (g & 1)
        *acc2 = _mm256_fmadd_ps(_mm256_set1_ps(f), v, *acc2);
    else
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(f), v, *acc);
}

/* ---- the row loops ---------------------------------------------------------------------- */

/* The factor vector of a block of the per-32-scaled formats: d * c * (2s + 1) * dx per group,
 * s from the 8 per-32 fields of the block (IQ1_S: c = 1, its 8 of 8g + 1 in the factor). */
INLINE __m256 factors32(mg_format f, const uint8_t *b, __m256 dxv) {
    __m256i s;
    float dc;
    switch (f) {
    case MG_IQ2_XXS: /* aux's top nibbles */
        s = _mm256_srli_epi32(iq2_xxs_aux(b), 28);
        dc = f16_at(b) * 0.125f;
        break;
    case MG_IQ3_XXS:
        s = _mm256_srli_epi32(load32(b + 66), 28);
        dc = f16_at(b) * 0.25f;
        break;
    case MG_IQ3_S:
        s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)mg_ld32(b + 106)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                             _mm256_set1_epi32(15));
        dc = f16_at(b);
        break;
    default: /* IQ1_S: bits 12-14 of the u16 at 34 + 2g */
        s = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))), 12),
                             _mm256_set1_epi32(7));
        dc = f16_at(b);
        break;
    }
    const __m256 k = cvt_i32(_mm256_or_si256(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1)));
    return _mm256_mul_ps(_mm256_mul_ps(k, _mm256_set1_ps(dc)), dxv);
}

/* IQ1_M's 16 k = 2s + 1 (3 bits each: bits 3(j % 4).. of word j / 4 of the 4 u16 at 48) as i16. */
INLINE __m256i iq1_m_k16(const uint8_t *b) {
    const __m256i w = _mm256_set1_epi64x((long long)mg_ld64(b + 48));
    const __m256i spread = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6,
                                            7, 6, 7, 6, 7);
    /* move bits 3i .. 3i + 2 (i = j % 4) to the top by multiplying by 2^(13 - 3i), then down */
    const __m256i mul = _mm256_setr_epi16(1 << 13, 1 << 10, 1 << 7, 1 << 4, 1 << 13, 1 << 10, 1 << 7, 1 << 4, 1 << 13, 1 << 10,
                                          1 << 7, 1 << 4, 1 << 13, 1 << 10, 1 << 7, 1 << 4);
    const __m256i s = _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(w, spread), mul), 13);
    return _mm256_or_si256(_mm256_slli_epi16(s, 1), _mm256_set1_epi16(1));
}

/* IQ1_M's delta terms of a block: sum over the 32 8-groups of k * (+-1) * (x's sum), +1 where
 * bit 3 of the group's qh nibble is clear; in the lanes of the 16-groups [0..3 | 8..11] (a) and
 * [4..7 | 12..15] (b), times the factors fa, fb (d/8 * dx of their 32-groups). */
INLINE __m256 iq1_m_delta(const uint8_t *b, __m256i k16, const int16_t *xs8, __m256 fa, __m256 fb, __m256 acc) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(b + 32)));
    const __m256i one = _mm256_set1_epi16(1);
    const __m256i even = _mm256_or_si256(_mm256_slli_epi16(v, 12), one), odd = _mm256_or_si256(_mm256_slli_epi16(v, 8), one);
    const __m256i sa = _mm256_sign_epi16(_mm256_unpacklo_epi16(k16, k16), _mm256_unpacklo_epi16(even, odd));
    const __m256i sb = _mm256_sign_epi16(_mm256_unpackhi_epi16(k16, k16), _mm256_unpackhi_epi16(even, odd));
    acc = _mm256_fmadd_ps(fa, cvt_i32(_mm256_madd_epi16(sa, _mm256_load_si256((const __m256i *)xs8))), acc);
    return _mm256_fmadd_ps(fb, cvt_i32(_mm256_madd_epi16(sb, _mm256_load_si256((const __m256i *)(xs8 + 16)))), acc);
}

/* R rows of format f, nb blocks each: out[r] += the row's dot product with the prepared x. */
INLINE void rows_iq(const int R, mg_format f, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    int64_t e, bytes_i;
    mg_format_block(f, &e, &bytes_i);
    const size_t bytes = (size_t)bytes_i;
    const int per16 = f == MG_IQ2_XS || f == MG_IQ2_S || f == MG_IQ1_M, iq1 = f == MG_IQ1_S || f == MG_IQ1_M;
    const size_t ahead = rows_ahead((size_t)R * rb);
    const __m256i ones16 = _mm256_set1_epi16(1), ones8 = _mm256_set1_epi8(1);
    __m256 acc[4], acc2[4];
    for (int r = 0; r < R; r++) acc[r] = acc2[r] = _mm256_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        mg_prefetch_rows(pf, (size_t)R * bytes, x->l2);
        const int8_t *xq = x->q + 256 * i;
        const __m256 dxv = _mm256_loadu_ps(x->dx + 8 * i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + (size_t)r * rb;
            float fv[8] __attribute__((aligned(32)));
            __m256i k16 = ones16;
            if (f == MG_IQ1_M) {
                k16 = iq1_m_k16(b);
                const __m256 f8 = _mm256_mul_ps(_mm256_set1_ps(iq1_m_d(b)), dxv); /* 8 * wd * dx */
                _mm256_store_ps(fv, f8);
                const __m256 f1 = _mm256_mul_ps(f8, _mm256_set1_ps(0.125f));
                const __m256 fa = _mm256_permutevar8x32_ps(f1, _mm256_setr_epi32(0, 0, 1, 1, 4, 4, 5, 5));
                const __m256 fb = _mm256_permutevar8x32_ps(f1, _mm256_setr_epi32(2, 2, 3, 3, 6, 6, 7, 7));
                acc2[r] = iq1_m_delta(b, k16, x->xs8 + 32 * i, fa, fb, acc2[r]);
            } else if (per16) {
                k16 = k16_nibbles(b + (f == MG_IQ2_S ? 74 : 66));
                _mm256_store_ps(fv, _mm256_mul_ps(_mm256_set1_ps(f16_at(b) * 0.125f), dxv));
            } else {
                const __m256 fk = factors32(f, b, dxv);
                _mm256_store_ps(fv, fk);
                if (f == MG_IQ1_S) { /* the deltas: +-1 (bit 15 of the u16 at 34 + 2g) * x's sum per 32, / 8 */
                    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))), 16);
                    const __m256i dsum = _mm256_sign_epi32(_mm256_load_si256((const __m256i *)(x->xs32 + 8 * i)),
                                                           _mm256_or_si256(w, _mm256_set1_epi32(1)));
                    acc2[r] = _mm256_fmadd_ps(_mm256_mul_ps(fk, _mm256_set1_ps(0.125f)), cvt_i32(dsum), acc2[r]);
                }
            }
            uint32_t sg[8] __attribute__((aligned(32))); /* the sign bits of each group, where computed per block */
            iq_block_signs(f, b, sg);
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                uint32_t signs;
                const __m256i u = group_codes(f, b, g, sg, &signs);
                const __m256i xv = load32(xq + 32 * g);
                const __m256i pairs = iq1 ? _mm256_maddubs_epi16(ones8, _mm256_sign_epi8(xv, u))
                                          : _mm256_maddubs_epi16(u, signed_x(xv, signs));
                add_group(pairs, per16 ? k_of_group(k16, g) : ones16, fv[g], g, &acc[r], &acc2[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] += hsum8(_mm256_add_ps(acc[r], acc2[r]));
}

/* Rows per pass (measured, docs/KERNELS.md); MG_AVX2_Q8_IQ_GROUP overrides them, for
 * measuring. */
#ifdef MG_AVX2_Q8_IQ_GROUP
#define GROUP(n) MG_AVX2_Q8_IQ_GROUP
#else
#define GROUP(n) n
#endif
#define ROWS_FNS(NAME, FMT, G)                                                                                           \
    enum { G_##NAME = GROUP(G) };                                                                                     \
    static void rowsg_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *x, float *o) {                     \
        rows_iq(G_##NAME, FMT, p, rb, nb, x, o);                                                                       \
    }                                                                                                                  \
    static void rows1_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *x, float *o) {                     \
        rows_iq(1, FMT, p, rb, nb, x, o);                                                                              \
    }
ROWS_FNS(iq2_xxs, MG_IQ2_XXS, 2)
ROWS_FNS(iq2_xs, MG_IQ2_XS, 2)
ROWS_FNS(iq2_s, MG_IQ2_S, 2)
ROWS_FNS(iq3_xxs, MG_IQ3_XXS, 2)
ROWS_FNS(iq3_s, MG_IQ3_S, 2)
ROWS_FNS(iq1_s, MG_IQ1_S, 2)
ROWS_FNS(iq1_m, MG_IQ1_M, 2)

static const struct {
    mg_q8_rows_fn *group, *one;
    int n;
} ROWS[MG_FORMAT_COUNT] = {
    [MG_IQ2_XXS] = {rowsg_iq2_xxs, rows1_iq2_xxs, G_iq2_xxs}, [MG_IQ2_XS] = {rowsg_iq2_xs, rows1_iq2_xs, G_iq2_xs},
    [MG_IQ2_S] = {rowsg_iq2_s, rows1_iq2_s, G_iq2_s},         [MG_IQ3_XXS] = {rowsg_iq3_xxs, rows1_iq3_xxs, G_iq3_xxs},
    [MG_IQ3_S] = {rowsg_iq3_s, rows1_iq3_s, G_iq3_s},         [MG_IQ1_S] = {rowsg_iq1_s, rows1_iq1_s, G_iq1_s},
    [MG_IQ1_M] = {rowsg_iq1_m, rows1_iq1_m, G_iq1_m}};

int mg_avx2_q8_iq_takes(mg_format f) { return (unsigned)f < MG_FORMAT_COUNT && ROWS[f].group != NULL; }

void mg_avx2_linear_q8_iq(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride, int64_t r0,
                          int64_t r1, int l2) {
    const mg_format f = w->format;
    prep_x x;
    x.l2 = l2;
    mg_q8_drive_rows(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep, &x, ROWS[f].group, ROWS[f].n, ROWS[f].one);
}
#endif
