/* AVX-512 (F, BW, VL, DQ) kernels for x86-64.  Compiled with -mavx512f -mavx512bw -mavx512vl
 * -mavx512dq -mfma -mf16c; selected at run time only on CPUs that have these features and whose
 * OS saves ZMM state (c/core/cpu.c).
 *
 * Only decode (n_tok == 1) differs from the AVX2 table.  It streams weights from memory, but
 * measured on a Xeon the decoding work still shows in the achieved bandwidth (fewer instructions
 * per weight byte gave a higher fraction of the read bandwidth even where the decoder alone ran
 * faster than memory), so the 512-bit decoders below use as few instructions per cache line as
 * we found.  Every other entry (prefill, vector ops) and every decode case outside the fast paths
 * forwards to the AVX2 table, which the same CPU runs.
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
 *         x would overflow that go to the AVX2 table.
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
 * scales, fp4 and bf16 run four (rows_fp8_folded, rows_fp4, rows_bf16); a lone last unscaled fp8
 * row, or fp8 blocks whose scales could not be folded, take the one-row loops.
 */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx512_rows.h"

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

/* The exact values of the 16 e2m1 codes. */
INLINE __m512 fp4_table(void) {
    return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
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
 * of rows (ahead = 2 row strides) instead of a fixed distance: with two rows in flight a fixed
 * 2 KiB ran at 0.71 of read bandwidth and 1 KiB at 0.67, 4 KiB 0.75, the next pair's line
 * (8 KiB for 4096-column rows) 0.87-0.89, above the one-row loop's 0.79 (Xeon, 4096 columns). */
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

/* fp8 with folded block scales, R (1..4) rows at once, decoded without vcvtph2ps: on Zen 4 the
 * four conversions per line bounded the former loop (row2_fp8 on this data: 20 GB/s per core from
 * L2; with the conversions replaced by shifts, 32).  In each 16-bit lane, an arithmetic shift by 4
 * and the mask 0x87F0 turn a byte s.eeee.mmm into s << 15 | eeeemmm << 4: the upper half of an
 * fp32 whose value is exactly v * 2^-120 (eeee = 0 lands in the fp32 denormals, still exact).  A
 * 16-bit shift or a mask then widens the lanes as for bf16, and xq carries the 2^120 (see
 * fold_block_scales).  NaN codes are not supported, as in the other fp8 paths. */
INLINE void rows_fp8_folded(const int R, const uint8_t *const *p, const float *xq, int64_t nb, size_t ahead,
                            float *out) {
    const __m512i m = _mm512_set1_epi16((short)0x87F0), hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 a0[4], a1[4];
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xq += 64) {
        const __m512 x0 = _mm512_load_ps(xq), x1 = _mm512_load_ps(xq + 16);
        const __m512 x2 = _mm512_load_ps(xq + 32), x3 = _mm512_load_ps(xq + 48);
        for (int j = 0; j < R; j++) {
            _mm_prefetch((const char *)p[j] + 64 * i + ahead, MG_AVX512_PREFETCH_HINT);
            const __m512i w = _mm512_loadu_si512(p[j] + 64 * i);
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
 * rows.  On an AMD EPYC (Zen 4) four rows ran 30 Gw/s from L2 against 23 for the former two-row
 * loop (four unaligned loads per line, now gone: they split cache lines), and six or eight rows ran
 * slower (register spills).  Prefetch: the same line of the next group of R rows (ahead = R row
 * strides), as for fp8; the former fixed 2 KiB pointed inside the group being read and left the
 * loop waiting on memory (6 GB/s streamed on one core, 14 GB/s with this distance). */
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

INLINE float scale_block128(const mg_matrix *w, int64_t r, int64_t c) {
    const size_t at = (size_t)(r / 128) * (size_t)w->scale_cols + (size_t)(c / 128);
    if (w->scale_kind == MG_SCALE_F32_BLOCK128) { /* memcpy: scales inside a mapped shard may be unaligned */
        float s;
        memcpy(&s, (const uint8_t *)w->scale + at * 4, 4);
        return s;
    }
    return mg_e8m0_to_f32(((const uint8_t *)w->scale)[at]);
}

/* fp8 with 128x128 block scales: x * 256 in the order rows_fp8_folded reads it (per 64 columns:
 * 4i, 4i + 2, 4i + 1, 4i + 3 for i < 16), built once per call. */
INLINE void permute_x_fp8_folded(const float *x, int64_t kc, float *xo) {
    static const int order[4] = {0, 2, 1, 3};
    for (int64_t g = 0; g < kc; g += 64)
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < 16; i++) xo[g + 16 * q + i] = x[g + 4 * i + order[q]] * 256.0f;
}

/* xq = xo (x * 256, permuted) times 2^112 times the scale of each 128-column block of row r, so
 * that the 128 rows sharing these scales run rows_fp8_folded, which leaves a factor 2^-120 in each
 * weight.  Returns 0 (xq unusable) unless every product is zero or a finite normal number, which
 * keeps each weight times x the same product as the scalar twin's (exactly so for power-of-two
 * e8m0 scales).  xmax, xmin: the largest and the smallest non-zero |xo| of the chunk. */
INLINE int fold_block_scales(const mg_matrix *w, int64_t r, int64_t c0, int64_t kc, const float *xo, float xmax,
                             float xmin, float *xq) {
    for (int64_t j = 0; j * 128 < kc; j++) {
        const float a = fabsf(scale_block128(w, r, c0 + j * 128)) * 0x1p112f;
        if (!(a == 0.0f || (a < INFINITY && xmax * a < 0x1p126f && xmin * a >= 0x1p-126f))) return 0;
    }
    for (int64_t j = 0; j * 128 < kc; j++) { /* the factor is exact: a power-of-two multiple */
        const __m512 s = _mm512_set1_ps(scale_block128(w, r, c0 + j * 128) * 0x1p112f);
        const int64_t e = (j + 1) * 128 < kc ? (j + 1) * 128 : kc;
        for (int64_t i = j * 128; i < e; i += 16) _mm512_store_ps(xq + i, _mm512_mul_ps(_mm512_load_ps(xo + i), s));
    }
    return 1;
}

/* bf16 (unscaled or F32_ROW), R (1..4) rows at once sharing the xp loads, prefetching the same line
 * of a later group of rows (see rows_ahead); p[j]: row j's columns, nb 64-byte steps.  Four rows
 * ran 62 GB/s from L2 on one Zen 4 core against 48 for one row at a time (row_plain), and
 * streamed the DeepSeek-V4 head's shape (4096 columns) ~10% faster. */
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
INLINE int64_t bf16_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xs, float *y) {
    const uint8_t *p[4];
    float part[4];
    row_ptrs(w, r, n, (size_t)c0 * 2, p);
    MG_ROWS_CALL(n, mg_matrix_row_bytes(w), part, rows_bf16, p, xs, kc / 32);
    store_row_parts(w, r, n, c0, part, y);
    return n;
}

MG_FP4_ROWS_FN(fp4_rows, rows_fp4, float)

/* fp8 rows [r, r + n) (n in 1..4, inside one 128-row scale block) against xq folded for that
 * block (fold_block_scales); adds to y (c0 > 0) or writes it.  Returns n. */
INLINE int64_t fp8_folded_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, int64_t kc, const float *xq,
                               float *y) {
    const uint8_t *p[4];
    float part[4];
    row_ptrs(w, r, n, (size_t)c0, p);
    MG_ROWS_CALL(n, mg_matrix_row_bytes(w), part, rows_fp8_folded, p, xq, kc / 64);
    store_row_parts(w, r, n, c0, part, y); /* block-128 scaled: no F32_ROW scale */
    return n;
}

