/* AVX-512 (F, BW, VL, DQ) decode (n_tok == 1) for x86-64.  Compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512dq -mfma -mf16c; selected at run time only on CPUs that have these features
 * and whose OS saves ZMM state (c/core/cpu.c).
 *
 * Only decode differs from the parent (avx2) table.  It streams weights from memory, but the
 * decoding work still shows in the achieved bandwidth (fewer instructions per weight byte gave a
 * higher fraction of the read bandwidth even where the decoder alone ran faster than memory), so
 * the 512-bit decoders use as few instructions per cache line as we found.  Every decode case
 * outside these loops is declined and runs the parent's entry (table_avx512.c).
 *
 * Every fast path consumes exactly 64 weight bytes (one cache line) per step and reads x in a
 * permuted order (xp, built once per call) that matches the lanes the cheapest widening of the
 * format produces, so no shuffles are spent per weight:
 *   f32:  16 columns per step, x as is.
 *   f16:  32 columns, two vcvtph2ps, x as is.
 *   bf16: 32 columns; a 32-bit shift gives the even columns, a mask the odd ones:
 *         xp = [x even | x odd] per 32 columns.
 *   fp8 e4m3: 64 columns; in each 16-bit lane, shift and mask 0xBF80 turn each byte into the f16
 *         encoding of v * 2^-8 (exact, subnormals included; NaN codes are not supported), then
 *         vcvtph2ps.  xp holds x * 256, which makes the products exact values again; calls whose
 *         x would overflow that are declined.
 *   fp4 e2m1: 128 columns; vpermps looks up the exact fp32 value of the low nibble of each
 *         32-bit lane in a 16-entry table; shifts by 4, 8, ..., 28 of the one load bring up the
 *         other nibbles: vector k holds columns 8i + k in lane i, so lanes 4g..4g+3 hold group
 *         g's columns and one scale vector [s0 x4, s1 x4, s2 x4, s3 x4] multiplies the step's
 *         partial sum.
 * Scales: fp8 128x128 block scales are folded into x once per 128 rows (xq = x * 2^120 * scale of
 * its column block), so those rows run a loop without scales that also needs no conversion
 * instruction (rows_fp8_folded: shifts and a mask make the fp32 bits of v * 2^-120); when a
 * product would leave the normal range the block's partial sum is multiplied instead (f16
 * decoding).  fp4 group scales multiply each step's partial sums.  Both are exact powers of two
 * for e8m0, so results equal the scalar twin's up to summation order.  Per-row scales (F32_ROW,
 * any format) multiply each row's unscaled dot product once, as the scalar twin does.
 * Unscaled fp8 runs two rows per pass sharing the xp loads (row2_fp8); fp8 with folded block
 * scales, fp4 and bf16 run four (decode_rows_avx512.c); a lone last unscaled fp8 row, or fp8
 * blocks whose scales could not be folded, take the one-row loops.  Measurements behind these
 * choices: docs/KERNELS.md.
 */
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512/avx512.h"

INLINE int64_t step_cols(mg_format f) {
    switch (f) {
    case MG_F32: return 16;
    case MG_BF16:
    case MG_F16: return 32;
    case MG_FP8_E4M3: return 64;
    default: return 128;
    }
}

/* Whether the fast decode path handles this matrix; the rest goes to the AVX2 table.  A per-row
 * scale (F32_ROW) multiplies the unscaled row's dot product once, so it goes with any format. */
INLINE int fast_decode(const mg_matrix *w, mg_format f) {
    if (w->cols % step_cols(f)) return 0;
    if (w->scale_kind == MG_SCALE_F32_ROW) return 1;
    switch (f) {
    case MG_F32:
    case MG_BF16:
    case MG_F16: return w->scale_kind == MG_SCALE_NONE;
    case MG_FP8_E4M3:
        return w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_BLOCK128 ||
               w->scale_kind == MG_SCALE_E8M0_BLOCK128;
    case MG_FP4_E2M1: return w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_E8M0_G32;
    default: return 0;
    }
}

