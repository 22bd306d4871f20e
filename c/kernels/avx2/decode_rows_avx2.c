/* AVX2 decode (n_tok == 1) of bf16, fp8 and fp4 several rows per pass, sharing the x loads.
 *
 * Why: one row at a time (decode_avx2.c), fp8 and fp4 reach only a third of one core's read
 * bandwidth.  These loops take two to four rows per pass, start each step's partial sums afresh
 * where a long FMA chain would bound them, prefetch the same line of a later group of rows
 * (rows_ahead) into L2, which streamed better than into L1, and decode fp8
 * without vcvtph2ps (folded scales, as the AVX-512 table does).  fp4 stays bound by its decoding:
 * per 64 codes four vpshufb, four unpacks and five shifts share the two shuffle pipes with part
 * of the eight FMAs; the alternatives tried (other chain counts, rows per pass and decodings) were
 * no faster.  Needs whole steps (fp8, bf16: 32 columns; fp4: 64), otherwise the call takes the
 * one-row loop.  Measurements: docs/KERNELS.md. */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

/* Prefetch distance of the multi-row loops: the same line of a later group of rows, at least
 * MG_AVX2_MIN_AHEAD bytes on (narrow rows would otherwise prefetch too close, see avx512.h). */
#ifndef MG_AVX2_MIN_AHEAD
#define MG_AVX2_MIN_AHEAD 8192
#endif
#ifndef MG_AVX2_ROWS_HINT
#define MG_AVX2_ROWS_HINT _MM_HINT_T1
#endif
INLINE size_t rows_ahead(size_t group) {
    return group >= MG_AVX2_MIN_AHEAD ? group : (MG_AVX2_MIN_AHEAD + group - 1) / group * group;
}
#define PREFETCH_AHEAD(p, ahead) _mm_prefetch((const char *)(p) + (ahead), MG_AVX2_ROWS_HINT)

/* fp8 in the folded form (any scale kind whose scales can be folded into x; unscaled rows fold
 * a scale of one), decoded without vcvtph2ps: in each 16-bit lane an
 * arithmetic shift by 4 and the mask 0x87F0 turn a byte s.eeee.mmm (moved to the high byte) into
 * s << 15 | eeeemmm << 4, the upper half of an fp32 whose value is exactly v * 2^-120 (eeee = 0
 * lands in the fp32 denormals, still exact); a 32-bit shift or a mask then widens the lanes as for
 * bf16.  xq carries 2^120 and the block scales (fold_scales).  Per 32 columns xq is in the order
 * 4q, 4q + 2, 4q + 1, 4q + 3 (q < 8).  NaN codes are not supported, as in the other fp8 paths. */
/* One 32-column step of one row in that form. */
INLINE void step_fp8_folded(const uint8_t *p, const float *xq, __m256 *a0, __m256 *a1) {
    const __m256i m = _mm256_set1_epi16((short)0x87F0), hi = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i w = _mm256_loadu_si256((const __m256i *)p);
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 4), m);
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(w, 4), m);
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(even, 16)), _mm256_load_ps(xq), *a0);     /* 4q */
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(even, hi)), _mm256_load_ps(xq + 8), *a1);  /* 4q + 2 */
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(odd, 16)), _mm256_load_ps(xq + 16), *a0); /* 4q + 1 */
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(odd, hi)), _mm256_load_ps(xq + 24), *a1);  /* 4q + 3 */
}

/* fp8 in the folded form through vcvtph2ps, for CPUs whose multiplies take a microcode assist on
 * a denormal input (Intel: about 150 cycles each, measured on a Sapphire Rapids core; see
 * mg_cpu_features.denormal_assists).  step_fp8_folded's eeee = 0 codes are fp32 denormals, and
 * real block-scaled fp8 has about one in 2,000-8,000 of them, which cost those CPUs 10-40 % of
 * the loop; here a shift and the mask 0xBF80 make each byte the f16 of v * 2^-8 (its subnormals
 * included) and vcvtph2ps the fp32, always normal.  Each weight times x is the same product as
 * in step_fp8_folded and the scalar twin (xq carries 256 and the scales: fold_scales with bias 0);
 * xq is in permute_x's order ([even | odd] per 32 columns), times 256. */
