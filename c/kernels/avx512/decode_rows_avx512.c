/* AVX-512 decode (n_tok == 1) of fp8 with folded block scales, fp4 and bf16, up to four rows per
 * pass sharing the x loads; decode_avx512.c picks the rows for them. */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"

/* The exact values of the 16 e2m1 codes. */
INLINE __m512 fp4_table(void) {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
}

/* fp8 with folded block scales, R (1..4) rows at once.  f16 = 0: decoded without vcvtph2ps (on
 * Zen 4 the four conversions per line bounded the f16-decoding loop, row2_fp8): in each 16-bit
 * lane an arithmetic shift by 4 and the mask 0x87F0 turn a byte s.eeee.mmm into s << 15 |
 * eeeemmm << 4, the upper half of an fp32 whose value is exactly v * 2^-120 (eeee = 0 lands in
 * the fp32 denormals, still exact); a 16-bit shift or a mask then widens the lanes as for bf16,
 * and xq carries the 2^120 (fold_block_scales with bias 112), per 64 columns in the order 4i,
 * 4i + 2, 4i + 1, 4i + 3.  f16 = 1, for CPUs whose multiplies take a microcode assist on a
 * denormal input (mg_cpu_features.denormal_assists; e4m3's subnormal codes, about one in
 * 2,000-8,000 of real block-scaled fp8, cost those CPUs 10-40 % of this loop): the shift and mask
 * 0xBF80 make each byte the f16 of v * 2^-8 (subnormals included) and vcvtph2ps a normal fp32;
 * xq carries 256 and the scales (bias 0), in decode_avx512.c's permute_x order (per 64 columns:
 * even 0-30, even 32-62, odd 1-31, odd 33-63).  Either way each weight times x is the product the
 * scalar twin forms.  NaN codes are not supported, as in the other fp8 paths. */
INLINE void rows_fp8_folded(const int R, const int f16, const uint8_t *const *p, const float *xq, int64_t nb,
                            size_t ahead, float *out) {
    const __m512i m = _mm512_set1_epi16((short)(f16 ? 0xBF80 : 0x87F0)), hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a0[4], a1[4];
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xq += 64) {
        const __m512 x0 = _mm512_load_ps(xq), x1 = _mm512_load_ps(xq + 16);
        const __m512 x2 = _mm512_load_ps(xq + 32), x3 = _mm512_load_ps(xq + 48);
        for (int j = 0; j < R; j++) {
            /* into L1 on every CPU, not L2 as the other multi-row loops: DeepSeek-V4 native decode
             * 3-5 % faster on Zen 5; on a Sapphire Rapids-class core L2 was within the noise in the
             * engine (the int8 rows gained 11-19 % there) and 3 % slower alone (docs/KERNELS.md) */
            _mm_prefetch((const char *)p[j] + 64 * i + ahead, _MM_HINT_T0);
            const __m512i w = _mm512_loadu_si512(p[j] + 64 * i);
            if (f16) {
                const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(w, 1), m);
                const __m512i even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1), m);
                a0[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(even)), x0, a0[j]);
                a1[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(even, 1)), x1, a1[j]);
                a0[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(odd)), x2, a0[j]);
                a1[j] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(odd, 1)), x3, a1[j]);
                continue;
            }
            const __m512i even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 4), m);
            const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(w, 4), m);
            a0[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(even, 16)), x0, a0[j]); /* 4i */
            a1[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(even, hi)), x1, a1[j]); /* 4i + 2 */
            a0[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(odd, 16)), x2, a0[j]);  /* 4i + 1 */
            a1[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(odd, hi)), x3, a1[j]);   /* 4i + 3 */
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

/* fp4, R (1..4) rows at once: p[j] points at the same columns of row j, s[j] at its group scales
 * (NULL: unscaled).  Each 64-byte line is loaded once per row and shifts by 0, 4, ..., 28
 * bring each of its eight nibbles to the bottom of the 32-bit lanes (vpermps reads only those 4
 * bits), so vector k holds columns 8i + k in lane i; the sixteen xp loads of a line serve all R
 * rows.  Four rows, because two needed unaligned loads that split cache lines and six or eight
 * spill registers.  Prefetch: the same line of the next group of R rows (ahead = R row strides),
 * as for fp8; a fixed 2 KiB pointed inside the group being read and left the loop waiting on
 * memory (docs/KERNELS.md). */