/* 128x128 block scales (fp8): folded into x or applied per block below. */
INLINE int block128_scaled(const mg_matrix *w) {
    return w->scale_kind == MG_SCALE_F32_BLOCK128 || w->scale_kind == MG_SCALE_E8M0_BLOCK128;
}

/* ---- one 64-byte step per format: accumulates raw(w) . xp into a0, a1 --------------------- */

INLINE void step_f32(const uint8_t *p, const float *xp, __m512 *a0, __m512 *a1) {
    (void)a1;
    *a0 = _mm512_fmadd_ps(_mm512_loadu_ps(p), _mm512_loadu_ps(xp), *a0);
}

INLINE void step_f16(const uint8_t *p, const float *xp, __m512 *a0, __m512 *a1) {
    *a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)), _mm512_loadu_ps(xp), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32))), _mm512_loadu_ps(xp + 16), *a1);
}

INLINE void step_bf16(const uint8_t *p, const float *xp, __m512 *a0, __m512 *a1) {
    const __m512i w = _mm512_loadu_si512(p);
    *a0 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)), _mm512_load_ps(xp), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u))),
                          _mm512_load_ps(xp + 16), *a1);
}

INLINE void step_fp8(const uint8_t *p, const float *xp, __m512 *a0, __m512 *a1) {
    const __m512i m = _mm512_set1_epi16((short)0xBF80);
    const __m512i w = _mm512_loadu_si512(p);
    const __m512i odd = _mm512_and_si512(_mm512_srai_epi16(w, 1), m);
    const __m512i even = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(w, 8), 1), m);
    *a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(even)), _mm512_load_ps(xp), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(even, 1)), _mm512_load_ps(xp + 16), *a1);
    *a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(odd)), _mm512_load_ps(xp + 32), *a0);
    *a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(odd, 1)), _mm512_load_ps(xp + 48), *a1);
}

/* Writes x[0, kc) in the order the format's steps consume it (fp8: times 256, see above). */
INLINE void permute_x(mg_format f, const float *x, int64_t kc, float *xp) {
    if (f == MG_BF16) {
        for (int64_t g = 0; g < kc; g += 32)
            for (int i = 0; i < 16; i++) xp[g + i] = x[g + 2 * i], xp[g + 16 + i] = x[g + 2 * i + 1];
    } else if (f == MG_FP8_E4M3) {
        for (int64_t g = 0; g < kc; g += 64)
            for (int i = 0; i < 16; i++) {
                xp[g + i] = x[g + 2 * i] * 256.0f;
                xp[g + 16 + i] = x[g + 32 + 2 * i] * 256.0f;
                xp[g + 32 + i] = x[g + 2 * i + 1] * 256.0f;
                xp[g + 48 + i] = x[g + 33 + 2 * i] * 256.0f;
            }
    } else if (f == MG_FP4_E2M1) {
        for (int64_t g = 0; g < kc; g += 128)
            for (int k = 0; k < 8; k++)
                for (int i = 0; i < 16; i++) xp[g + 16 * k + i] = x[g + 8 * i + k];
    }
}

/* ---- rows --------------------------------------------------------------------------------- */