INLINE void step_fp8_f16(const uint8_t *p, const float *xq, __m256 *a0, __m256 *a1) {
    const __m256i m = _mm256_set1_epi16((short)0xBF80);
    const __m256i w = _mm256_loadu_si256((const __m256i *)p);
    const __m256i odd = _mm256_and_si256(_mm256_srai_epi16(w, 1), m);
    const __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), m);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(even)), _mm256_load_ps(xq), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(even, 1)), _mm256_load_ps(xq + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(odd)), _mm256_load_ps(xq + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1)), _mm256_load_ps(xq + 24), *a1);
}

/* fp8 rows in the folded form, R (1..4) at once, one 64-byte line per row and step: f16 = 0
 * decodes by shifts (step_fp8_folded), 1 through vcvtph2ps (step_fp8_f16); xq in its order. */
#define STEP_FP8(f16, p, xq, a0, a1) ((f16) ? step_fp8_f16(p, xq, a0, a1) : step_fp8_folded(p, xq, a0, a1))
INLINE void rows_fp8(const int R, const int f16, const uint8_t *const *p, const float *xq, int64_t nb, size_t ahead,
                     float *out) {
    __m256 a0[4], a1[4], b0[4], b1[4];
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) a0[j] = a1[j] = b0[j] = b1[j] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, xq += 64) { /* one 64-byte line per row */
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 32 * i, ahead);
            STEP_FP8(f16, p[j] + 32 * i, xq, &a0[j], &a1[j]);
            STEP_FP8(f16, p[j] + 32 * i + 32, xq + 32, &b0[j], &b1[j]);
        }
    }
    if (i < nb) { /* a last half line */
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) STEP_FP8(f16, p[j] + 32 * i, xq, &a0[j], &a1[j]);
    }
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(_mm256_add_ps(_mm256_add_ps(a0[j], a1[j]), _mm256_add_ps(b0[j], b1[j])));
}

/* bf16 (unscaled or F32_ROW), R (1..4) rows at once sharing the xp loads; 64 bytes (32 columns,
 * xp = [even | odd] per 32, see permute_x) per step. */
INLINE void rows_bf16(const int R, const uint8_t *const *p, const float *xp, int64_t nb, size_t ahead, float *out) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 a0[4], a1[4];
    #pragma GCC unroll 4
    for (int j = 0; j < R; j++) a0[j] = a1[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 32) {
        const __m256 x0 = _mm256_load_ps(xp), x1 = _mm256_load_ps(xp + 8);
        const __m256 x2 = _mm256_load_ps(xp + 16), x3 = _mm256_load_ps(xp + 24);
        #pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 64 * i, ahead);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(p[j] + 64 * i));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(p[j] + 64 * i + 32));
            a0[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), x0, a0[j]);
            a1[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), x1, a1[j]);
            a0[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hi)), x2, a0[j]);
            a1[j] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hi)), x3, a1[j]);
        }
    }
    #pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(_mm256_add_ps(a0[j], a1[j]));
}

/* fp4, R (1..4) rows at once: p[j] points at the same columns of row j, s[j] at its group scales
 * as floats (s[0] == NULL: unscaled).  32 bytes (64 columns, two groups: one per 128-bit lane)
 * per step, decoded as in step64_fp4; each step's partial sums start with a multiply, so the
 * steps' chains overlap, and meet the scales [s0 x4, s1 x4] in one FMA. */