INLINE void rows_fp4(const int R, const uint8_t *const *p, const float *xp, int64_t nb, const float *const *s,
                     size_t ahead, float *out) {
    const __m512 tab = fp4_table();
    __m512 acc[4];
    for (int j = 0; j < R; j++) acc[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 128) {
        __m512 s0[4], s1[4];
        __m512i w[4];
        for (int j = 0; j < R; j++) w[j] = load_line(p[j], i, ahead);
        for (int k = 0; k < 4; k++) {
            const __m512 x0 = _mm512_load_ps(xp + 32 * k), x1 = _mm512_load_ps(xp + 32 * k + 16);
            for (int j = 0; j < R; j++) {
                const __m512i lo = k == 0 ? w[j] : _mm512_srli_epi32(w[j], 8 * k);
                const __m512i hi = _mm512_srli_epi32(w[j], 8 * k + 4);
                if (k == 0) {
                    s0[j] = _mm512_mul_ps(_mm512_permutexvar_ps(lo, tab), x0);
                    s1[j] = _mm512_mul_ps(_mm512_permutexvar_ps(hi, tab), x1);
                } else {
                    s0[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(lo, tab), x0, s0[j]);
                    s1[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(hi, tab), x1, s1[j]);
                }
            }
        }
        for (int j = 0; j < R; j++) { /* s[0] is loop-invariant: the compiler unswitches */
            const __m512 part = _mm512_add_ps(s0[j], s1[j]);
            acc[j] = s[0] ? _mm512_fmadd_ps(part, fp4_line_scales(s[j], i), acc[j]) : _mm512_add_ps(acc[j], part);
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(acc[j]);
}
/* fp8 with 128x128 block scales: x * 256 in the order rows_fp8_folded reads it (per 64 columns:
 * 4i, 4i + 2, 4i + 1, 4i + 3 for i < 16), built once per call. */
void mg_avx512_permute_x_fp8_folded(const float *x, int64_t kc, float *xo) {
    static const int order[4] = {0, 2, 1, 3};
    for (int64_t g = 0; g < kc; g += 64)
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < 16; i++) xo[g + 16 * q + i] = x[g + 4 * i + order[q]] * 256.0f;
}

/* xq = xo (x * 256, permuted) times 2^bias times the scale of each 128-column block of row r, so
 * that the 128 rows sharing these scales run rows_fp8_folded, which leaves a factor 2^-120 in each
 * weight (bias 112), or 2^-8 in its f16 form (bias 0).  Returns 0 (xq unusable) unless every
 * product is zero or a finite normal number, which keeps each weight times x the same product as
 * the scalar twin's (exactly so for power-of-two e8m0 scales).  xmax, xmin: the largest and the smallest non-zero |xo| of the chunk. */
int mg_avx512_fold_block_scales(const mg_matrix *w, int bias, int64_t r, int64_t c0, int64_t kc, const float *xo,
                                float xmax, float xmin, float *xq) {
    const float b = ldexpf(1.0f, bias);
    for (int64_t j = 0; j * 128 < kc; j++) {
        const float a = fabsf(scale_block128(w, r, c0 + j * 128)) * b;
        if (!(a == 0.0f || (a < INFINITY && xmax * a < 0x1p126f && xmin * a >= 0x1p-126f))) return 0;
    }
    for (int64_t j = 0; j * 128 < kc; j++) { /* the factor is exact: a power-of-two multiple */
        const __m512 s = _mm512_set1_ps(scale_block128(w, r, c0 + j * 128) * b);
        const int64_t e = (j + 1) * 128 < kc ? (j + 1) * 128 : kc;
        for (int64_t i = j * 128; i < e; i += 16) _mm512_store_ps(xq + i, _mm512_mul_ps(_mm512_load_ps(xo + i), s));
    }
    return 1;
}

/* bf16 (unscaled or F32_ROW), R (1..4) rows at once sharing the xp loads, prefetching the same line
 * of a later group of rows (see rows_ahead) into L2; p[j]: row j's columns, nb 64-byte steps.
 * Streamed from memory, one row per pass is faster while x stays in L1 (decode_avx512.c picks R;
 * the rows are then one sequential stream, 4 rows made 4 streams); with wider x (its reloads from
 * L2) four rows are.  One row prefetching into L1 instead was within a few percent on Zen 5 and
 * 30-40 % slower on an Intel Sapphire Rapids-class core at 4096 columns (docs/KERNELS.md).  Each
 * row's sums are the same either way. */
INLINE void rows_bf16(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a0[4], a1[4];
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 32) {
        const __m512 x0 = _mm512_load_ps(xp), x1 = _mm512_load_ps(xp + 16);
        for (int j = 0; j < R; j++) {
            _mm_prefetch((const char *)p[j] + 64 * i + ahead, MG_AVX512_PREFETCH_HINT);
            const __m512i w = _mm512_loadu_si512(p[j] + 64 * i);
            a0[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), x0, a0[j]);
            a1[j] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi)), x1, a1[j]);
        }
    }
    for (int j = 0; j < R; j++) out[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0[j], a1[j]));
}

/* bf16 rows [r, r + n) (n in 1..4), like fp4_rows. */
int64_t mg_avx512_bf16_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xs,
                            float *y) {
    const uint8_t *p[4];
    float part[4];
    if (n < 1 || n > 4) __builtin_unreachable(); /* n is 1..4; said so, -O3 stops warning part may be read unwritten */
    row_ptrs(w, r, n, (size_t)c0 * 2, p);
    MG_ROWS_CALL(n, mg_matrix_row_bytes(w), part, rows_bf16, p, xs, kc / 32);
    store_row_parts(w, r, n, c0, part, y);
    return n;
}

MG_FP4_ROWS_FN(fp4_rows, rows_fp4, float)

int64_t mg_avx512_fp4_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xp,
                           float *y, float (*sfr)[XP_COLS / 32]) {
    return fp4_rows(w, r, n, c0, kc, xp, y, sfr);
}

/* fp8 rows [r, r + n) (n in 1..4, inside one 128-row scale block) against xq folded for that
 * block (fold_block_scales; f16: rows_fp8_folded's vcvtph2ps form); adds to y (c0 > 0) or writes
 * it.  Returns n. */
int64_t mg_avx512_fp8_folded_rows(const mg_matrix *w, int f16, int64_t r, int64_t n, int64_t c0, int64_t kc,
                                  const float *xq, float *y) {
    const uint8_t *p[4];
    float part[4];
    if (n < 1 || n > 4) __builtin_unreachable(); /* n is 1..4; said so, -O3 stops warning part may be read unwritten */
    row_ptrs(w, r, n, (size_t)c0, p);
    if (f16) MG_ROWS_CALL(n, mg_matrix_row_bytes(w), part, rows_fp8_folded, 1, p, xq, kc / 64);
    else MG_ROWS_CALL(n, mg_matrix_row_bytes(w), part, rows_fp8_folded, 0, p, xq, kc / 64);
    store_row_parts(w, r, n, c0, part, y); /* block-128 scaled: no F32_ROW scale */
    return n;
}
#endif