/* Unscaled f32 / f16 / bf16 / fp8 row over nb steps. */
INLINE float row_plain(mg_format f, const uint8_t *p, const float *xp, int64_t nb) {
    const int64_t sc = step_cols(f);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, p += 128, xp += 2 * sc) {
        PREFETCH(p);
        PREFETCH(p + 64);
        switch (f) {
        case MG_F32: step_f32(p, xp, &a0, &a1), step_f32(p + 64, xp + sc, &a2, &a3); break;
        case MG_F16: step_f16(p, xp, &a0, &a1), step_f16(p + 64, xp + sc, &a2, &a3); break;
        case MG_BF16: step_bf16(p, xp, &a0, &a1), step_bf16(p + 64, xp + sc, &a2, &a3); break;
        default: step_fp8(p, xp, &a0, &a1), step_fp8(p + 64, xp + sc, &a2, &a3); break;
        }
    }
    if (i < nb) {
        switch (f) {
        case MG_F32: step_f32(p, xp, &a0, &a1); break;
        case MG_F16: step_f16(p, xp, &a0, &a1); break;
        case MG_BF16: step_bf16(p, xp, &a0, &a1); break;
        default: step_fp8(p, xp, &a0, &a1); break;
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* fp8 row with one scale per 128 columns (sf[j] for block j of this chunk). */
INLINE float row_fp8_block128(const uint8_t *p, const float *xp, int64_t nb, const float *sf) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0, j = 0;
    for (; i + 2 <= nb; i += 2, j++, p += 128, xp += 128) {
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        PREFETCH(p);
        PREFETCH(p + 64);
        step_fp8(p, xp, &a0, &a1);
        step_fp8(p + 64, xp + 64, &a2, &a3);
        const __m512 part = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
        if (j & 1) acc1 = _mm512_fmadd_ps(part, _mm512_set1_ps(sf[j]), acc1);
        else acc0 = _mm512_fmadd_ps(part, _mm512_set1_ps(sf[j]), acc0);
    }
    if (i < nb) { /* a last half block of 64 columns */
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        step_fp8(p, xp, &a0, &a1);
        acc0 = _mm512_fmadd_ps(_mm512_add_ps(a0, a1), _mm512_set1_ps(sf[j]), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Two rows at once (pa, pb: the same columns of rows r and r + 1), sharing each xp load between
 * them: x is half of the loads per weight line.  fp8 prefetches the same line of the next pair
 * of rows (ahead = 2 row strides) instead of a fixed distance, which with two rows in flight
 * fell behind the loads (docs/KERNELS.md). */
INLINE void row2_fp8(const uint8_t *pa, const uint8_t *pb, const float *xp, int64_t nb, size_t ahead, float *ya,
                     float *yb) {
    const __m512i m = _mm512_set1_epi16((short)0xBF80);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, pa += 64, pb += 64, xp += 64) {
        _mm_prefetch((const char *)pa + ahead, MG_AVX512_PREFETCH_HINT);
        _mm_prefetch((const char *)pb + ahead, MG_AVX512_PREFETCH_HINT);
        const __m512i wa = _mm512_loadu_si512(pa), wb = _mm512_loadu_si512(pb);
        const __m512i oa = _mm512_and_si512(_mm512_srai_epi16(wa, 1), m);
        const __m512i ea = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(wa, 8), 1), m);
        const __m512i ob = _mm512_and_si512(_mm512_srai_epi16(wb, 1), m);
        const __m512i eb = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(wb, 8), 1), m);
        const __m512 x0 = _mm512_load_ps(xp), x1 = _mm512_load_ps(xp + 16);
        const __m512 x2 = _mm512_load_ps(xp + 32), x3 = _mm512_load_ps(xp + 48);
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(ea)), x0, a0);
        b0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(eb)), x0, b0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(ea, 1)), x1, a1);
        b1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(eb, 1)), x1, b1);
        a0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(oa)), x2, a0);
        b0 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(ob)), x2, b0);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(oa, 1)), x3, a1);
        b1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(ob, 1)), x3, b1);
    }
    *ya = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    *yb = _mm512_reduce_add_ps(_mm512_add_ps(b0, b1));
}