/* Decode of rows [r0, r1); returns 0 (having written nothing) when the AVX2 table must do it. */
INLINE int linear_decode(const mg_matrix *w, mg_format f, const float *x, float *y, int64_t r0, int64_t r1) {
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
        if (f == MG_FP8_E4M3 && block128_scaled(w)) { /* xp in the folded loop's order */
            permute_x_fp8_folded(x + c0, kc, xp);
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
            if (f == MG_BF16) { /* up to four rows per pass, see rows_bf16 */
                r += bf16_rows(w, r, r1 - r < 4 ? r1 - r : 4, c0, kc, xs, y) - 1;
                continue;
            }
            if (f == MG_FP4_E2M1) { /* up to four rows per pass, see rows_fp4 */
                r += fp4_rows(w, r, r1 - r < 4 ? r1 - r : 4, c0, kc, xs, y, sfr) - 1;
                continue;
            }
            if (f == MG_FP8_E4M3 && block128_scaled(w)) {
                if (r / 128 != sf_rows) { /* one scale row serves 128 weight rows */
                    sf_rows = r / 128;
                    folded = fold_block_scales(w, r, c0, kc, xp, xmax, xmin, xq);
                    if (!folded) { /* xq: x * 256 in the f16-decoding order of row_fp8_block128 */
                        permute_x(f, x + c0, kc, xq);
                        for (int64_t j = 0; j * 128 < kc; j++) sf[j] = scale_block128(w, r, c0 + j * 128);
                    }
                }
                if (folded) { /* up to four rows of this scale block per pass */
                    int64_t n = r1 - r < 4 ? r1 - r : 4;
                    if (n > 128 - r % 128) n = 128 - r % 128;
                    r += fp8_folded_rows(w, r, n, c0, kc, xq, y) - 1;
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

#define LINEAR_FN(NAME, FMT)                                                               \
    static void NAME(const mg_matrix *w, const float *x, int64_t x_stride, int64_t n_tok, float *y,   \
                     int64_t y_stride, int64_t r0, int64_t r1) {                                 \
        if (n_tok == 1 && linear_decode(w, FMT, x, y, r0, r1)) return;                    \
        mg_kernels_avx512()->parent->linear[FMT](w, x, x_stride, n_tok, y, y_stride, r0, r1);    \
    }
LINEAR_FN(linear_f32, MG_F32)
LINEAR_FN(linear_bf16, MG_BF16)
LINEAR_FN(linear_f16, MG_F16)
LINEAR_FN(linear_fp8, MG_FP8_E4M3)
LINEAR_FN(linear_fp4, MG_FP4_E2M1)

/* The bandwidth yardstick with the same 64-byte loads the decode kernels use. */
static float read_sum_avx512(const float *p, int64_t n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    if (i < n) a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps((__mmask16)((1u << (n - i)) - 1u), p + i));
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* The vector ops stay the parent's (avx2): they are not bandwidth bound at these sizes. */
int mg_kernels_override_avx512(mg_kernels *k) {
    k->linear[MG_F32] = linear_f32;
    k->linear[MG_BF16] = linear_bf16;
    k->linear[MG_F16] = linear_f16;
    k->linear[MG_FP8_E4M3] = linear_fp8;
    k->linear[MG_FP4_E2M1] = linear_fp4;
    k->read_sum = read_sum_avx512;
    return 1;
}
#else
int mg_kernels_override_avx512(mg_kernels *k) { return 0; }
#endif
