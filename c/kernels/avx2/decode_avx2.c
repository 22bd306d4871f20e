/* AVX2 decode (n_tok == 1), one row at a time: the loop every matrix can take.  Each weight row
 * is streamed once: a block of raw codes is widened to fp32 raw values (avx2.h), dotted with x,
 * and the block's partial sum is multiplied by its scale.  bf16, fp8 and fp4 matrices of whole
 * 32- / 64-column steps take the multi-row loops of decode_rows_avx2.c first. */
#include <math.h>
#include <string.h>
#include "kernels/tables.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "kernels/avx2/avx2.h"

/* ---- raw decoders: one step of fmt_step(f) values starting at p ------------------------- */

INLINE __m256 dec_bf16x8(const uint8_t *p) {
    __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

INLINE __m256 dec_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

INLINE void dec_fp8x16(const uint8_t *p, __m256 *lo, __m256 *hi) {
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBF80));
    *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* 32 codes (16 bytes) to exact values in column order. */
INLINE void dec_fp4x32(const uint8_t *p, __m256 v[4]) {
    const __m128i lut = fp4_f16_lut(), m4 = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(b, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    __m128i i0 = _mm_unpacklo_epi8(lo, hi); /* high bytes of values 0..15 in column order */
    __m128i i1 = _mm_unpackhi_epi8(lo, hi); /* values 16..31 */
    v[0] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, i0));
    v[1] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, i0));
    v[2] = _mm256_cvtph_ps(_mm_unpacklo_epi8(zero, i1));
    v[3] = _mm256_cvtph_ps(_mm_unpackhi_epi8(zero, i1));
}

/* Decode one step at p into n_vec = fmt_step/8 vectors. */
INLINE void dec_step(mg_format f, const uint8_t *p, __m256 v[4]) {
    switch (f) {
    case MG_F32: v[0] = _mm256_loadu_ps((const float *)p); break;
    case MG_BF16: v[0] = dec_bf16x8(p); break;
    case MG_F16: v[0] = dec_f16x8(p); break;
    case MG_FP8_E4M3: dec_fp8x16(p, &v[0], &v[1]); break;
    default: dec_fp4x32(p, v); break;
    }
}

/* Tail step: the last n (< step) values of a block, from zero-padded copies. */
INLINE void dec_step_tail(mg_format f, const uint8_t *p, int64_t n, __m256 v[4]) {
    uint8_t buf[128] __attribute__((aligned(32)));
    copy_tail(f, p, n, buf, sizeof buf);
    dec_step(f, buf, v);
}

/* Sum over columns [c, c + n) of raw(w) * x, as a vector of partial sums. */
INLINE __m256 block_dot(mg_format f, const uint8_t *row, int64_t c, int64_t n, const float *x) {
    const int64_t step = fmt_step(f), nv = step / 8;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    const int64_t end = c + n;
    __m256 v[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    if (nv == 1) {
        for (; c + 32 <= end; c += 32) {
            dec_step(f, row + col_bytes(f, c), v);
            a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c), a0);
            dec_step(f, row + col_bytes(f, c + 8), v);
            a1 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 8), a1);
            dec_step(f, row + col_bytes(f, c + 16), v);
            a2 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 16), a2);
            dec_step(f, row + col_bytes(f, c + 24), v);
            a3 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c + 24), a3);
        }
    }
    for (; c + step <= end; c += step) {
        dec_step(f, row + col_bytes(f, c), v);
        a0 = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x + c), a0);
        if (nv > 1) a1 = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + c + 8), a1);
        if (nv > 2) {
            a2 = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + c + 24), a3);
        }
    }
    if (c < end) {
        const int64_t rem = end - c;
        dec_step_tail(f, row + col_bytes(f, c), rem, v);
        for (int64_t j = 0; j < nv && j * 8 < rem; j++) {
            __m256 xv = load_partial(x + c + j * 8, rem - j * 8);
            a0 = _mm256_fmadd_ps(v[j], xv, a0);
        }
    }
    return _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
}

/* acc += part * scale * factor, keeping the product exact-ish even when scale*factor overflows. */
INLINE __m256 apply_scale(__m256 acc, __m256 part, float s, float factor) {
    float sf = s * factor;
    if (__builtin_expect(isfinite(sf) || !isfinite(s), 1))
        return _mm256_fmadd_ps(part, _mm256_set1_ps(sf), acc);
    return _mm256_fmadd_ps(_mm256_mul_ps(part, _mm256_set1_ps(factor)), _mm256_set1_ps(s), acc);
}