/* Decode of rows [r0, r1); returns 0 (having written nothing) when the parent table's entry must do it. */
INLINE int linear_decode(const mg_matrix *w, mg_format f, int f16, const float *x, float *y, int64_t r0, int64_t r1) {
    if (!fast_decode(w, f)) return 0;
    float xp[XP_COLS] __attribute__((aligned(64)));
    float xq[XP_COLS] __attribute__((aligned(64))); /* fp8: xp with block scales folded in */
    float sf[XP_COLS / 32], sfr[4][XP_COLS / 32]; /* sfr: fp4 group scales of up to four rows */
    const size_t rb = mg_matrix_row_bytes(w);
    const int64_t sc = step_cols(f);
    if (f == MG_FP8_E4M3) { /* x * 256 must be exact for the whole row before any y is written */
        for (int64_t c = 0; c < w->cols; c++)
            if (!(fabsf(x[c]) < 0x1p119f || isnan(x[c]))) return 0;
    }
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS, nb = kc / sc;
        const float *xs = x + c0;
        if (f == MG_FP8_E4M3 && block128_scaled(w) && !f16) { /* xp in the folded loop's order */
            mg_avx512_permute_x_fp8_folded(x + c0, kc, xp);
            xs = xp;
        } else if (f != MG_F32 && f != MG_F16) {
            permute_x(f, x + c0, kc, xp);
            xs = xp;
        }
        const size_t off = (size_t)c0 * rb / (size_t)w->cols;
        int64_t sf_rows = -1; /* the row block whose 128-column scales sf (or xq) holds */
        int folded = 0;
        float xmax = 0.0f, xmin = INFINITY;
        if (f == MG_FP8_E4M3 && block128_scaled(w))
            for (int64_t c = 0; c < kc; c++) {
                const float a = fabsf(xp[c]);
                xmax = a > xmax ? a : xmax; /* NaN compares false: skipped */
                xmin = a > 0.0f && a < xmin ? a : xmin;
            }
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *p = (const uint8_t *)w->data + (size_t)r * rb + off;
            float part;
            if (f == MG_BF16) { /* one row per pass while x stays in L1, else four: see rows_bf16 */
                const int64_t group = kc <= MG_AVX512_BF16_ONE_ROW_COLS ? 1 : 4;
                r += mg_avx512_bf16_rows(w, r, r1 - r < group ? r1 - r : group, c0, kc, xs, y) - 1;
                continue;
            }
            if (f == MG_FP4_E2M1) { /* up to four rows per pass, see rows_fp4 */
                r += mg_avx512_fp4_rows(w, r, r1 - r < 4 ? r1 - r : 4, c0, kc, xs, y, sfr) - 1;
                continue;
            }
            if (f == MG_FP8_E4M3 && block128_scaled(w)) {
                if (r / 128 != sf_rows) { /* one scale row serves 128 weight rows */
                    sf_rows = r / 128;
                    folded = mg_avx512_fold_block_scales(w, f16 ? 0 : 112, r, c0, kc, xp, xmax, xmin, xq);
                    if (!folded) { /* xq: x * 256 in the f16-decoding order of row_fp8_block128 */
                        permute_x(f, x + c0, kc, xq);
                        for (int64_t j = 0; j * 128 < kc; j++) sf[j] = scale_block128(w, r, c0 + j * 128);
                    }
                }
                if (folded) { /* up to four rows of this scale block per pass */
                    int64_t n = r1 - r < 4 ? r1 - r : 4;
                    if (n > 128 - r % 128) n = 128 - r % 128;
                    r += mg_avx512_fp8_folded_rows(w, f16, r, n, c0, kc, xq, y) - 1;
                    continue;
                }
                part = row_fp8_block128(p, xq, nb, sf);
            } else if (f == MG_FP8_E4M3 && r + 1 < r1) { /* unscaled: see row2_fp8 */
                float part1;
                row2_fp8(p, p + rb, xs, nb, rows_ahead(2 * rb), &part, &part1);
                part *= row_scale(w, r);
                part1 *= row_scale(w, r + 1);
                y[r] = c0 == 0 ? part : y[r] + part;
                r++;
                y[r] = c0 == 0 ? part1 : y[r] + part1;
                continue;
            } else {
                part = row_plain(f, p, xs, nb);
            }
            part *= row_scale(w, r);
            y[r] = c0 == 0 ? part : y[r] + part;
        }
    }
    return 1;
}

#define DECODE_FN(NAME, FMT, F16)                                                    \
    int NAME(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) { \
        return linear_decode(w, FMT, F16, x, y, r0, r1);                             \
    }
DECODE_FN(mg_avx512_decode_f32, MG_F32, 0)
DECODE_FN(mg_avx512_decode_bf16, MG_BF16, 0)
DECODE_FN(mg_avx512_decode_f16, MG_F16, 0)
DECODE_FN(mg_avx512_decode_fp8, MG_FP8_E4M3, 0)
DECODE_FN(mg_avx512_decode_fp8_f16, MG_FP8_E4M3, 1)
DECODE_FN(mg_avx512_decode_fp4, MG_FP4_E2M1, 0)
#endif