INLINE void rows_fp4(const int R, const uint8_t *const *p, const float *xp, int64_t nb, const float *const *s,
                     size_t ahead, float *out) {
    const __m256i hi_tab = fp4_bf16_hi_table(), lo_tab = fp4_bf16_lo_table();
    const __m256i m4 = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i pair = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) acc[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, xp += 64) {
#pragma GCC unroll 4
        for (int j = 0; j < R; j++) {
            PREFETCH_AHEAD(p[j] + 32 * i, ahead); /* twice per line: cheaper than a branch */
            const __m256i b = _mm256_loadu_si256((const __m256i *)(p[j] + 32 * i));
            const __m256i lo = _mm256_and_si256(b, m4), hn = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
            const __m256i ll = _mm256_shuffle_epi8(lo_tab, lo), lh = _mm256_shuffle_epi8(hi_tab, lo);
            const __m256i hl = _mm256_shuffle_epi8(lo_tab, hn), hh = _mm256_shuffle_epi8(hi_tab, hn);
            const __m256i e0 = _mm256_unpacklo_epi8(ll, lh), e1 = _mm256_unpackhi_epi8(ll, lh); /* even columns */
            const __m256i o0 = _mm256_unpacklo_epi8(hl, hh), o1 = _mm256_unpackhi_epi8(hl, hh); /* odd columns */
            __m256 s0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e0, 16)), _mm256_load_ps(xp));
            __m256 s1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(e0, top)), _mm256_load_ps(xp + 8));
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(e1, 16)), _mm256_load_ps(xp + 16), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(e1, top)), _mm256_load_ps(xp + 24), s1);
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(o0, 16)), _mm256_load_ps(xp + 32), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(o0, top)), _mm256_load_ps(xp + 40), s1);
            s0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(o1, 16)), _mm256_load_ps(xp + 48), s0);
            s1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(o1, top)), _mm256_load_ps(xp + 56), s1);
            const __m128 two = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(s[j] + 2 * i)));
            acc[j] = _mm256_fmadd_ps(_mm256_add_ps(s0, s1), _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), pair),
                                     acc[j]);
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < R; j++) out[j] = hsum8(acc[j]);
}

/* Block-128 scale of row r, column c (fp8). */
INLINE float scale_block128(const mg_matrix *w, int64_t r, int64_t c) {
    if (w->scale_kind != MG_SCALE_F32_BLOCK128 && w->scale_kind != MG_SCALE_E8M0_BLOCK128) return 1.0f;
    return scale_at(w, r, c);
}

/* x * 256 in the order step_fp8_folded reads it (per 32 columns: 4q, 4q + 2, 4q + 1, 4q + 3), or
 * step_fp8_f16 (f16: permute_x's [even | odd]). */
INLINE void permute_x_fp8_folded(int f16, const float *x, int64_t kc, float *xo) {
    static const int order[4] = {0, 2, 1, 3};
    if (f16) {
        permute_x(MG_FP8_E4M3, x, kc, xo);
        for (int64_t c = 0; c < kc; c++) xo[c] *= 256.0f;
        return;
    }
    for (int64_t g = 0; g < kc; g += 32)
        for (int k = 0; k < 4; k++)
            for (int q = 0; q < 8; q++) xo[g + 8 * k + q] = x[g + 4 * q + order[k]] * 256.0f;
}

/* xq = xo (x * 256, permuted) times 2^(bias - k) times the scale of each 128-column block of row r
 * (one for unscaled and F32_ROW matrices), so that the rows sharing these scales run
 * step_fp8_folded, which leaves 2^-120 in each weight (bias 112), or step_fp8_f16, which leaves
 * 2^-8 (bias 0); their sums are multiplied by *unfold = 2^k afterwards.  k > 0 only when x *
 * scale is too large for k = 0: with bias 112, unscaled and per-row-scaled fp8 would otherwise
 * need |x| < 64.  Returns 0 (xq unusable) unless every xq is zero or a finite
 * normal number, which keeps each weight times x the same product as the scalar twin's (exactly
 * so for power-of-two scales).  xmax, xmin: the largest and the smallest non-zero |xo|. */
INLINE int fold_scales(const mg_matrix *w, int bias, int64_t r, int64_t c0, int64_t kc, const float *xo, float xmax,
                       float xmin, float *xq, float *unfold) {
    double amax = 0.0, amin = INFINITY;
    for (int64_t j = 0; j * 128 < kc; j++) {
        const double a = fabs((double)scale_block128(w, r, c0 + j * 128));
        if (!(a < INFINITY)) return 0; /* inf or NaN scales: the one-row loop */
        amax = a > amax ? a : amax;
        amin = a > 0.0 && a < amin ? a : amin;
    }
    const double hi = ldexp((double)xmax * amax, bias), lo = ldexp((double)xmin * amin, bias);
    const int k = hi < 0x1p126 ? 0 : ilogb(hi) - 125; /* hi * 2^-k < 2^126 */
    if (xmin < INFINITY && amin < INFINITY && !(ldexp(lo, -k) >= 0x1p-126)) return 0;
    if (!(ldexp(amax, bias - k) < 0x1p128)) return 0; /* the factor itself must be a finite float */
    for (int64_t j = 0; j * 128 < kc; j++) { /* the factor is exact: a power-of-two multiple */
        const __m256 s = _mm256_set1_ps(ldexpf(scale_block128(w, r, c0 + j * 128), bias - k));
        const int64_t e = (j + 1) * 128 < kc ? (j + 1) * 128 : kc;
        for (int64_t i = j * 128; i < e; i += 8) _mm256_store_ps(xq + i, _mm256_mul_ps(_mm256_load_ps(xo + i), s));
    }
    *unfold = ldexpf(1.0f, k);
    return 1;
}