/* Software prefetch distance for streamed weights.  The hardware streamer does not cross 4 KiB
 * pages, and a weight row is often exactly one or two pages, so without this each row starts
 * with a burst of demand misses. */
#ifndef MG_PREFETCH_BYTES
#define MG_PREFETCH_BYTES 2048
#endif
#define PREFETCH(p) _mm_prefetch((const char *)(p) + MG_PREFETCH_BYTES, _MM_HINT_T0)

/* One 32-column step against permuted x: two partial-sum vectors. */
INLINE void step32_fp8(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i m = _mm256_set1_epi16((short)0xBF80);
    PREFETCH(p);
    __m256i w = _mm256_loadu_si256((const __m256i *)p);
    /* Each 16-bit lane holds an odd column's byte (high) and an even column's (low); shifting the
     * byte to the top and arithmetic-shifting by one gives the f16 layout of v * 2^-8. */
    __m256i odd = _mm256_and_si256(_mm256_srai_epi16(w, 1), m);
    __m256i even = _mm256_and_si256(_mm256_srai_epi16(_mm256_slli_epi16(w, 8), 1), m);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(even)), _mm256_load_ps(xp), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(even, 1)), _mm256_load_ps(xp + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(odd)), _mm256_load_ps(xp + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(odd, 1)), _mm256_load_ps(xp + 24), *a1);
}

INLINE void step32_bf16(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    PREFETCH(p);
    __m256i w0 = _mm256_loadu_si256((const __m256i *)p), w1 = _mm256_loadu_si256((const __m256i *)(p + 32));
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), _mm256_load_ps(xp), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), _mm256_load_ps(xp + 8), *a1);
    *a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hi)), _mm256_load_ps(xp + 16), *a0);
    *a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hi)), _mm256_load_ps(xp + 24), *a1);
}

/* 64 fp4 columns (two groups of 32, one per 128-bit lane) against permuted x.  Each code becomes
 * the bf16 encoding of its exact value from two vpshufb tables (high and low byte; e2m1 values
 * are all normal or zero in bf16), bytes are paired into 16-bit lanes, and a 16-bit shift or
 * mask turns each pair of lanes into fp32: no conversion instructions at all.  Element i < 4 of
 * each product belongs to the first group, 4 + i to the second. */
INLINE void step64_fp4(const uint8_t *p, const float *xp, __m256 *a0, __m256 *a1) {
    const __m256i hi_tab = fp4_bf16_hi_table(), lo_tab = fp4_bf16_lo_table();
    const __m256i m4 = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi32((int)0xFFFF0000u);
    PREFETCH(p);
    __m256i b = _mm256_loadu_si256((const __m256i *)p);
    __m256i lo = _mm256_and_si256(b, m4), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m4);
    __m256i ll = _mm256_shuffle_epi8(lo_tab, lo), lh = _mm256_shuffle_epi8(hi_tab, lo);
    __m256i hl = _mm256_shuffle_epi8(lo_tab, hi), hh = _mm256_shuffle_epi8(hi_tab, hi);
    __m256i e0 = _mm256_unpacklo_epi8(ll, lh), e1 = _mm256_unpackhi_epi8(ll, lh); /* even columns */
    __m256i o0 = _mm256_unpacklo_epi8(hl, hh), o1 = _mm256_unpackhi_epi8(hl, hh); /* odd columns */
#define FP4_FMA(acc, words, k)                                                                              \
    *acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(words, 16)), _mm256_load_ps(xp + 16 * k), *acc); \
    *acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(words, top)), _mm256_load_ps(xp + 16 * k + 8), *acc);
    FP4_FMA(a0, e0, 0)
    FP4_FMA(a1, e1, 1)
    FP4_FMA(a0, o0, 2)
    FP4_FMA(a1, o1, 3)
#undef FP4_FMA
}

INLINE void step32(mg_format f, const uint8_t *row, int64_t c, const float *xp, __m256 *a0, __m256 *a1) {
    if (f == MG_FP8_E4M3) step32_fp8(row + c, xp, a0, a1);
    else step32_bf16(row + (size_t)c * 2, xp, a0, a1);
}

