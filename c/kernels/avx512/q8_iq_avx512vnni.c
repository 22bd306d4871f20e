/* AVX-512 VNNI int8-activation rows of the IQ grid formats (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
 * IQ3_S, IQ1_S, IQ1_M): q8_avx512vnni.c hands them here.  The arithmetic is the scalar twin's
 * (kernels/scalar/q8_scalar.c), the codes the AVX2 rows' (avx2/iq_codes.h: per 32 columns the
 * grid entries loaded by index into a ymm), two groups per zmm:
 *  - the grid magnitudes (unsigned) are vpdpbusd's u8 operand as they are, and the weights'
 *    signs go onto x: 64 sign bits are a mask register as stored (IQ2_S, IQ3_S) or as the
 *    block's sign bytes give them (IQ2_XXS, IQ2_XS, IQ3_XXS), one masked subtract (0 - x);
 *  - IQ1's entries g (-1, 0, 1) enter as g + 1 with the sum started at -(x's sum of 4), prepared
 *    per token, so the dot products are sum g x; the deltas (8g +- 1: the +-1) are one vector
 *    per row and block: x's sums per 16 (IQ1_S) or per 8 (IQ1_M, through vpmaddwd with +-1)
 *    with the block's delta signs;
 *  - the per-16 factors d * c * k * dx (k = 2s + 1, folded into the float factor as the VNNI
 *    Q2_K / Q3_K loops do; IQ1: c = 1, the codes' 8 in it, the deltas times 1/8 of it) are one
 *    16-lane vector per row and block, spread over each zmm's lanes by one vpermps.
 * Rows two per pass (x loaded once for both; one, two and four measured alike from L3, two a
 * little ahead on IQ3), the group ahead prefetched, each row reduced alone (its result does not
 * depend on the row range).  The sums are exact (|4 products| <=
 * 4 * 62 * 127), so the results differ from the twin's only in the rounding of the factors and
 * the order of the fp32 additions. */
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"
#include "kernels/avx2/iq_codes.h"
#include "kernels/q8_rows.h"
#include "kernels/prefetch_rows.h"

/* Widest column pass: the prepared x lives on the stack (wider rows add the passes' sums). */
enum { XP_MAX = 8192 };

typedef struct {
    const int8_t *q;
    float ds[XP_MAX / 16] __attribute__((aligned(64)));   /* dx per 16 columns */
    int32_t off[XP_MAX / 4] __attribute__((aligned(64)));  /* IQ1: -(sum of each 4 codes) */
    int32_t xs16[XP_MAX / 16] __attribute__((aligned(64))); /* IQ1_S: sums of x per 16 */
    int16_t xs8[XP_MAX / 8] __attribute__((aligned(64)));   /* IQ1_M: sums of x per 8 */
    int l2; /* the rows prefetch into L2, not L1 (kernels/prefetch_rows.h); set by the entry */
} prep_x;

static void prep(mg_format f, const int8_t *q, const float *dx, const float *sx, int64_t cols, void *vx) {
    prep_x *x = vx;
    (void)sx; /* IQ1 takes its own sums: per 16 and per 8, in integers */
    const __m512i twice = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    x->q = q;
    for (int64_t b = 0; b < cols; b += 256)
        _mm512_store_ps(x->ds + b / 16, _mm512_permutexvar_ps(twice, _mm512_castps256_ps512(_mm256_loadu_ps(dx + b / 32))));
    if (f == MG_IQ1_S || f == MG_IQ1_M)
        for (int64_t c = 0; c < cols; c += 64) {
            const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), _mm512_loadu_si512((const void *)(q + c)));
            _mm512_store_si512((void *)(x->off + c / 4), _mm512_sub_epi32(_mm512_setzero_si512(), s));
        }
    if (f == MG_IQ1_S)
        for (int64_t c = 0; c < cols; c += 16) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += q[c + l];
            x->xs16[c / 16] = s;
        }
    if (f == MG_IQ1_M)
        for (int64_t c = 0; c < cols; c += 8) {
            int s = 0;
            for (int l = 0; l < 8; l++) s += q[c + l];
            x->xs8[c / 8] = (int16_t)s;
        }
}

/* Lanes [each of 8 twice] of 8 i32 values. */
INLINE __m512i dup8(__m256i v) {
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), _mm512_castsi256_si512(v));
}