/* Writes (c0 == 0) or adds the R row sums part[] times their row scales to y[r..]. */
INLINE void store_rows(const mg_matrix *w, int64_t r, int64_t n, int64_t c0, const float *part, float unfold,
                       float *y) {
    for (int64_t j = 0; j < n; j++) {
        const float v = part[j] * unfold * row_scale(w, r + j);
        y[r + j] = c0 == 0 ? v : y[r + j] + v;
    }
}

/* Rows [r, r + n) (n in 1..4) of one fast format over columns [c0, c0 + kc) against xs (permuted
 * x; fp8: xq folded for these rows, whose sums are multiplied by unfold; f16: step_fp8_f16's form
 * rather than step_fp8_folded's); sfr: scratch for fp4 group scales.  Returns n. */
INLINE int64_t fast_rows(const mg_matrix *w, mg_format f, int f16, int64_t r, int64_t n, int64_t c0, int64_t kc,
                         const float *xs, float unfold, float *y, float (*sfr)[XP_COLS / 32]) {
    const size_t rb = mg_matrix_row_bytes(w), off = col_bytes(f, c0);
    const uint8_t *p[4];
    const float *s[4] = {NULL, NULL, NULL, NULL};
    float part[4];
    for (int64_t j = 0; j < n; j++) {
        p[j] = (const uint8_t *)w->data + (size_t)(r + j) * rb + off;
        if (f == MG_FP4_E2M1 && w->scale_kind == MG_SCALE_E8M0_G32) {
            row_scales(w, f, r + j, c0, kc, 32, sfr[j]); /* e8m0 times 1: never overflows */
            s[j] = sfr[j];
        } else if (f == MG_FP4_E2M1) {
            s[j] = sfr[4]; /* ones (linear_decode_fast) */
        }
    }
    const size_t ahead = rows_ahead((size_t)n * rb);
    /* constant R: the row loops unroll */
#define FAST_ROWS(R)                                                                   \
    if (f == MG_FP4_E2M1) rows_fp4(R, p, xs, kc / 64, s, ahead, part);                 \
    else if (f == MG_BF16) rows_bf16(R, p, xs, kc / 32, ahead, part);                  \
    else if (f16) rows_fp8(R, 1, p, xs, kc / 32, ahead, part);                     \
    else rows_fp8(R, 0, p, xs, kc / 32, ahead, part);
    switch (n) {
    case 4: FAST_ROWS(4) break;
    case 3: FAST_ROWS(3) break;
    case 2: FAST_ROWS(2) break;
    default: FAST_ROWS(1) break;
    }
#undef FAST_ROWS
    store_rows(w, r, n, c0, part, unfold, y);
    return n;
}

/* Rows per pass: the best measured on Zen 4 (docs/KERNELS.md). */
#ifndef MG_AVX2_GROUP_BF16
#define MG_AVX2_GROUP_BF16 4
#endif
#ifndef MG_AVX2_GROUP_Q
#define MG_AVX2_GROUP_Q 2
#endif
INLINE int64_t group_rows(mg_format f) { return f == MG_BF16 ? MG_AVX2_GROUP_BF16 : MG_AVX2_GROUP_Q; }