/* Row r over columns [c0, c0 + kc) (c0 a multiple of XP_COLS), xp holding x permuted. */
INLINE float row_dot_chunk(const mg_matrix *w, mg_format f, int64_t r, int64_t c0, int64_t kc, const float *xp,
                           const float *x) {
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * mg_matrix_row_bytes(w);
    const int64_t bc = block_cols(w->scale_kind);
    float sf[XP_COLS / 32];
    const int split = row_scales(w, f, r, c0, kc, bc, sf);
    const float factor = raw_factor(f);
    const int permuted = f == MG_FP8_E4M3 || f == MG_BF16 || f == MG_FP4_E2M1;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t bi = 0;
    if (f == MG_FP4_E2M1 && w->scale_kind == MG_SCALE_E8M0_G32) {
        /* Two groups per step: their scales go to the two 128-bit lanes. */
        int64_t c = c0;
        for (; c + 64 <= c0 + kc; c += 64, bi += 2) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            step64_fp4(row + c / 2, xp + (c - c0), &a0, &a1);
            const __m256 s2 = _mm256_set_m128(_mm_broadcast_ss(sf + bi + 1), _mm_broadcast_ss(sf + bi));
            if (bi & 2) acc1 = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), s2, acc1);
            else acc0 = _mm256_fmadd_ps(_mm256_add_ps(a0, a1), s2, acc0);
        }
        for (; c < c0 + kc; c += 32, bi++) {
            const int64_t n = c0 + kc - c < 32 ? c0 + kc - c : 32;
            acc0 = _mm256_fmadd_ps(block_dot(f, row, c, n, x), _mm256_broadcast_ss(sf + bi), acc0);
        }
        return hsum8(_mm256_add_ps(acc0, acc1));
    }
    for (int64_t b = c0; b < c0 + kc; b += bc, bi++) {
        const int64_t e = b + bc < c0 + kc ? b + bc : c0 + kc;
        __m256 part;
        int64_t c = b;
        if (f == MG_FP4_E2M1) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (; c + 64 <= e; c += 64) step64_fp4(row + c / 2, xp + (c - c0), &a0, &a1);
            part = _mm256_add_ps(a0, a1);
        } else if (permuted) {
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (; c + 32 <= e; c += 32) step32(f, row, c, xp + (c - c0), &a0, &a1);
            part = _mm256_add_ps(a0, a1);
        } else {
            part = _mm256_setzero_ps();
        }
        if (c < e) part = _mm256_add_ps(part, block_dot(f, row, c, e - c, x));
        if (__builtin_expect(split, 0)) {
            acc0 = apply_scale(acc0, part, scale_at(w, r, b), factor);
        } else if (bi & 1) {
            acc1 = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sf + bi), acc1);
        } else {
            acc0 = _mm256_fmadd_ps(part, _mm256_broadcast_ss(sf + bi), acc0);
        }
    }
    return hsum8(_mm256_add_ps(acc0, acc1));
}

INLINE void linear_decode(const mg_matrix *w, mg_format f, const float *x, float *y, int64_t r0, int64_t r1) {
    float xp[XP_COLS] __attribute__((aligned(32)));
    for (int64_t c0 = 0; c0 < w->cols; c0 += XP_COLS) {
        const int64_t kc = w->cols - c0 < XP_COLS ? w->cols - c0 : XP_COLS;
        if (f == MG_FP8_E4M3 || f == MG_BF16 || f == MG_FP4_E2M1) permute_x(f, x + c0, kc, xp);
        for (int64_t r = r0; r < r1; r++) {
            const float part = row_dot_chunk(w, f, r, c0, kc, xp, x) * row_scale(w, r);
            y[r] = c0 == 0 ? part : y[r] + part;
        }
    }
}

float mg_avx2_row_dot_fp8(const mg_matrix *w, int64_t r, int64_t c0, int64_t kc, const float *xp, const float *x) {
    return row_dot_chunk(w, MG_FP8_E4M3, r, c0, kc, xp, x);
}

#define DECODE_FN(NAME, FMT) \
    void NAME(const mg_matrix *w, const float *x, float *y, int64_t r0, int64_t r1) { linear_decode(w, FMT, x, y, r0, r1); }
DECODE_FN(mg_avx2_decode_f32, MG_F32)
DECODE_FN(mg_avx2_decode_bf16, MG_BF16)
DECODE_FN(mg_avx2_decode_f16, MG_F16)
DECODE_FN(mg_avx2_decode_fp8, MG_FP8_E4M3)
DECODE_FN(mg_avx2_decode_fp4, MG_FP4_E2M1)
#endif