/* The sub-scale s of each 16 columns of block b (i32 lanes), and the block's d * c into *dc. */
INLINE __m512i scales16(mg_format f, const uint8_t *b, float *dc) {
    switch (f) {
    case MG_IQ2_XXS: *dc = f16_at(b) * 0.125f; return dup8(_mm256_srli_epi32(iq2_xxs_aux(b), 28));
    case MG_IQ3_XXS: *dc = f16_at(b) * 0.25f; return dup8(_mm256_srli_epi32(iq_load32(b + 66), 28));
    case MG_IQ3_S:
        *dc = f16_at(b);
        return dup8(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)mg_ld32(b + 106)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                     _mm256_set1_epi32(15)));
    case MG_IQ2_XS:
    case MG_IQ2_S: {
        const __m128i v = _mm_loadl_epi64((const __m128i *)(b + (f == MG_IQ2_S ? 74 : 66))), m4 = _mm_set1_epi8(15);
        *dc = f16_at(b) * 0.125f;
        return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4)));
    }
    case MG_IQ1_S:
        *dc = f16_at(b);
        return dup8(_mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))), 12),
                                     _mm256_set1_epi32(7)));
    default: { /* IQ1_M: bits 3(j % 4).. of the u16 word j / 4 at 48 */
        *dc = iq1_m_d(b);
        const __m512i w = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                                   _mm512_castsi128_si512(_mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)(b + 48)))));
        return _mm512_and_si512(_mm512_srlv_epi32(w, _mm512_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9, 0, 3, 6, 9)),
                                _mm512_set1_epi32(7));
    }
    }
}

/* IQ1's delta sums of block b per 16 columns: sum over its columns of (+-1) * x, -1 where the
 * delta is negative (IQ1_S: bit 15 of the group's u16 at 34; IQ1_M: bit 3 of the 8-group's
 * qh nibble at 32). */
INLINE __m512i iq1_deltas(mg_format f, const uint8_t *b, const prep_x *x, int64_t i) {
    if (f == MG_IQ1_S) {
        const __m512i w = dup8(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34))));
        const __m512i xs = _mm512_load_si512((const void *)(x->xs16 + 16 * i));
        return _mm512_mask_sub_epi32(xs, _mm512_test_epi32_mask(w, _mm512_set1_epi32(0x8000)), _mm512_setzero_si512(), xs);
    }
    /* IQ1_M: byte m of qh holds the nibbles of 8-groups 2m, 2m + 1: each byte to two i16 lanes */
    const __m128i qh = _mm_loadu_si128((const __m128i *)(b + 32));
    const __m512i nib = _mm512_cvtepu8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(qh, qh)), _mm_unpackhi_epi8(qh, qh), 1));
    const __mmask32 neg = _mm512_test_epi16_mask(nib, _mm512_set1_epi32(0x00800008));
    const __m512i pm1 = _mm512_mask_blend_epi16(neg, _mm512_set1_epi16(1), _mm512_set1_epi16(-1));
    return _mm512_madd_epi16(pm1, _mm512_load_si512((const void *)(x->xs8 + 32 * i)));
}