/* Whether the multi-row loops take this matrix (x is checked separately for fp8). */
INLINE int fast_decode(const mg_matrix *w, mg_format f) {
    switch (f) {
    case MG_BF16: return w->cols % 32 == 0 && (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW);
    case MG_FP8_E4M3: return w->cols % 32 == 0 && w->scale_kind != MG_SCALE_E8M0_G32;
    case MG_FP4_E2M1:
        return w->cols % 64 == 0 && (w->scale_kind == MG_SCALE_NONE || w->scale_kind == MG_SCALE_F32_ROW ||
                                     w->scale_kind == MG_SCALE_E8M0_G32);
    default: return 0;
    }
}

/* Decode through the multi-row loops; returns 0 (having written nothing) when the one-row loop
 * must do it.  fp8 rows whose scales cannot be folded take the one-row loop (row_dot_chunk).
 * f16: fp8 through vcvtph2ps (step_fp8_f16), for CPUs with denormal assists. */
INLINE int linear_decode_fast(const mg_matrix *w, mg_format f, int f16, const float *x, float *y, int64_t r0,
                              int64_t r1) {
    if (!fast_decode(w, f)) return 0;
    if (f == MG_FP8_E4M3) { /* x * 256 must be exact for the whole row before any y is written */
        for (int64_t c = 0; c < w->cols; c++)
            if (!(fabsf(x[c]) < 0x1p119f || isnan(x[c]))) return 0;
    }
    float xp[XP_COLS] __attribute__((aligned(32)));
    float xq[XP_COLS] __attribute__((aligned(32))); /* fp8: xp with scales folded in */
    float sfr[5][XP_COLS / 32]; /* fp4: four rows' group scales, and ones for unscaled rows */
    const int64_t G = group_rows(f);
    for (int64_t i = 0; i < XP_COLS / 32; i++) sfr[4][i] = 1.0f;
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS;
        if (f != MG_FP8_E4M3) {
            permute_x(f, x + c0, kc, xp);
            for (int64_t r = r0; r < r1;) r += fast_rows(w, f, 0, r, r1 - r < G ? r1 - r : G, c0, kc, xp, 1.0f, y, sfr);
            continue;
        }
        permute_x_fp8_folded(f16, x + c0, kc, xp);
        float xmax = 0.0f, xmin = INFINITY;
        for (int64_t c = 0; c < kc; c++) {
            const float a = fabsf(xp[c]);
            xmax = a > xmax ? a : xmax; /* NaN compares false: skipped */
            xmin = a > 0.0f && a < xmin ? a : xmin;
        }
        /* Scale blocks of 128 rows (unscaled and F32_ROW: one fold serves every row). */
        const int blocks = w->scale_kind == MG_SCALE_F32_BLOCK128 || w->scale_kind == MG_SCALE_E8M0_BLOCK128;
        for (int64_t r = r0; r < r1;) {
            const int64_t e = !blocks || (r / 128 + 1) * 128 >= r1 ? r1 : (r / 128 + 1) * 128;
            float unfold;
            if (!fold_scales(w, f16 ? 0 : 112, r, c0, kc, xp, xmax, xmin, xq, &unfold)) {
                permute_x(f, x + c0, kc, xq); /* the one-row loop's order, see row_dot_chunk */
                for (; r < e; r++) { /* e.g. scales too large to fold */
                    const float part = mg_avx2_row_dot_fp8(w, r, c0, kc, xq, x) * row_scale(w, r);
                    y[r] = c0 == 0 ? part : y[r] + part;
                }
                continue;
            }
            while (r < e) r += fast_rows(w, f, f16, r, e - r < G ? e - r : G, c0, kc, xq, unfold, y, sfr);
        }
    }
    return 1;
}

#define DECODE_ROWS_FN(NAME, FMT, F16)                                                       \
    int NAME(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) {          \
        return linear_decode_fast(w, FMT, F16, x, y, r0, r1);                                \
    }
DECODE_ROWS_FN(mg_avx2_decode_rows_bf16, MG_BF16, 0)
DECODE_ROWS_FN(mg_avx2_decode_rows_fp8, MG_FP8_E4M3, 0)
DECODE_ROWS_FN(mg_avx2_decode_rows_fp8_f16, MG_FP8_E4M3, 1)
DECODE_ROWS_FN(mg_avx2_decode_rows_fp4, MG_FP4_E2M1, 0)
#endif