/* R rows of format f, nb blocks each: out[r] += the row's dot product with the prepared x. */
INLINE void rows_iq(const int R, mg_format f, const uint8_t *p, size_t rb, int64_t nb, const prep_x *x, float *out) {
    int64_t e, bytes_i;
    mg_format_block(f, &e, &bytes_i);
    const size_t bytes = (size_t)bytes_i;
    const int iq1 = f == MG_IQ1_S || f == MG_IQ1_M;
    const size_t ahead = rows_ahead(R * rb);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const uint8_t *pf = p + ahead;
    for (int64_t i = 0; i < nb; i++, p += bytes, pf += R * bytes) {
        mg_prefetch_rows(pf, R * bytes, x->l2);
        const int8_t *xq = x->q + 256 * i;
        const __m512 dx16 = _mm512_load_ps(x->ds + 16 * i);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = p + r * rb;
            float dc;
            const __m512i s = scales16(f, b, &dc);
            const __m512i k = _mm512_or_si512(_mm512_slli_epi32(s, 1), _mm512_set1_epi32(1));
            const __m512 fk = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(k), _mm512_set1_ps(dc)), dx16);
            if (iq1) acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(fk, _mm512_set1_ps(0.125f)), _mm512_cvtepi32_ps(iq1_deltas(f, b, x, i)), acc[r]);
            uint64_t sg[4] __attribute__((aligned(32))); /* the sign bits of each 64 columns */
            iq_block_signs(f, b, (uint32_t *)sg);
            if (f == MG_IQ2_S || f == MG_IQ3_S)
                memcpy(sg, b + (f == MG_IQ2_S ? 34 : 74), 32);
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                uint32_t unused;
                const __m256i u0 = group_codes(f, b, 2 * h, (const uint32_t *)sg, &unused);
                const __m256i u1 = group_codes(f, b, 2 * h + 1, (const uint32_t *)sg, &unused);
                const __m512i u = _mm512_inserti64x4(_mm512_castsi256_si512(u0), u1, 1);
                const __m512i xv = _mm512_loadu_si512((const void *)(xq + 64 * h));
                __m512i dot;
                if (iq1) {
                    dot = _mm512_dpbusd_epi32(_mm512_load_si512((const void *)(x->off + 64 * i + 16 * h)),
                                              _mm512_add_epi8(u, _mm512_set1_epi8(1)), xv);
                } else {
                    const __m512i xs = _mm512_mask_sub_epi8(xv, _cvtu64_mask64(sg[h]), _mm512_setzero_si512(), xv);
                    dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xs);
                }
                const __m512i pick = _mm512_add_epi32(spread, _mm512_set1_epi32(4 * h));
                acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, fk), _mm512_cvtepi32_ps(dot), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) out[r] += _mm512_reduce_add_ps(acc[r]);
}

/* Rows per pass (measured, docs/KERNELS.md); MG_VNNI_Q8_IQ_GROUP overrides it, for measuring. */
#ifndef MG_VNNI_Q8_IQ_GROUP
#define MG_VNNI_Q8_IQ_GROUP 2
#endif
enum { GROUP = MG_VNNI_Q8_IQ_GROUP };
#define ROWS_FNS(NAME, FMT)                                                                                            \
    static void rowsg_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *x, float *o) {                     \
        rows_iq(GROUP, FMT, p, rb, nb, x, o);                                                                          \
    }                                                                                                                  \
    static void rows1_##NAME(const uint8_t *p, size_t rb, int64_t nb, const void *x, float *o) {                     \
        rows_iq(1, FMT, p, rb, nb, x, o);                                                                              \
    }
ROWS_FNS(iq2_xxs, MG_IQ2_XXS)
ROWS_FNS(iq2_xs, MG_IQ2_XS)
ROWS_FNS(iq2_s, MG_IQ2_S)
ROWS_FNS(iq3_xxs, MG_IQ3_XXS)
ROWS_FNS(iq3_s, MG_IQ3_S)
ROWS_FNS(iq1_s, MG_IQ1_S)
ROWS_FNS(iq1_m, MG_IQ1_M)

static const struct {
    mg_q8_rows_fn *group, *one;
} ROWS[MG_FORMAT_COUNT] = {
    [MG_IQ2_XXS] = {rowsg_iq2_xxs, rows1_iq2_xxs}, [MG_IQ2_XS] = {rowsg_iq2_xs, rows1_iq2_xs},
    [MG_IQ2_S] = {rowsg_iq2_s, rows1_iq2_s},       [MG_IQ3_XXS] = {rowsg_iq3_xxs, rows1_iq3_xxs},
    [MG_IQ3_S] = {rowsg_iq3_s, rows1_iq3_s},       [MG_IQ1_S] = {rowsg_iq1_s, rows1_iq1_s},
    [MG_IQ1_M] = {rowsg_iq1_m, rows1_iq1_m}};

int mg_avx512vnni_q8_iq_takes(mg_format f) { return (unsigned)f < MG_FORMAT_COUNT && ROWS[f].group != NULL; }

void mg_avx512vnni_linear_q8_iq(const mg_matrix *w, const mg_q8_act *xq, int64_t n_tok, float *y, int64_t y_stride,
                                int64_t r0, int64_t r1, int l2) {
    const mg_format f = w->format;
    prep_x x;
    x.l2 = l2;
    mg_q8_drive_rows(w, xq, n_tok, y, y_stride, r0, r1, XP_MAX, prep, &x, ROWS[f].group, GROUP, ROWS[f].one);
}
#endif
